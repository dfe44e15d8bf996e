"""Streaming readers for training corpora: one `Record` at a time, never a whole file in memory.

    tsv       one example a line, tab-separated columns; ``columns`` picks them by index (default 0, 1, ...)
              and the line must have exactly ``num_columns`` (default: the highest picked index + 1)
    aligned   two or more line-aligned files, one field each (line i of every file is example i)
    text      one document a line, or ``documents="blank_line"``: documents separated by blank lines
              (the document's lines joined by "\\n")
    jsonl     one JSON object a line; ``columns`` names the keys (default: the field names)
    parquet   ``*.parquet`` files or folders of them, read by record batches (pyarrow, the ``data`` extra)
    arrow     Arrow IPC files: a Hugging Face ``datasets`` ``save_to_disk`` folder (``dataset_info.json`` +
              ``data-*.arrow``), or ``*.arrow`` files / folders of them (pyarrow, the ``data`` extra)

A field's value is a string, or a list of strings (token classification's words and tags). Integers, in
JSON and Arrow, become their decimal string (a class label ``1`` reads as ``"1"``), and booleans JSON's
``"true"`` / ``"false"`` (kto's labels); anything else (an object, a list of lists, a float, null) is a bad
line, since guessing how to write it as text would silently change the data. Blank lines (tsv, text, jsonl) are not examples and are passed over; in
aligned files a blank line on either side is a bad line (the pair would be half empty).

A bad line -- not UTF-8, the wrong number of columns, an empty field, unparsable JSON, a line-count
mismatch between aligned files -- raises `DataError` naming ``file:line`` and what is wrong, or, with
``on_bad_line="skip"``, is counted in the `ReadStats` given to `iter_records` and passed over. A missing
file is refused up front, before anything is read.

``Record.origin`` is ``"file:line"``: the 1-based line of the example (its first line for a blank-line
document), or for Arrow and Parquet the 1-based row within the file. It is built only when asked for: a
record holds the path object it shares with every record of its file and one int.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from zoo._extras import install_hint
from zoo.io.jsonfile import read_json
from zoo.io.names import DATASET_DICT_NAME, DATASET_STATE_NAME
from zoo.io.tokenizer.errors import lone_surrogate
from zoo.training.data import DataError

log = logging.getLogger(__name__)

Format = Literal["tsv", "aligned", "text", "jsonl", "parquet", "arrow", "npz", "image_folder"]
FORMATS: tuple[str, ...] = ("tsv", "aligned", "text", "jsonl", "parquet", "arrow", "npz", "image_folder")
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff")
OnBadLine = Literal["error", "skip"]
Value = str | list[str]

PYARROW_HINT = install_hint("data")
ARROW_BATCH_ROWS = 8192  # rows per record batch read from Parquet (Arrow IPC files keep their own batches)


@dataclass(frozen=True, slots=True)
class Record:
    """One example as read: its fields by name and where it came from."""

    path: Path
    line: int  # 1-based line (or row, for Arrow / Parquet) in ``path``
    fields: dict[str, Value]

    @property
    def origin(self) -> str:
        """``"file:line"``, for messages."""
        return f"{self.path}:{self.line}"


@dataclass
class ReadStats:
    """What a read passed over: ``skipped`` bad lines (with ``on_bad_line="skip"``), the first few
    described in ``examples`` as ``"file:line: reason"``."""

    skipped: int = 0
    examples: list[str] = field(default_factory=list)
    keep: int = field(default=5, repr=False)  # how many examples to keep

    def add(self, message: str) -> None:
        self.skipped += 1
        if len(self.examples) < self.keep:
            self.examples.append(message)


@dataclass(frozen=True)
class Source:
    """Where one split's examples come from and how to read them.

    ``fields`` names the record fields; ``columns`` says where each comes from, one per field: a column
    index (tsv), a key (jsonl), a column name (parquet, arrow). For ``aligned`` the fields pair with
    ``paths`` in order; for ``text`` there is one field (default ``"text"``). Lists are accepted where
    tuples are shown and strings where paths are.
    """

    format: Format
    paths: tuple[Path, ...]
    fields: tuple[str, ...] = ("text",)
    columns: tuple[int | str, ...] | None = None
    num_columns: int | None = None  # tsv: the exact column count of a line (default: highest index + 1)
    documents: Literal["line", "blank_line"] = "line"  # text: one document a line, or blank-line separated
    on_bad_line: OnBadLine = "error"

    def __post_init__(self) -> None:
        paths = (self.paths,) if isinstance(self.paths, (str, Path)) else self.paths
        object.__setattr__(self, "paths", tuple(Path(p) for p in paths))
        object.__setattr__(
            self, "fields", (self.fields,) if isinstance(self.fields, str) else tuple(self.fields)
        )
        if self.columns is not None:
            object.__setattr__(self, "columns", tuple(self.columns))
        _check_source(self)

    @property
    def resolved_columns(self) -> tuple[int | str, ...]:
        """Where each field comes from, defaults filled in."""
        if self.columns is not None:
            return self.columns
        if self.format == "tsv":
            return tuple(range(len(self.fields)))
        return self.fields


def _check_source(source: Source) -> None:
    if source.format not in FORMATS:
        raise ValueError(f"format {source.format!r} is not one of {', '.join(FORMATS)}")
    if source.on_bad_line not in ("error", "skip"):
        raise ValueError(f"on_bad_line {source.on_bad_line!r} must be 'error' or 'skip'")
    if source.documents not in ("line", "blank_line"):
        raise ValueError(f"documents {source.documents!r} must be 'line' or 'blank_line'")
    if not source.paths:
        raise ValueError(f"a {source.format} source needs at least one path")
    if not source.fields or len(set(source.fields)) != len(source.fields):
        raise ValueError(f"fields {list(source.fields)} must be one or more distinct names")
    columns = source.columns
    if columns is not None and len(columns) != len(source.fields):
        raise ValueError(f"columns {list(columns)} must name one column per field {list(source.fields)}")
    if source.format == "tsv":
        picked = source.resolved_columns
        if not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in picked):
            raise ValueError(f"tsv columns {list(picked)} must be column indices (0, 1, ...)")
        least = max(int(c) for c in picked) + 1
        if source.num_columns is not None and source.num_columns < least:
            raise ValueError(f"num_columns ({source.num_columns}) is fewer than column {least - 1} needs")
    elif source.num_columns is not None:
        raise ValueError("num_columns is for tsv sources")
    if source.format in ("jsonl", "parquet", "arrow") and not all(
        isinstance(c, str) for c in source.resolved_columns
    ):
        raise ValueError(f"{source.format} columns {list(source.resolved_columns)} must be names")
    if source.format == "aligned":
        if len(source.paths) < 2 or len(source.paths) != len(source.fields):
            raise ValueError(
                f"aligned files need two or more paths, one per field: {len(source.paths)} paths for "
                f"fields {list(source.fields)}"
            )
        if source.columns is not None:
            raise ValueError("columns are not used by aligned files (each file is one field)")
    if source.format == "text" and len(source.fields) != 1:
        raise ValueError(f"a text source has one field, not {list(source.fields)}")
    if source.documents != "line" and source.format != "text":
        raise ValueError("documents='blank_line' is for text sources")


# --- entry point -------------------------------------------------------------------------------------------


def iter_records(source: Source, *, stats: ReadStats | None = None) -> Iterator[Record]:
    """Every example of ``source``, streamed in file order; bad lines raise `DataError` or, with
    ``on_bad_line="skip"``, are counted in ``stats`` and passed over."""
    bad = _BadLines(source.on_bad_line, stats if stats is not None else ReadStats())
    files = data_files(source)
    if source.format == "aligned":
        yield from _aligned(files, source.fields, bad)
        return
    read = {
        "tsv": _tsv,
        "text": _text,
        "jsonl": _jsonl,
        "parquet": _parquet,
        "arrow": _arrow,
        "npz": _npz,
        "image_folder": _image_folder,
    }[source.format]
    for path in files:
        yield from read(path, source, bad)


def data_files(source: Source) -> list[Path]:
    """The files ``source`` reads, in order (folders expanded for parquet and arrow); a missing path is a
    `FileNotFoundError` naming it."""
    for path in source.paths:
        if not path.exists():
            raise FileNotFoundError(f"{path}: data file not found")
    if source.format in ("parquet", "arrow"):
        return [file for path in source.paths for file in _table_files(path, source.format)]
    if source.format == "image_folder":  # every file in the label folders, each sorted; hidden ones skipped
        files = []
        for path in source.paths:
            if not path.is_dir():
                raise DataError(
                    f"{path}: not a folder (an image folder holds one subfolder of images per label)"
                )
            for entry in _visible(path):
                files += [f for f in _visible(entry) if f.is_file()] if entry.is_dir() else [entry]
        if not files:
            raise DataError(f"{source.paths[0]}: no images (one subfolder per label, images inside)")
        return files
    for path in source.paths:
        if not path.is_file():
            raise DataError(f"{path}: not a file (a {source.format} source reads files, one or more)")
    return list(source.paths)


def _visible(folder: Path) -> list[Path]:
    return sorted(entry for entry in folder.iterdir() if not entry.name.startswith("."))


# --- bad lines ---------------------------------------------------------------------------------------------


class _BadLines:
    """Raise or count a bad line, as the source's ``on_bad_line`` says."""

    def __init__(self, policy: OnBadLine, stats: ReadStats) -> None:
        self.policy, self.stats = policy, stats

    def __call__(self, path: Path, line: int, reason: str) -> None:
        message = f"{path}:{line}: {reason}"
        if self.policy == "error":
            raise DataError(f"{message} (on_bad_line: skip passes over bad lines, counting them)")
        self.stats.add(message)


