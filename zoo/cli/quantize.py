"""``zoo quantize``: a model's matrices to int8 (or int4) weight-only, saved as a zoo checkpoint.

    zoo quantize runs/demo --out runs/demo-int8                       # int8, one scale per output row
    zoo quantize runs/gpt --out runs/gpt-int4 --weights int4 --dtype bf16 --group-size 32
    zoo quantize opt-125m --out runs/opt-int8                         # a preset: random initial weights
    zoo quantize hf_opt/ --out runs/opt-int8                          # a Hugging Face folder

The source is what `zoo convert` takes: a zoo checkpoint or training run, a preset name (built with random
initial weights, seed 0), or a Hugging Face folder (``config.json``). ``--dtype`` casts the model before
quantising: the dtype the quantised model computes in (int4's CPU kernel is fast in bf16, slow in fp32).
A ``tokenizer.json`` beside the source is carried over, so `zoo generate` / `zoo translate` run on the
output as on the source. ``--out`` may be missing or empty; a zoo checkpoint (quantised or not), a model of
another kind or a training run there is refused unless ``--overwrite`` (`zoo.io.outputs`). Needs torchao
(``pip install -e '.[quant]'``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from zoo.cli.errors import writing
from zoo.cli.options import add_dtype_option, torch_dtype
from zoo.cli.sanitize import markup
from zoo.io.names import CONFIG_NAME, SPEC_NAME, TOKENIZER_NAME
from zoo.io.outputs import ZOO_CHECKPOINT, check_output_dir
from zoo.io.paths import inside


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "quantize",
        help="quantise a model's matrices to int8 (or int4) weight-only and save it (torchao)",
        description="Quantise the matrices of a model's stacks (and an untied LM head) to int8 or int4, "
        "weight-only, through torchao, and save a zoo checkpoint.",
    )
    parser.add_argument(
        "source", metavar="SRC", help="zoo checkpoint or run, preset name, or Hugging Face folder"
    )
    parser.add_argument("--out", required=True, metavar="DIR", help="output directory (a zoo checkpoint)")
    parser.add_argument(
        "--weights",
        choices=("int8", "int4"),
        default="int8",
        help="int8 (any device) or int4 (CPU kernel); default int8",
    )
    parser.add_argument(
        "--group-size",
        type=int,
        default=None,
        metavar="N",
        help="int4: input features per scale, 32, 64 or 128 (default 32); int8 has one scale per row",
    )
    add_dtype_option(parser, default=None, help="cast the model before quantising (default: keep its dtype)")
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="write into an --out that holds a zoo checkpoint, a model of another kind or a training run "
        "(its model files are replaced, the rest left)",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import torch

    import zoo
    from zoo.cli import console
    from zoo.cli.convert import preset_name, same_folder
    from zoo.io.tokenizer import Tokenizer
    from zoo.quant import quantization_of, quantize

    out = Path(args.out).expanduser()
    preset = preset_name(args.source)
    source = Path(args.source).expanduser()
    if preset is None and same_folder(source if source.is_dir() else source.parent, out):
        raise ValueError(
            f"--out {out} is the source folder: quantising in place would replace the weights being read; "
            "choose another --out"
        )
    if not args.overwrite:  # before anything loads
        check_output_dir(out, ZOO_CHECKPOINT, writer="zoo quantize", overwrite=False, option="--overwrite")
    folder = source if source.is_dir() else source.parent
    tokenizer_file = inside(folder, TOKENIZER_NAME)  # not a link out of the folder (`zoo.io.paths`)
    tokenizer = (
        Tokenizer.from_file(tokenizer_file) if preset is None and tokenizer_file.is_file() else None
    )  # fail before the weights
    dtype = torch_dtype(args.dtype)
    if preset is not None:
        torch.manual_seed(0)  # initial weights, the same every time
        model = zoo.build(preset, dtype=dtype).eval()
        console.print(f"[dim]built preset {markup(preset)} with random initial weights (seed 0)[/]")
    elif _is_hf_folder(source):
        from zoo.io.hf import from_hf

        model = from_hf(source, dtype=dtype)
    else:
        model = zoo.load(source, dtype=dtype)
    quantize(model, args.weights, group_size=args.group_size)
    with writing(out):
        check_output_dir(
            out, ZOO_CHECKPOINT, writer="zoo quantize", overwrite=args.overwrite, option="--overwrite"
        )
        zoo.save(model, out, tokenizer=tokenizer)
    record = quantization_of(model)
    assert record is not None  # quantize records what it did
    size = sum(path.stat().st_size for path in out.glob("model*.safetensors"))
    name = model.spec.name or model.spec.family
    console.print(
        f"wrote [bold]{markup(out)}[/] (zoo): {markup(name)}, {record.describe()}; weights {size / 2**20:,.1f} MiB",
        highlight=False,
    )
    return 0


def _is_hf_folder(path: Path) -> bool:
    """A folder with a Hugging Face ``config.json`` and no zoo ``spec.json`` (as `zoo show` tells them apart)."""
    return path.is_dir() and (path / CONFIG_NAME).is_file() and not (path / SPEC_NAME).is_file()
