"""Where metric records go: ``metrics.jsonl`` (always), ``metrics.csv`` and TensorBoard (by choice).

    log_sinks: [csv, tensorboard]        # in the training config; metrics.jsonl is written regardless
    Trainer(config, sinks=["csv", MySink()])   # or from Python: a name, or any object with write(record)

A sink is anything with ``write(record: dict) -> None`` and, optionally, ``close() -> None``. The trainer
writes each record on rank 0, after every callback has seen it (so keys a callback adds are written too),
and closes its sinks when ``fit`` ends. ``metrics.jsonl`` is the run's own log, not an option: resuming
truncates it, ``--overwrite`` detects a previous run by it, and ``zoo plot training`` reads it.

Each format survives a crash mid-run: a JSONL or CSV row is one ``write`` call followed by a flush (a
killed run leaves whole rows), and a CSV whose header must grow — a record brought a key the file has no
column for — is rewritten through `zoo.io.atomic` (a temporary file renamed over the old one), so the file
on disk is the old table or the new one, never half of each. Resuming truncates both files the same way,
dropping (with a warning naming the file and line) a last row a crash or a full disk cut short. A row that
cannot be written (a full disk) is cut back off the file and raises one `RunWriteError` naming it; the
files are never opened through a symbolic link.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import logging
import os
import shutil
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol

from zoo.io.atomic import write_text_atomic
from zoo.io.names import METRICS_CSV_NAME, METRICS_NAME, TENSORBOARD_DIR
from zoo.training.run.rundir import open_no_link, writing

log = logging.getLogger(__name__)

SINK_NAMES = ("jsonl", "csv", "tensorboard")
TENSORBOARD_HINT = "pip install tensorboard"


class SinkDependencyError(ImportError, ValueError):
    """A sink's package is not installed (a ValueError too, so the CLI shows the message, not a traceback)."""


class MetricSink(Protocol):
    """Receives every record the trainer writes (rank 0 only)."""

    def write(self, record: dict[str, Any]) -> None: ...


class JsonlSink:
    """One JSON object a line; the file is opened per record, so nothing is held open between logs."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def write(self, record: dict[str, Any]) -> None:
        append_row(self.path, json.dumps(record) + "\n")

    def close(self) -> None:
        pass


class CsvSink:
    """A CSV table whose header is the union of every record's keys, in order of first appearance.

    A fresh run (``append=False``) starts the file over at its first record; a resumed one keeps the rows
    already there (`truncate_csv` has dropped those past the checkpoint) and extends their header.
    None is written as an empty cell.
    """

    def __init__(self, path: Path, *, append: bool = False) -> None:
        self.path = Path(path)
        self.append = append
        self.columns: list[str] | None = None  # None until the first write reads or starts the file

    def write(self, record: dict[str, Any]) -> None:
        if self.columns is None:
            # The first record: a resumed run's table is read back (and rewritten once, dropping any row a
            # crash cut short); a fresh run's starts over.
            columns, rows = read_csv(self.path) if self.append and self.path.is_file() else ([], [])
            self.columns = _union(columns, record)
            write_csv(self.path, self.columns, rows)
        elif any(key not in self.columns for key in record):
            _, rows = read_csv(self.path)
            self.columns = _union(self.columns, record)
            write_csv(self.path, self.columns, rows)
        append_row(self.path, _csv_line(self.columns, record))

    def close(self) -> None:
        pass


class TensorBoardSink:
    """Every numeric value of a record as a scalar named by its key, at the record's step.

    A fresh run (``purge_step`` None) empties ``log_dir`` first, so a previous run's curves do not mix in;
    a resumed one tells TensorBoard to hide what the interrupted run wrote from ``purge_step`` on.
    """

    def __init__(self, log_dir: Path, *, purge_step: int | None = None) -> None:
        require_tensorboard()
        self.log_dir = Path(log_dir)
        self._fresh = purge_step is None
        self._purge_step = purge_step
        self._writer: Any = None

    def write(self, record: dict[str, Any]) -> None:
        if self._writer is None:
            from torch.utils.tensorboard import SummaryWriter

            if self._fresh:
                shutil.rmtree(self.log_dir, ignore_errors=True)
                self._fresh = False
            self._writer = SummaryWriter(str(self.log_dir), purge_step=self._purge_step)
            self._purge_step = None  # purged once; a writer reopened after close() just appends
        step = int(record["step"])
        for key, value in record.items():
            if key != "step" and isinstance(value, int | float) and not isinstance(value, bool):
                self._writer.add_scalar(key, value, global_step=step)
        self._writer.flush()  # records are seconds apart: flushing each keeps TensorBoard current

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def require_tensorboard() -> None:
    """Raise `SinkDependencyError` naming the package unless TensorBoard's writer can be imported."""
    try:
        import tensorboard  # noqa: F401  (torch.utils.tensorboard needs it, and says so less plainly)
    except ImportError:
        raise SinkDependencyError(
            f"the tensorboard metric sink needs the tensorboard package, which is not installed: "
            f"{TENSORBOARD_HINT}"
        ) from None