def _lines(path: Path, bad: _BadLines) -> Iterator[tuple[int, str | None]]:
    """(1-based number, text) of each line, the newline (and a carriage return before it) removed; text is
    None for a line that is not UTF-8, already reported to ``bad``. A final newline makes no extra line.
    The file is read in binary, so only "\\n" ends a line (not the form feeds or Unicode separators that
    ``str.splitlines`` would split on)."""
    with path.open("rb") as f:
        for number, raw in enumerate(f, start=1):
            if raw.endswith(b"\n"):
                raw = raw[:-2] if raw.endswith(b"\r\n") else raw[:-1]
            try:
                yield number, raw.decode("utf-8")
            except UnicodeDecodeError as error:
                bad(path, number, f"not UTF-8 text ({error.reason} at byte {error.start} of the line)")
                yield number, None


# --- line formats ------------------------------------------------------------------------------------------


def _tsv(path: Path, source: Source, bad: _BadLines) -> Iterator[Record]:
    names, columns = source.fields, source.resolved_columns
    expected = source.num_columns or max(int(c) for c in columns) + 1
    picks = list(zip(names, columns))
    for number, line in _lines(path, bad):
        if line is None or not line.strip():
            continue
        cells = line.split("\t")
        if len(cells) != expected:
            found = "no tab" if len(cells) == 1 else f"{len(cells) - 1} tabs"
            bad(path, number, f"expected {expected} tab-separated columns, found {found}: {line[:60]!r}")
            continue
        fields: dict[str, Value] = {name: cells[column] for name, column in picks}  # type: ignore[index]
        empty = next((name for name, text in fields.items() if not text.strip()), None)  # type: ignore[union-attr]
        if empty is not None:
            bad(path, number, f"empty {empty}")
            continue
        yield Record(path, number, fields)


