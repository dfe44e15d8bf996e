"""``zoo convert``: Hugging Face -> zoo, zoo -> Hugging Face, or zoo -> zoo (another dtype or shard size).

    zoo convert --from-hf hf_gpt2/ --out runs/gpt2            # zoo.from_hf, then zoo.save
    zoo convert --to-hf runs/gpt2 --out hf_out/               # zoo.load, then zoo.to_hf
    zoo convert --from-zoo runs/gpt2 --out runs/gpt2-bf16 --dtype bf16 --max-shard-size 500MB

A ``tokenizer.json`` beside the source checkpoint is carried over to the output. ``--out`` must be another
folder than the source's (symbolic links resolved): written in place, the output's weights would replace
the very files being converted.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from zoo.cli.errors import writing
from zoo.cli.options import add_dtype_option, torch_dtype
from zoo.cli.sanitize import markup
from zoo.io.names import TOKENIZER_NAME


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "convert",
        help="convert a checkpoint: Hugging Face -> zoo, zoo -> Hugging Face, or zoo -> zoo",
        description="Convert a checkpoint between Hugging Face's layout and zoo's own format.",
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--from-hf", metavar="DIR", help="Hugging Face checkpoint directory to import")
    source.add_argument("--to-hf", metavar="DIR", help="zoo checkpoint to export for transformers")
    source.add_argument(
        "--from-zoo", metavar="DIR", help="zoo checkpoint to save again (--dtype, --max-shard-size)"
    )
    parser.add_argument("--out", required=True, metavar="DIR", help="output directory")
    add_dtype_option(parser, default=None, help="cast floating-point weights (default: keep theirs)")
    parser.add_argument(
        "--max-shard-size", metavar="SIZE", help="zoo output: shard above this size, e.g. 500MB (default 2GB)"
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import zoo
    from zoo.cli import console
    from zoo.io.checkpoint import CheckpointError
    from zoo.io.tokenizer import Tokenizer

    dtype = torch_dtype(args.dtype)
    source = Path(args.from_hf or args.to_hf or args.from_zoo).expanduser()
    out = Path(args.out).expanduser()
    if args.to_hf and args.max_shard_size:
        raise CheckpointError("--max-shard-size applies to zoo output (--from-hf, --from-zoo), not --to-hf")
    folder = source if source.is_dir() else source.parent
    if same_folder(folder, out):
        option = "--from-hf" if args.from_hf else "--to-hf" if args.to_hf else "--from-zoo"
        raise ValueError(
            f"--out {out} is the {option} folder {folder}: converting in place would replace the weights "
            "being read; choose another --out"
        )
    tokenizer_file = folder / TOKENIZER_NAME
    tokenizer = (
        Tokenizer.from_file(tokenizer_file) if tokenizer_file.is_file() else None
    )  # fail before the weights

    if args.to_hf:
        from zoo.io.hf import to_hf

        model = zoo.load(source, dtype=dtype)
        with writing(out):
            to_hf(model, out, tokenizer=tokenizer)
        kind = "Hugging Face"
    else:
        if args.from_hf:
            from zoo.io.hf import from_hf

            model = from_hf(source, dtype=dtype)
        else:
            model = zoo.load(source, dtype=dtype)
        with writing(out):
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


def same_folder(source: Path, out: Path) -> bool:
    """Whether ``out`` is ``source``: the same path once symbolic links are resolved, or the same folder
    reached another way (a bind mount, a case-insensitive file system)."""
    if source.resolve() == out.resolve():
        return True
    try:
        return os.path.samefile(source, out)
    except OSError:  # either does not exist (yet): not the same folder
        return False
