"""``zoo convert``: Hugging Face -> zoo, zoo -> Hugging Face, or zoo -> zoo (another dtype or shard size).

    zoo convert --from-hf hf_gpt2/ --out runs/gpt2            # zoo.from_hf, then zoo.save
    zoo convert --from-hf Helsinki-NLP/opus-mt-en-de --out runs/opus   # a Hub id: from the HF cache
    zoo convert --to-hf runs/gpt2 --out hf_out/               # zoo.load, then zoo.to_hf
    zoo convert --to-hf runs/demo --out hf_demo/              # a trained run (zoo demo): MarianMTModel
    zoo convert --to-hf transformer-base --out hf_base/       # a preset, built with initial weights
    zoo convert --from-zoo runs/gpt2 --out runs/gpt2-bf16 --dtype bf16 --max-shard-size 500MB
    zoo convert --to-peft runs/finetune-lora --out hf_adapter/  # LoRA adapters in PEFT's format
    zoo convert --to-gguf runs/llama --out llama.gguf --type q8_0   # one file for llama.cpp / Ollama

A ``tokenizer.json`` beside the source checkpoint is carried over to the output (a training run's
``source_tokenizer.json`` is not: a transformers tokenizer folder holds one vocabulary). A zoo source that
is no path but a preset's name is built with random initial weights (seed 0: the same files every time),
which shows the export's layout before any training. ``--to-peft`` takes a LoRA run (its
``adapter.safetensors``) or an adapter file, puts the adapters back on their base (``--base``, else the base
the adapter file names) and writes PEFT's ``adapter_config.json`` + ``adapter_model.safetensors`` for the
transformers model ``--to-hf`` makes of that base. ``--out`` must be another folder than the source's
(symbolic links resolved): written in place, the output's weights would replace the very files being
converted. ``--to-gguf`` writes one GGUF file (``--out FILE.gguf``, ``--type f32|f16|bf16|q8_0``) for a
decoder of a family llama.cpp runs, with the tokenizer beside the checkpoint as its vocabulary
(`zoo.export.export_gguf`, the gguf extra); any other family is refused by name.

``--out`` may be missing or empty, or hold an earlier output of the same kind (a Hugging Face export for
``--to-hf``, PEFT adapters for ``--to-peft``), which is replaced; a zoo checkpoint, a model of another kind
or a training run there is refused unless ``--overwrite`` (`zoo.io.outputs`).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from zoo.cli import kinds
from zoo.cli.errors import writing
from zoo.cli.options import add_dtype_option, torch_dtype
from zoo.cli.sanitize import markup
from zoo.io.names import ADAPTER_NAME, TOKENIZER_NAME
from zoo.io.outputs import HF_CHECKPOINT, PEFT_ADAPTERS, ZOO_CHECKPOINT, check_output_dir
from zoo.io.paths import inside


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "convert",
        help="convert a checkpoint: Hugging Face -> zoo, zoo -> Hugging Face, or zoo -> zoo",
        description="Convert a checkpoint between Hugging Face's layout and zoo's own format.",
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--from-hf",
        metavar="DIR|ID",
        help="Hugging Face checkpoint to import: a folder, or a Hub id (org/name[@revision]) read from the "
        "Hugging Face cache, downloaded unless HF_HUB_OFFLINE=1",
    )
    source.add_argument(
        "--to-hf",
        metavar="DIR|PRESET",
        help="zoo checkpoint or training run (e.g. runs/demo) to export for transformers; a preset name "
        "builds it with random initial weights (seed 0). transformer-* presets export as MarianMTModel",
    )
    source.add_argument(
        "--from-zoo",
        metavar="DIR|PRESET",
        help="zoo checkpoint to save again (--dtype, --max-shard-size); a preset name: initial weights",
    )
    source.add_argument(
        "--to-peft",
        metavar="RUN|FILE",
        help="LoRA adapters (a LoRA training run, or its adapter.safetensors) to export in PEFT's format, "
        "for the transformers model that --to-hf makes of their base",
    )
    source.add_argument(
        "--to-gguf",
        metavar="DIR|PRESET",
        help="zoo checkpoint or training run to write as one GGUF file (--out FILE.gguf) for llama.cpp / "
        "Ollama: llama, mistral, mixtral, qwen2/3 (+ MoE), gemma 1/2/3, phi3 and gpt2 decoders",
    )
    parser.add_argument("--out", required=True, metavar="DIR", help="output directory (--to-gguf: the file)")
    parser.add_argument(
        "--type",
        choices=("f32", "f16", "bf16", "q8_0"),
        default=None,
        help="--to-gguf: how the matrices are stored (default f32; norms and biases stay f32)",
    )
    parser.add_argument(
        "--base",
        metavar="DIR",
        help="--to-peft: the zoo checkpoint the adapters were trained on (default: the one the adapter "
        "file names); also written as base_model_name_or_path",
    )
    add_dtype_option(parser, default=None, help="cast floating-point weights (default: keep theirs)")
    parser.add_argument(
        "--max-shard-size", metavar="SIZE", help="zoo output: shard above this size, e.g. 500MB (default 2GB)"
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="write into an --out that holds a zoo checkpoint, a model of another kind or a training run "
        "(its model files are replaced, the rest left); an earlier export of the same kind is replaced anyway",
    )
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="when no Hugging Face family can express the model, say why for each (default: the closest)",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import zoo
    from zoo.cli import console
    from zoo.io.checkpoint import CheckpointError
    from zoo.io.tokenizer import Tokenizer

    dtype = torch_dtype(args.dtype)
    if args.base and not args.to_peft:
        raise ValueError("--base applies to --to-peft only")
    if args.type and not args.to_gguf:
        raise ValueError("--type applies to --to-gguf only (--dtype casts the weights of the other outputs)")
    if args.to_gguf:
        if args.max_shard_size:
            raise ValueError("--max-shard-size applies to zoo output (--from-hf, --from-zoo), not --to-gguf")
        return _to_gguf(args.to_gguf, Path(args.out).expanduser(), args.type or "f32", dtype, args.overwrite)
    if args.to_peft:
        return _to_peft(
            Path(args.to_peft).expanduser(), Path(args.out).expanduser(), args.base, dtype, args.overwrite
        )
    given = args.from_hf or args.to_hf or args.from_zoo
    out = Path(args.out).expanduser()
    if args.to_hf and args.max_shard_size:
        raise CheckpointError("--max-shard-size applies to zoo output (--from-hf, --from-zoo), not --to-hf")
    preset = None if args.from_hf else preset_name(given)
    if args.from_hf:
        from zoo.io.hf.hub import resolve_checkpoint

        source = resolve_checkpoint(given)  # a Hub id becomes its snapshot folder in the HF cache
    else:
        source = Path(given).expanduser()
    folder = source if source.is_dir() else source.parent
    if preset is None and same_folder(folder, out):
        option = "--from-hf" if args.from_hf else "--to-hf" if args.to_hf else "--from-zoo"
        raise ValueError(
            f"--out {out} is the {option} folder {folder}: converting in place would replace the weights "
            "being read; choose another --out"
        )
    flag = "--to-hf" if args.to_hf else "--from-hf" if args.from_hf else "--from-zoo"
    output = HF_CHECKPOINT if args.to_hf else ZOO_CHECKPOINT
    if not args.overwrite:  # before anything loads (with --overwrite, the writer clears just before writing)
        check_output_dir(out, output, writer=f"zoo convert {flag}", overwrite=False, option="--overwrite")
    tokenizer_file = inside(folder, TOKENIZER_NAME)  # not a link out of the folder (`zoo.io.paths`)
    tokenizer = (
        Tokenizer.from_file(tokenizer_file) if preset is None and tokenizer_file.is_file() else None
    )  # fail before the weights

    if args.from_hf:
        from zoo.io.hf import from_hf

        with kinds.expecting(given, kinds.HF_FOLDER, expected="a Hugging Face checkpoint folder"):
            model = from_hf(source, dtype=dtype)
    elif preset is not None:
        import torch

        torch.manual_seed(0)  # initial weights, the same every time
        model = zoo.build(preset, dtype=dtype).eval()
        console.print(f"[dim]built preset {markup(preset)} with random initial weights (seed 0)[/]")
    else:
        with kinds.expecting(given, kinds.CHECKPOINT, kinds.RUN, expected="a zoo checkpoint"):
            model = zoo.load(source, dtype=dtype)
    if args.to_hf:
        from zoo.io.hf import to_hf

        with writing(out), closest_family(verbose=args.verbose):
            to_hf(model, out, tokenizer=tokenizer, overwrite=args.overwrite)
        kind = "Hugging Face"
    else:
        with writing(out):
            check_output_dir(
                out, output, writer=f"zoo convert {flag}", overwrite=args.overwrite, option="--overwrite"
            )
            zoo.save(model, out, tokenizer=tokenizer, max_shard_size=args.max_shard_size or "2GB")
        kind = "zoo"
    files = sorted(path.name for path in out.iterdir() if not path.name.startswith("."))
    name = model.spec.name or model.spec.family
    console.print(
        f"wrote [bold]{markup(out)}[/] ({kind}): {markup(name)}, {model.num_parameters():,} parameters",
        highlight=False,
    )
    console.print(f"[dim]{markup(', '.join(files))}[/]", highlight=False)
    return 0


def _to_peft(given: Path, out: Path, base: str | None, dtype: Any, overwrite: bool) -> int:
    """``zoo convert --to-peft``: the adapters back on their base, then `zoo.lora.to_peft`."""
    import zoo
    import zoo.lora
    from zoo.cli import console

    if not overwrite:  # before anything loads
        check_output_dir(
            out, PEFT_ADAPTERS, writer="zoo convert --to-peft", overwrite=False, option="--overwrite"
        )
    adapter = inside(given, ADAPTER_NAME) if given.is_dir() else given
    if given.is_dir() and not adapter.is_file():
        raise ValueError(f"--to-peft {given}: no {ADAPTER_NAME} here (is it a LoRA training run?)")
    info = zoo.lora.read_adapter(adapter)
    base = base or info.base_id
    if base is None:
        raise ValueError(f"{adapter} does not name its base: give it with --base DIR")
    if not Path(base).expanduser().exists():
        raise ValueError(f"{adapter}: its base {base} is not here; give the base checkpoint with --base DIR")
    model = zoo.lora.load(zoo.load(Path(base).expanduser(), dtype=dtype), adapter)
    with writing(out):
        zoo.lora.to_peft(model, out, base_model_name_or_path=base, overwrite=overwrite)
    trainable, _ = zoo.lora.trainable_parameters(model)
    console.print(
        f"wrote [bold]{markup(out)}[/] (PEFT adapters, r={info.spec.r}, {trainable:,} parameters) for "
        f"the base {markup(base)}; its transformers model: zoo convert --to-hf {markup(base)} --out DIR",
        highlight=False,
    )
    files = sorted(path.name for path in out.iterdir() if not path.name.startswith("."))
    console.print(f"[dim]{markup(', '.join(files))}[/]", highlight=False)
    return 0


def _to_gguf(given: str, out: Path, kind: str, dtype: Any, overwrite: bool) -> int:
    """``zoo convert --to-gguf``: `zoo.load` (or a preset's initial weights), then `zoo.export.export_gguf`
    with the tokenizer beside the checkpoint."""
    import zoo
    from zoo.cli import console
    from zoo.export.gguf import export_gguf, require_gguf
    from zoo.io.outputs import GGUF_MODEL, check_output_file
    from zoo.io.tokenizer import Tokenizer

    require_gguf()  # before anything loads
    if not overwrite:
        check_output_file(
            out, GGUF_MODEL, writer="zoo convert --to-gguf", overwrite=False, option="--overwrite"
        )
    preset = preset_name(given)
    source = Path(given).expanduser()
    folder = source if source.is_dir() else source.parent
    tokenizer_file = inside(folder, TOKENIZER_NAME)
    tokenizer = Tokenizer.from_file(tokenizer_file) if preset is None and tokenizer_file.is_file() else None
    if preset is not None:
        import torch

        torch.manual_seed(0)  # initial weights, the same every time
        model = zoo.build(preset, dtype=dtype).eval()
        console.print(f"[dim]built preset {markup(preset)} with random initial weights (seed 0)[/]")
    else:
        with kinds.expecting(given, kinds.CHECKPOINT, kinds.RUN, expected="a zoo checkpoint"):
            model = zoo.load(source, dtype=dtype)
    with writing(out):
        written = export_gguf(model, out, tokenizer=tokenizer, type=kind, overwrite=overwrite)  # type: ignore[arg-type]
    vocabulary = (
        "with its tokenizer"
        if written.vocabulary
        else f"no {TOKENIZER_NAME} beside the checkpoint: no vocabulary (llama.cpp cannot tokenize text with it)"
    )
    console.print(
        f"wrote [bold]{markup(out)}[/] (GGUF, llama.cpp architecture {written.arch}, {written.type}, "
        f"{written.tensors} tensors, {written.bytes:,} bytes), {markup(vocabulary)}",
        highlight=False,
    )
    return 0


def preset_name(source: str) -> str | None:
    """``source`` when it names a preset and no file or folder of that name exists, else None."""
    from zoo.spec import list_presets

    return source if source in list_presets() and not Path(source).expanduser().exists() else None


def same_folder(source: Path, out: Path) -> bool:
    """Whether ``out`` is ``source``: the same path once symbolic links are resolved, or the same folder
    reached another way (a bind mount, a case-insensitive file system)."""
    if source.resolve() == out.resolve():
        return True
    try:
        return os.path.samefile(source, out)
    except OSError:  # either does not exist (yet): not the same folder
        return False


@contextmanager
def closest_family(*, verbose: bool) -> Iterator[None]:
    """`zoo.io.hf.NoFamilyError` as one line naming the closest family; ``verbose``: each family's reason
    first, on stderr, closest first."""
    from zoo.io.hf import NoFamilyError

    try:
        yield
    except NoFamilyError as error:
        if not verbose:
            raise ValueError(
                f"{error.summary}; --verbose says why for each of the {len(error.reasons)} families"
            ) from error
        from zoo.cli import err_console

        for family, reason in error.reasons:
            err_console.print(f"  {markup(family)}: {markup(reason)}", highlight=False, soft_wrap=True)
        raise ValueError(error.summary) from error