def _text(path: Path, source: Source, bad: _BadLines) -> Iterator[Record]:
    name = source.fields[0]
    if source.documents == "line":
        for number, line in _lines(path, bad):
            if line is not None and line.strip():
                yield Record(path, number, {name: line})
        return
    # Blank-line documents: consecutive non-blank lines, joined by "\n"; a bad line spoils its document.
    start, spoiled = 0, False
    parts: list[str] = []
    for number, line in _lines(path, bad):
        if line is not None and not line.strip():
            if parts and not spoiled:
                yield Record(path, start, {name: "\n".join(parts)})
            parts, spoiled = [], False
            continue
        if not parts and not spoiled:
            start = number
        if line is None:
            spoiled = True
        else:
            parts.append(line)
    if parts and not spoiled:
        yield Record(path, start, {name: "\n".join(parts)})


def _jsonl(path: Path, source: Source, bad: _BadLines) -> Iterator[Record]:
    picks = list(zip(source.fields, source.resolved_columns))
    for number, line in _lines(path, bad):
        if line is None or not line.strip():
            continue
        try:
            obj = json.loads(line)  # per line, no bounded reader: its scan would cost more than the parse
        except json.JSONDecodeError as error:
            bad(path, number, f"not JSON ({error.msg} at column {error.colno})")
            continue
        except ValueError:  # Python's 4,300-digit cap on integers
            bad(path, number, "holds an integer of more than 4,300 digits")
            continue
        except RecursionError:  # json's C parser recurses: a line nested ~50,000 deep ends here
            bad(path, number, "JSON nested too deeply")
            continue
        if not isinstance(obj, dict):
            bad(path, number, f"expected a JSON object, found {_kind(obj)}")
            continue
        # A lone surrogate can only come from a "\ud8.." escape (the file is strict UTF-8): look only then
        escaped = "\\ud" in line or "\\uD" in line
        fields: dict[str, Value] = {}
        for name, key in picks:
            if key not in obj:
                bad(path, number, f"no key {key!r} (keys: {', '.join(map(repr, list(obj)[:8]))})")
                break
            value, problem = _value(obj[key])
            if escaped and not problem and (at := lone_surrogate(value)) is not None:
                what = "a list holding a text" if isinstance(value, list) else "text"
                problem = f"{what} with a lone UTF-16 surrogate at character {at} (not valid Unicode)"
            if problem:
                bad(path, number, f"{key!r} is {problem}")
                break
            fields[name] = value  # type: ignore[assignment]
        else:
            yield Record(path, number, fields)


