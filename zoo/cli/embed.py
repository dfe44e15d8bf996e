"""``zoo embed``: a vector for every line of a text file, written as one ``.npy`` array.

    zoo embed all-MiniLM-L6-v2/ --input sentences.txt --out vectors.npy
    cat sentences.txt | zoo embed runs/encoder/ --input - --out vectors.npy --pooling cls --no-normalize

Row i of the array is line i + 1 of the input (an empty line included: it is embedded as ""), float32, in
the shape (lines, dim). The model's folder decides the pooling, the normalisation and the max length as in
`zoo.embed`; the options override them.

The input is streamed: `CHUNK` lines at a time are read, sorted by length, embedded and appended to a spool
file beside the output, so memory holds one chunk of text and its vectors, never the whole file. The
``.npy`` is written from the spool at the end, atomically (`zoo.io.atomic`): an interrupted run leaves no
half-written array. An existing ``--out`` file is refused unless ``--overwrite``, before the model loads.

Progress goes to stderr: a bar when stderr is a terminal (with the total when the input is a file), else a
line every `LINE_EVERY` texts, for logs. The summary (texts, shape, texts/s) goes to stdout.
"""

from __future__ import annotations

import argparse
import stat
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from zoo.cli.options import add_device_option, positive_int
from zoo.cli.sanitize import clean

STDIN = "-"
CHUNK = 8192  # lines embedded at a time: sorted together, so their batches carry little padding
LINE_EVERY = 10_000  # texts between two progress lines when stderr is not a terminal
_COPY = 2**24  # bytes per step when the spool is copied into the .npy


def register(subparsers: argparse._SubParsersAction) -> None:
    from zoo.embeddings.folder import POOLING_MODES

    parser = subparsers.add_parser(
        "embed",
        help="embed each line of a text file with a model (sentence embeddings) into a .npy array",
        description="One vector per line of --input, written to --out as a float32 .npy array of shape "
        "(lines, dim). A sentence-transformers folder's pooling, normalisation and max length are followed; "
        "other folders get mean pooling.",
    )
    parser.add_argument(
        "model", metavar="MODEL", help="a zoo checkpoint, Hugging Face or sentence-transformers folder"
    )
    parser.add_argument("--input", required=True, metavar="FILE", help="text, one line a text; - for stdin")
    parser.add_argument("--out", required=True, metavar="FILE.npy", help="where the vectors go")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --out file")
    parser.add_argument(
        "--batch-size", type=positive_int, default=32, help="texts per forward pass (default: 32)"
    )
    parser.add_argument(
        "--pooling",
        type=_pooling,
        default=None,
        metavar="MODE[,MODE]",
        help=f"one of {', '.join(POOLING_MODES)}, or several joined by commas (their vectors "
        "concatenated); default: the folder's, else mean",
    )
    parser.add_argument(
        "--normalize",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="unit-length vectors, or not (default: the folder's Normalize module)",
    )
    parser.add_argument(
        "--max-length",
        type=positive_int,
        default=None,
        help="tokens kept per text, special tokens included (default: the folder's max_seq_length, else the "
        "tokenizer's and the model's limit)",
    )
    parser.add_argument("--tokenizer", metavar="PATH", default=None, help="tokenizer.json (default: MODEL's)")
    add_device_option(parser)
    parser.add_argument(
        "--no-progress", action="store_true", help="no progress bar or lines (the summary still prints)"
    )
    parser.set_defaults(run=run_embed)


def run_embed(args: argparse.Namespace) -> int:
    from zoo.cli import console, err_console
    from zoo.embeddings.embedder import Embedder
    from zoo.io.atomic import write_atomic

    out = _check_out(Path(args.out).expanduser(), overwrite=args.overwrite)
    # also: the file is there and readable, before the model loads
    total = _count_lines(Path(args.input)) if args.input != STDIN else None
    embedder = Embedder.load(
        args.model,
        tokenizer=args.tokenizer,
        pooling=args.pooling,
        normalize=args.normalize,
        max_length=args.max_length,
        device=args.device,
    )
    start = time.perf_counter()
    progress = _progress(err_console, total=total, enabled=not args.no_progress)
    rows = 0

    def write(temp: Path) -> None:
        nonlocal rows
        with tempfile.TemporaryFile(dir=temp.parent) as spool, _input(args.input) as stream:
            for chunk in _chunks(stream, what="stdin" if args.input == STDIN else args.input):
                spool.write(embedder(chunk, batch_size=args.batch_size, on_batch=progress.advance).tobytes())
                rows += len(chunk)
            progress.close()
            _write_npy(temp, spool, rows=rows, dim=embedder.dim)

    try:
        write_atomic(out, write)
    finally:
        progress.close()
    seconds = time.perf_counter() - start
    console.out(  # plain text (no markup, no wrapping): the path is the user's, printed as given
        f"{rows:,} texts -> {clean(str(out))} ({rows} × {embedder.dim} float32) in {seconds:.1f} s "
        f"({rows / max(seconds, 1e-9):,.1f} texts/s)",
        highlight=False,
    )
    return 0


