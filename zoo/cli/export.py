"""``zoo export``: a model's forward as a torch.export program (``.pt2``) or an ONNX file.

    zoo export runs/demo --out demo.pt2                       # --format from the suffix: torch
    zoo export runs/demo --format onnx --out demo.onnx --check   # and compare it with eager (onnxruntime)
    zoo export gpt2-tiny --out gpt2.pt2 --batch 4 --length 16 --static   # shapes fixed at (4, 16)

SRC is a zoo checkpoint (a folder or its model.safetensors), a spec file (.yaml, .json) or a preset name,
the last two built with random initial weights (seed 0). The graph is traced on a made-up padded batch
(``--batch``, ``--length``, ``--target-length``); batch and lengths stay dynamic unless ``--static``.
``--check`` runs the written file and the eager model on another batch and length and prints the largest
difference per output. What the graph takes and returns: docs/export.md. An existing ``--out`` is replaced
when it is an earlier export of the same format, refused otherwise (a checkpoint's weights, any other
file) unless ``--overwrite`` (`zoo.io.outputs`).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from zoo.cli.errors import writing
from zoo.cli.options import add_device_option, add_dtype_option, torch_dtype
from zoo.cli.sanitize import markup
from zoo.io.outputs import ONNX_MODEL, TORCH_PROGRAM, check_output_file

if TYPE_CHECKING:
    import torch

    from zoo.models.base import ZooModel

FORMATS = {".pt2": "torch", ".onnx": "onnx"}
SUFFIXES = {kind: suffix for suffix, kind in FORMATS.items()}
SPEC_SUFFIXES = (".yaml", ".yml", ".json")


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid value {text!r} (expected an int >= 1)") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"invalid value {text} (expected an int >= 1)")
    return value


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "export",
        help="export a model's forward for torch.export (.pt2) or ONNX (.onnx), dynamic batch and lengths",
        description="Export a model's forward as a torch.export program (.pt2) or an ONNX file.",
    )
    parser.add_argument(
        "source",
        metavar="SRC",
        help="a zoo checkpoint (folder or model.safetensors), a spec file or a preset name (the last two: "
        "random initial weights, seed 0)",
    )
    parser.add_argument("--out", required=True, metavar="FILE", help="the file to write (.pt2 or .onnx)")
    parser.add_argument(
        "--format", choices=("torch", "onnx"), default=None, help="default: from --out's suffix"
    )
    example = parser.add_argument_group("the example batch the graph is traced on")
    example.add_argument("--batch", type=_positive, default=2, metavar="N", help="rows (default 2)")
    example.add_argument(
        "--length", type=_positive, default=8, metavar="N", help="(source) length (default 8)"
    )
    example.add_argument(
        "--target-length", type=_positive, default=None, metavar="N", help="encoder-decoder: target length"
    )
    parser.add_argument(
        "--static", action="store_true", help="fix batch and lengths at the example's (default: dynamic)"
    )
    parser.add_argument("--opset", type=_positive, default=None, help="ONNX opset (default: torch.onnx's)")
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an existing --out that is not an earlier export of the same format",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="run the written file on another batch and length and compare it with eager",
    )
    add_dtype_option(parser, default=None, help="cast floating-point weights first (default: keep theirs)")
    add_device_option(parser, default="cpu", default_help="cpu")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from zoo.cli import console
    from zoo.export import ExportError, example_inputs

    out = Path(args.out).expanduser()
    kind = args.format or FORMATS.get(out.suffix.lower())
    if kind is None:
        raise ExportError(f"--out {out}: say --format torch or onnx (or name the file .pt2 or .onnx)")
    if out.is_dir():  # before the model is loaded and traced
        example_file = out / f"model{SUFFIXES[kind]}"
        raise ExportError(f"--out {out} is a folder; give the file to write, e.g. {example_file}")
    file_kind = TORCH_PROGRAM if kind == "torch" else ONNX_MODEL
    if not args.overwrite:  # before the model is loaded and traced
        check_output_file(out, file_kind, writer="zoo export", overwrite=False, option="--overwrite")
    if kind == "onnx":
        from zoo.export import require_onnx
        from zoo.export.onnx import check_opset

        require_onnx()  # before the model is loaded
        check_opset(args.opset)  # an opset torch.onnx cannot write: refused before any work
    model = _load(args.source, device=args.device, dtype=torch_dtype(args.dtype))
    example = example_inputs(model, batch=args.batch, length=args.length, target_length=args.target_length)
    dynamic = not args.static
    with writing(out):
        if kind == "torch":
            outputs = _export_torch(
                model, example, out, dynamic=dynamic, check=args.check, overwrite=args.overwrite
            )
        else:
            outputs = _export_onnx(
                model,
                example,
                out,
                dynamic=dynamic,
                check=args.check,
                opset=args.opset,
                overwrite=args.overwrite,
            )
    name = model.spec.name or model.spec.family
    what = "torch.export program" if kind == "torch" else "ONNX"
    console.print(
        f"wrote [bold]{markup(out)}[/] ({what}, {_size(out)}): {markup(name)}, "
        f"{model.num_parameters():,} parameters",
        highlight=False,
    )
    data = out.with_name(out.name + ".data")
    if kind == "onnx" and data.is_file():
        console.print(f"weights: {markup(data)} ({_size(data)})", highlight=False)
    console.print(f"inputs:  {markup(_inputs(model, example, dynamic=dynamic))}", highlight=False)
    console.print(f"outputs: {markup(', '.join(outputs[0]))}", highlight=False)
    console.print(
        f"dynamic: {markup(_dims(model, example) if dynamic else 'none (--static)')}", highlight=False
    )
    if outputs[1] is not None:
        checked, shape = outputs[1]
        worst = ", ".join(f"{key} {value:.2g}" for key, value in checked.items())
        console.print(f"checked: max |exported - eager| on {shape}: {markup(worst)}", highlight=False)
    return 0


Checked = tuple[dict[str, float], str]  # max difference per output, and the shapes it ran on


def _export_torch(
    model: ZooModel,
    example: dict[str, torch.Tensor],
    out: Path,
    *,
    dynamic: bool,
    check: bool,
    overwrite: bool = False,
) -> tuple[list[str], Checked | None]:
    from zoo.export import compare_program, export_program, load_program, output_names, save_program

    program = save_program(export_program(model, example=example, dynamic=dynamic), out, overwrite=overwrite)
    loaded = load_program(program)  # check what was written, not what is in memory
    checked = None
    if check:
        other, shape = _other_example(model, example, dynamic=dynamic)
        checked = compare_program(model, loaded, other), shape
    return output_names(loaded), checked


def _export_onnx(
    model: ZooModel,
    example: dict[str, torch.Tensor],
    out: Path,
    *,
    dynamic: bool,
    check: bool,
    opset: int | None,
    overwrite: bool = False,
) -> tuple[list[str], Checked | None]:
    from zoo.export import compare_onnx, export_onnx

    info = export_onnx(model, out, example=example, dynamic=dynamic, opset=opset, overwrite=overwrite)
    checked = None
    if check:
        other, shape = _other_example(model, example, dynamic=dynamic)
        checked = compare_onnx(model, info.path, other), shape
    return list(info.output_names), checked


def _other_example(
    model: ZooModel, example: dict[str, torch.Tensor], *, dynamic: bool
) -> tuple[dict[str, torch.Tensor], str]:
    """A batch the export did not see, and its shapes in words: one more row and 3 (target: 2) more
    positions, within max_positions, when dynamic; the example's shapes with other tokens when static."""
    from zoo.export import example_inputs

    batch, length = example["input_ids"].shape
    target = example["decoder_input_ids"].shape[1] if "decoder_input_ids" in example else None
    if dynamic:
        top = model.spec.max_positions
        batch, length = batch + 1, min(length + 3, top)
        target = min(target + 2, top) if target is not None else None
    other = example_inputs(model, batch=batch, length=length, target_length=target, seed=1)
    shape = f"batch {batch}, length {length}" + (f", target length {target}" if target is not None else "")
    return {name: other[name] for name in example}, shape