def _aligned(paths: Sequence[Path], names: Sequence[str], bad: _BadLines) -> Iterator[Record]:
    readers = [_lines(path, bad) for path in paths]
    while True:
        rows = [next(reader, None) for reader in readers]
        ended = [row is None for row in rows]
        if all(ended):
            return
        if any(ended):
            short = paths[ended.index(True)]
            longer, row = next((p, r) for p, r in zip(paths, rows) if r is not None)
            assert row is not None
            raise DataError(  # never skippable: every later pair would be misaligned
                f"{short} ends at line {row[0] - 1} but {longer} goes on (line {row[0]}); aligned files "
                "need the same number of lines"
            )
        number = rows[0][0]  # type: ignore[index]
        texts = [row[1] for row in rows]  # type: ignore[index]
        if any(text is None for text in texts):
            continue  # reported by _lines
        empty = next((p for p, text in zip(paths, texts) if not text.strip()), None)  # type: ignore[union-attr]
        if empty is not None:
            bad(empty, number, "empty line (aligned files need text on every line)")
            continue
        yield Record(paths[0], number, dict(zip(names, texts)))  # type: ignore[arg-type]


def _npz(path: Path, source: Source, bad: _BadLines) -> Iterator[Record]:
    """A NumPy ``.npz`` of images: one record per row of its ``labels`` array, ``{"label": "3"}``, at "line"
    row + 1; the pixels stay in the file (`zoo.training.tasks.images` reads them by row)."""
    import numpy as np

    try:
        with np.load(path, allow_pickle=False) as archive:
            labels = archive["labels"] if "labels" in archive.files else None
            found = list(archive.files)
    except (OSError, ValueError) as error:
        raise DataError(f"{path}: not a NumPy .npz archive ({error})") from None
    if labels is None or "images" not in found:
        raise DataError(f"{path}: an image .npz holds the arrays 'images' and 'labels'; found {found}")
    if labels.ndim != 1 or not (labels.dtype.kind in "iu" or labels.dtype.kind == "U"):
        raise DataError(
            f"{path}: labels must be one integer or string per image, got {labels.dtype} {labels.shape}"
        )
    for row, label in enumerate(labels.tolist()):
        yield Record(path, row + 1, {"label": str(label)})


def _image_folder(path: Path, source: Source, bad: _BadLines) -> Iterator[Record]:
    """One file of an image folder (`data_files` lists them: ``train/cat/1.png`` is labelled "cat"): a
    record ``{"label": "cat"}`` at "line" 1 of its file. A file that is not an image (by its suffix), or one
    beside the label folders, is a bad line."""
    if path.parent in source.paths:
        bad(path, 1, "an image folder holds one subfolder per label, not files")
    elif path.suffix.lower() not in IMAGE_SUFFIXES:
        bad(path, 1, f"not an image file ({', '.join(IMAGE_SUFFIXES)})")
    else:
        yield Record(path, 1, {"label": path.parent.name})


def _value(value: Any) -> tuple[Value | None, str | None]:
    """(the field value, None) or (None, what is wrong with it)."""
    if value is None:
        return None, "empty (null)"
    if isinstance(value, str):
        return (value, None) if value.strip() else (None, "empty")
    if isinstance(value, bool):  # JSON's own spelling (kto's labels)
        return ("true" if value else "false"), None
    if isinstance(value, int):
        return str(value), None
    if isinstance(value, list):
        if not value:
            return None, "an empty list"
        items = []
        for item in value:
            if isinstance(item, str):
                items.append(item)
            elif isinstance(item, int) and not isinstance(item, bool):
                items.append(str(item))
            else:
                return None, f"a list holding {_kind(item)} (nested values are not read; expected strings)"
        return items, None
    return (
        None,
        f"{_kind(value)} (expected a string, an integer or a list of them; nested values are not read)",
    )