# --- input ----------------------------------------------------------------------------------------------------


def _input(name: str) -> Any:
    import contextlib

    if name == STDIN:
        return contextlib.nullcontext(sys.stdin.buffer)
    return open(name, "rb")


def _count_lines(path: Path) -> int | None:
    """The texts in ``path``: its newlines, plus a last line without one (also checks it can be read). None
    for a pipe (a FIFO, ``<(...)``, /dev/stdin): it can be read once only, and the embedding reads it."""
    if path.is_dir():
        raise IsADirectoryError(f"--input {path}: a folder, not a text file")
    if not stat.S_ISREG(path.stat().st_mode):
        return None
    count, last = 0, b"\n"
    with path.open("rb") as file:
        while block := file.read(_COPY):
            count += block.count(b"\n")
            last = block[-1:]
    return count + (last != b"\n")


def _chunks(stream: BinaryIO, *, what: str) -> Iterator[list[str]]:
    """The lines of ``stream``, `CHUNK` at a time, without their line ends; a line that is not UTF-8 is a
    ValueError naming its number."""
    chunk: list[str] = []
    for number, raw in enumerate(stream, start=1):
        try:
            chunk.append(raw.decode("utf-8").rstrip("\r\n"))
        except UnicodeDecodeError as error:
            raise ValueError(
                f"{what} line {number} is not UTF-8 (byte 0x{raw[error.start]:02x} at byte {error.start})"
            ) from None
        if len(chunk) == CHUNK:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


# --- output ---------------------------------------------------------------------------------------------------


def _check_out(out: Path, *, overwrite: bool) -> Path:
    """``--out``: a ``.npy`` path whose folder exists; an existing file only with ``--overwrite``."""
    from zoo.io.outputs import OutputExistsError

    if out.suffix != ".npy":
        raise ValueError(f"--out {out}: expected a .npy file name (the vectors are a numpy array)")
    if out.is_dir():
        raise IsADirectoryError(f"--out {out}: a folder; give the .npy file to write")
    if out.exists() and not overwrite:
        raise OutputExistsError(
            f"{out} already exists ({out.stat().st_size:,} bytes): choose another file, or replace it "
            "(--overwrite)"
        )
    if not out.parent.is_dir():
        raise FileNotFoundError(f"--out {out}: the folder {out.parent} does not exist")
    return out


def _write_npy(path: Path, spool: Any, *, rows: int, dim: int) -> None:
    """``path`` as a .npy of float32 (rows, dim): numpy's header, then the spool's bytes (row-major rows)."""
    import numpy as np

    spool.seek(0)
    with path.open("wb") as file:
        header = {"descr": np.dtype(np.float32).str, "fortran_order": False, "shape": (rows, dim)}
        np.lib.format.write_array_header_1_0(file, header)
        while block := spool.read(_COPY):
            file.write(block)


# --- progress -------------------------------------------------------------------------------------------------


class _Progress:
    """Texts embedded so far: a rich bar on a terminal, else a line every `LINE_EVERY` texts, else nothing."""

    def __init__(self, console: Any, *, total: int | None, bar: bool, lines: bool) -> None:
        self.console, self.total, self.done, self.lines = console, total, 0, lines
        self.start = time.perf_counter()
        self.bar: Any = None
        if bar:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self.bar = Progress(
                TextColumn("embedding"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeRemainingColumn(),
                console=console,
                transient=True,
            )
            self.bar.start()
            self.task = self.bar.add_task("embedding", total=total)

    def advance(self, count: int) -> None:
        before, self.done = self.done, self.done + count
        if self.bar is not None:
            self.bar.update(self.task, completed=self.done)
        elif self.lines and before // LINE_EVERY != self.done // LINE_EVERY:
            of = f"/{self.total:,}" if self.total is not None else ""
            rate = self.done / max(time.perf_counter() - self.start, 1e-9)
            self.console.out(f"embedded {self.done:,}{of} texts ({rate:,.1f} texts/s)", highlight=False)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
            self.bar = None


def _progress(console: Any, *, total: int | None, enabled: bool) -> _Progress:
    terminal = enabled and console.is_terminal
    return _Progress(console, total=total, bar=terminal, lines=enabled and not terminal)


# --- arguments ------------------------------------------------------------------------------------------------


def _pooling(text: str) -> tuple[str, ...]:
    from zoo.embeddings.folder import POOLING_MODES

    modes = tuple(part.strip() for part in text.split(","))
    if not all(mode in POOLING_MODES for mode in modes):
        raise argparse.ArgumentTypeError(
            f"invalid pooling {text!r} (expected one of {', '.join(POOLING_MODES)}, or several joined by commas)"
        )
    return modes
