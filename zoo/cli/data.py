"""``zoo data prepare``: a corpus of any size, tokenized once into memory-mapped shards to train from.

zoo data prepare --task seq2seq --tokenizer tok.json --out prepared/train train.tsv
zoo data prepare --task causal_lm --tokenizer tok.json --out prepared/web --format jsonl --fields text web-*.jsonl
zoo data prepare --task seq2seq --tokenizer en.json --target-tokenizer de.json --out prepared/wmt \\
    --format aligned train.en train.de

A training config then names the folder: ``data: {train: {prepared: prepared/train}}``, with the same
tokenizer (``tokenizer.path``). A second run over the same inputs is a no-op, said so; ``--out`` must be a
new or empty folder, or one this command wrote. A thin layer over `zoo.training.corpus.prepare_corpus`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from zoo.cli.sanitize import markup
from zoo.training.task_settings import TASK_KINDS

# The names of zoo.training.tasks.TASKS (a test keeps them equal), here without importing torch for --help.
TASKS = TASK_KINDS
FORMATS = ("tsv", "aligned", "text", "jsonl", "parquet", "arrow")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("data", help="prepare a training corpus as memory-mapped token shards")
    commands = parser.add_subparsers(dest="data_command", metavar="ACTION", required=True)
    prepare = commands.add_parser(
        "prepare",
        help="tokenize a corpus once into token shards that training memory-maps",
        description="Stream a corpus through a tokenizer (in parallel, in bounded chunks) into a folder of "
        "memory-mapped token arrays and a manifest. Training reads it with data.train: {prepared: DIR}.",
    )
    prepare.add_argument(
        "inputs", nargs="+", type=Path, metavar="INPUT", help="the corpus files (or folders)"
    )
    prepare.add_argument("--task", choices=TASKS, required=True, help="what the data is for (its fields)")
    prepare.add_argument(
        "--tokenizer",
        type=Path,
        required=True,
        help="tokenizer.json (the source side's with --target-tokenizer)",
    )
    prepare.add_argument(
        "--target-tokenizer", type=Path, help="seq2seq with separate vocabularies: the target's"
    )
    prepare.add_argument(
        "--out", type=Path, required=True, help="the folder to write (new, empty, or its own)"
    )
    prepare.add_argument(
        "--format", choices=FORMATS, help="default: as zoo train reads the task's files (tsv / text / jsonl)"
    )
    prepare.add_argument(
        "--fields",
        help="comma-separated: where each of the task's fields comes from (a tsv column index, a JSON key, a "
        "column name), in the task's order, e.g. en,de for seq2seq's source,target",
    )
    prepare.add_argument(
        "--documents",
        choices=("line", "blank_line"),
        default="line",
        help="text: one document a line, or documents separated by blank lines",
    )
    prepare.add_argument(
        "--on-bad-line",
        choices=("error", "skip"),
        default="error",
        help="stop at a bad line, or count and skip it",
    )
    prepare.add_argument(
        "--max-length",
        type=_positive,
        help="cut examples to this many tokens, framing included (default: none)",
    )
    prepare.add_argument("--too-long", choices=("truncate", "skip", "error"), default="truncate")
    prepare.set_defaults(run=run_prepare)


def run_prepare(args: argparse.Namespace) -> int:
    from zoo.cli import console, err_console
    from zoo.training.corpus import prepare_corpus

    fields = [f.strip() for f in args.fields.split(",")] if args.fields else None
    with err_console.status("preparing", spinner="dots") as status:

        def progress(records: int) -> None:
            status.update(f"preparing: {records:,} examples read")

        result = prepare_corpus(
            args.task,
            args.inputs,
            tokenizer=args.tokenizer,
            target_tokenizer=args.target_tokenizer,
            out=args.out,
            format=args.format,
            fields=fields,
            documents=args.documents,
            on_bad_line=args.on_bad_line,
            max_length=args.max_length,
            too_long=args.too_long,
            progress=progress,
        )
    manifest = result.manifest
    sides = ", ".join(
        f"{name} {side.tokens:,} tokens ({side.dtype})"
        if side.kind == "sequence"
        else f"{name} ({side.dtype})"
        for name, side in manifest.sides.items()
    )
    if not result.written:
        console.print(
            f"{markup(result.out)}: already prepared from these inputs ({manifest.num_examples:,} examples; "
            f"{sides}); nothing to do"
        )
        return 0
    counts = manifest.counts
    noted = (
        ("skipped_lines", "bad lines skipped"),
        ("over_max_length", "over --max-length"),
        ("nothing_to_train", "with nothing left to train (skipped)"),
    )
    notes = [f"{counts[key]:,} {what}" for key, what in noted if counts.get(key)]
    console.print(
        f"{manifest.num_examples:,} examples ({sides}) from {len(manifest.sources)} file(s) in "
        f"{result.seconds:.1f} s -> [bold]{markup(result.out)}[/]"
        + (f" [dim]({'; '.join(notes)})[/]" if notes else "")
    )
    return 0


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"invalid length {text!r} (expected an int >= 1)")
    return value