def _kind(value: Any) -> str:
    kinds = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", float: "a number"}
    return "null" if value is None else kinds.get(type(value), f"a {type(value).__name__}")


# --- Arrow and Parquet --------------------------------------------------------------------------------------


def _pyarrow() -> Any:
    try:
        import pyarrow
    except ImportError:
        raise ImportError(f"reading Parquet and Arrow files needs pyarrow: {PYARROW_HINT}") from None
    return pyarrow


def _table_files(path: Path, fmt: str) -> list[Path]:
    """The data files of one parquet / arrow path: the file itself, a ``save_to_disk`` folder's shards in
    its own order, or a folder's ``*.parquet`` / ``*.arrow`` files sorted by name."""
    if path.is_file():
        return [path]
    if (path / DATASET_DICT_NAME).is_file():
        splits = sorted(p.name for p in path.iterdir() if p.is_dir())
        raise DataError(
            f"{path} is a Hugging Face DatasetDict folder: name one split's folder ({', '.join(splits)})"
        )
    state = path / DATASET_STATE_NAME
    if fmt == "arrow" and state.is_file():  # save_to_disk: state.json lists the shards in order
        try:
            names = [entry["filename"] for entry in read_json(state)["_data_files"]]
        except (ValueError, KeyError, TypeError) as error:
            raise DataError(f"{state}: not a datasets state file ({error})") from None
        return [path / name for name in names]
    files = sorted(path.glob(f"*.{fmt}"))
    if not files:
        raise DataError(f"{path}: no *.{fmt} files in the folder")
    return files


def _arrow(path: Path, source: Source, bad: _BadLines) -> Iterator[Record]:
    pa = _pyarrow()
    try:
        handle = pa.memory_map(str(path))
        try:
            batches: Iterable[Any] = pa.ipc.open_stream(handle)  # datasets writes the stream format
        except pa.ArrowInvalid:
            handle.seek(0)
            reader = pa.ipc.open_file(handle)  # the file format (Feather v2)
            batches = (reader.get_batch(i) for i in range(reader.num_record_batches))
    except pa.ArrowInvalid as error:
        raise DataError(f"{path}: not an Arrow IPC file ({error})") from None
    yield from _batches(path, batches, source, bad)


def _parquet(path: Path, source: Source, bad: _BadLines) -> Iterator[Record]:
    _pyarrow()
    import pyarrow as pa
    import pyarrow.parquet as pq

    columns = [str(c) for c in source.resolved_columns]
    try:
        file = pq.ParquetFile(str(path))
    except (pa.ArrowInvalid, OSError) as error:
        raise DataError(f"{path}: not a Parquet file ({error})") from None
    _check_schema(path, file.schema_arrow, columns)
    yield from _batches(path, file.iter_batches(batch_size=ARROW_BATCH_ROWS, columns=columns), source, bad)


def _batches(path: Path, batches: Iterable[Any], source: Source, bad: _BadLines) -> Iterator[Record]:
    columns = [str(c) for c in source.resolved_columns]
    row = 0
    checked = False
    for batch in batches:
        if not checked:
            _check_schema(path, batch.schema, columns)
            checked = True
        values = [batch.column(column).to_pylist() for column in columns]
        for i in range(batch.num_rows):
            row += 1
            fields: dict[str, Value] = {}
            for name, column, column_values in zip(source.fields, columns, values):
                value, problem = _value(column_values[i])
                if problem:
                    bad(path, row, f"column {column!r} is {problem}")
                    break
                fields[name] = value  # type: ignore[assignment]
            else:
                yield Record(path, row, fields)


def _check_schema(path: Path, schema: Any, columns: Sequence[str]) -> None:
    """Refuse a missing column, or one whose type can never hold text (a struct, a float), naming it."""
    import pyarrow.types as t

    for column in columns:
        index = schema.get_field_index(column)
        if index < 0:
            raise DataError(f"{path}: no column {column!r} (columns: {', '.join(schema.names)})")
        kind = schema.field(index).type
        item = kind.value_type if t.is_list(kind) or t.is_large_list(kind) else kind
        readable = t.is_string(item) or t.is_large_string(item) or t.is_integer(item)
        if hasattr(t, "is_string_view"):
            readable = readable or t.is_string_view(item)
        if not readable:
            raise DataError(
                f"{path}: column {column!r} is {kind}; expected strings, integers or lists of them "
                "(nested values are not read)"
            )