def _load(source: str, *, device: str, dtype: torch.dtype | None) -> ZooModel:
    import torch

    import zoo
    from zoo.devices import resolve_device
    from zoo.spec import list_presets

    path = Path(source).expanduser()
    if path.exists() and not (path.is_file() and path.suffix.lower() in SPEC_SUFFIXES):
        return zoo.load(path, device=device, dtype=dtype)
    if path.exists() or source in list_presets():
        torch.manual_seed(0)  # initial weights, the same every time
        target = path if path.exists() else source
        return zoo.build(target, device=resolve_device(device), dtype=dtype).eval()
    raise FileNotFoundError(f"{source}: no such checkpoint, spec file or preset (zoo presets lists them)")


def _inputs(model: ZooModel, example: dict[str, torch.Tensor], *, dynamic: bool) -> str:
    from zoo.export import dynamic_shapes

    shapes = dynamic_shapes(model, example)
    parts = []
    for name, tensor in example.items():
        dims = (
            [shapes[name][axis].__name__ for axis in range(tensor.dim())] if dynamic else list(tensor.shape)
        )
        parts.append(f"{name} ({', '.join(str(d) for d in dims)}) {str(tensor.dtype).removeprefix('torch.')}")
    return ", ".join(parts)


def _dims(model: ZooModel, example: dict[str, torch.Tensor]) -> str:
    from zoo.export import dynamic_shapes

    seen: dict[str, str] = {}
    for dims in dynamic_shapes(model, example).values():
        for dim in dims.values():
            low, high = dim.min, dim.max
            top = "" if high is None or high > 2**31 else f"..{high}"
            seen.setdefault(dim.__name__, f"{dim.__name__} {low}{top or '+'}")
    return ", ".join(seen.values())


def _size(path: Path) -> str:
    size = float(path.stat().st_size)
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{size:.1f} GB"