def check_sink_names(names: Iterable[str]) -> None:
    """Fail before any work for an unknown sink name or a missing package."""
    for name in names:
        if name not in SINK_NAMES:
            raise ValueError(f"unknown metric sink {name!r}; built-in sinks are {', '.join(SINK_NAMES)}")
        if name == "tensorboard":
            require_tensorboard()


def open_sink(name: str, output_dir: Path, *, resume_step: int | None) -> MetricSink:
    """A built-in sink writing into ``output_dir``; ``resume_step`` is the step of the checkpoint a run
    resumes from (records up to it stay), None for a fresh run."""
    check_sink_names([name])
    resumed = resume_step is not None
    if name == "jsonl":
        return JsonlSink(output_dir / METRICS_NAME)
    if name == "csv":
        return CsvSink(output_dir / METRICS_CSV_NAME, append=resumed)
    return TensorBoardSink(
        output_dir / TENSORBOARD_DIR, purge_step=resume_step + 1 if resume_step is not None else None
    )


def append_row(path: Path, row: str) -> None:
    """Append one row in one write (a crash leaves whole rows only); a row that fails (a full disk) is cut
    back off, so the file keeps whole rows, and the error names the file. Never through a link."""
    with writing(path):
        fd = open_no_link(path, os.O_WRONLY | os.O_APPEND)
        try:
            start = os.lseek(fd, 0, os.SEEK_END)
            try:
                data = memoryview(row.encode("utf-8"))
                while data:
                    data = data[os.write(fd, data) :]
            except OSError:
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, start)
                raise
        finally:
            os.close(fd)


# --- CSV files ------------------------------------------------------------------------------------------


def read_csv(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    """(header, complete rows). A last line without its newline, or a row with too few cells, was cut
    short by a crash or a full disk and is dropped (the torn last line with a warning)."""
    text = path.read_bytes().decode("utf-8", errors="replace")  # a torn multi-byte tail must not stop it
    whole = text.rfind("\n") + 1
    if text[whole:]:
        log.warning(
            "%s, line %d: an incomplete last row (cut short by a crash or a full disk); dropped",
            path, text.count("\n") + 1,
        )  # fmt: skip
    text = text[:whole]  # up to the last whole line
    rows = list(csv.reader(io.StringIO(text, newline="")))
    if not rows:
        return [], []
    header, body = rows[0], rows[1:]
    return header, [dict(zip(header, row)) for row in body if len(row) == len(header)]


def write_csv(path: Path, columns: Sequence[str], rows: Iterable[dict[str, Any]]) -> None:
    """Write the whole table at once (atomically: the old table or the new one, never half of each)."""
    text = _csv_row(columns) + "".join(_csv_line(columns, row) for row in rows)
    with writing(path):
        write_text_atomic(path, text)


def truncate_csv(path: Path, *, after: int) -> None:
    """Keep the rows up to step ``after`` (and drop a half-written last one)."""
    if not path.is_file():
        return
    columns, rows = read_csv(path)
    if columns:
        write_csv(path, columns, [row for row in rows if _step(row) <= after])


def truncate_records(output_dir: Path, *, after: int) -> None:
    """Drop records past ``after`` from ``metrics.jsonl`` and ``metrics.csv``: on resume they belong to
    steps the run is about to redo. A line a crash or a full disk cut short is dropped with a warning."""
    truncate_csv(output_dir / METRICS_CSV_NAME, after=after)
    path = output_dir / METRICS_NAME
    if not path.is_file():
        return
    text = path.read_bytes().decode("utf-8", errors="replace")  # a torn multi-byte tail must not stop it
    lines = text.split("\n")
    torn = lines.pop()  # after the last newline: "" unless the last record was cut short
    kept = []
    for number, line in enumerate(lines, start=1):
        try:
            record = json.loads(line) if line else None  # NaN losses are records too: not the bounded reader
            if record is not None and record["step"] <= after:
                kept.append(line)
        except (ValueError, KeyError, TypeError, RecursionError):
            log.warning("%s, line %d: not a metric record (%.40r); dropped", path, number, line)
    if torn:
        log.warning(
            "%s, line %d: an incomplete last record (cut short by a crash or a full disk); dropped",
            path, len(lines) + 1,
        )  # fmt: skip
    with writing(path):
        write_text_atomic(path, "".join(f"{line}\n" for line in kept))


def _step(row: dict[str, str]) -> float:
    try:
        return float(row.get("step", ""))
    except ValueError:
        return float("inf")  # a row without a readable step cannot be placed: drop it


def _union(columns: Sequence[str], record: dict[str, Any]) -> list[str]:
    return [*columns, *(key for key in record if key not in columns)]


def _csv_line(columns: Sequence[str], row: dict[str, Any]) -> str:
    return _csv_row("" if row.get(column) is None else row[column] for column in columns)


def _csv_row(cells: Iterable[Any]) -> str:
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerow(cells)
    return buffer.getvalue()
