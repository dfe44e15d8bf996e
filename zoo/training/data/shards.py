"""Prepared data on disk: flat token arrays, offsets and a manifest, memory-mapped for reading.

The layout of fairseq's and Megatron's indexed datasets and nanoGPT's ``.bin`` files, one folder per split:

    manifest.json            format, version, sides, counts, sources, options; ``"complete": true`` last
    <side>.tokens.bin        a sequence side: every example's ids end to end (uint16 or uint32)
    <side>.offsets.bin       int64, N + 1 values: example i is tokens[offsets[i]:offsets[i + 1]]
    <side>.values.bin        a scalar side: one integer per example (a sequence class label)
    origins.bin              int64, (N, 2): the source file (an index into manifest["sources"]) and line

Little-endian, no header: a file's size is its element count times the item size, which the reader checks
against the manifest, so a truncated file is refused by name. A sequence side's dtype is uint16 when its
ids fit (``vocab_size`` <= 65,536: ids 0..65,535), else uint32; a side may name its dtype instead (a signed
one for labels with a -100 "not scored" value, say). Token classification's per-token labels are a
sequence side like any other.

Writing is atomic at the folder level: `ShardWriter` fills a hidden temp folder beside the target
(``.<name>.<random>.tmp``), writes the manifest last, fsyncs, and renames the folder into place; a previous
folder there is swapped out and removed. A killed writer leaves only its temp folder, which no reader opens
and the next writer for the same target removes. One writer per target folder at a time.

Reading (`open_prepared`) maps the files read-only on first use and copies nothing: opening a folder of
millions of examples reads the manifest, checks file sizes, and touches no token page.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

import numpy as np

from zoo.io.atomic import TEMP_SUFFIX, fsync_dir, remove_stale_temps
from zoo.io.jsonfile import read_json
from zoo.io.names import PREPARED_MANIFEST_NAME, PREPARED_ORIGINS_NAME
from zoo.training.data import DataError

FORMAT = "zoo-prepared"
FORMAT_VERSION = 1
UINT16_VOCAB = 1 << 16  # a vocabulary up to this size has ids that fit in uint16
DTYPES = ("uint8", "uint16", "uint32", "int8", "int16", "int32", "int64")

SideKind = Literal["sequence", "scalar"]
Rows = Sequence[Sequence[int]] | np.ndarray  # a chunk of one side: a row of ids per example, or (n,) / (n, L)


@dataclass(frozen=True)
class SideInfo:
    """One side of the examples: ``"sequence"`` (a variable-length row of ids each: tokens, token labels)
    or ``"scalar"`` (one integer each: a class label). ``vocab_size`` bounds the ids (0 <= id < vocab_size)
    and picks the dtype unless ``dtype`` names one; ``tokenizer`` is the fingerprint of the tokenizer that
    made the ids (`zoo.training.data.prepare.tokenizer_fingerprint`), recorded in the manifest."""

    kind: SideKind = "sequence"
    vocab_size: int | None = None
    dtype: str | None = None
    tokenizer: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in ("sequence", "scalar"):
            raise ValueError(f"side kind {self.kind!r} must be 'sequence' or 'scalar'")
        if self.dtype is not None and self.dtype not in DTYPES:
            raise ValueError(f"dtype {self.dtype!r} is not one of {', '.join(DTYPES)}")
        if self.vocab_size is not None and self.vocab_size < 1:
            raise ValueError(f"vocab_size ({self.vocab_size}) must be >= 1")
        if self.dtype is None and self.vocab_size is None:
            raise ValueError("a side needs a vocab_size (which picks uint16 or uint32) or a dtype")

    @property
    def resolved_dtype(self) -> str:
        if self.dtype is not None:
            return self.dtype
        assert self.vocab_size is not None
        return "uint16" if self.vocab_size <= UINT16_VOCAB else "uint32"


@dataclass(frozen=True)
class SideManifest(SideInfo):
    """A side as written: its `SideInfo` with the dtype resolved, and ``tokens``, its element count."""

    tokens: int = 0


@dataclass(frozen=True)
class Manifest:
    """What ``manifest.json`` says. ``sources``: ``{"path", "bytes", "mtime_ns", "sha256"}`` per file read;
    ``options``: the caller's settings that change the output (length limits, cut rules); ``info``: the
    caller's other notes (the task); ``counts``: examples, tokens per side, skipped lines and the like."""

    num_examples: int
    sides: dict[str, SideManifest]
    counts: dict[str, int] = field(default_factory=dict)
    sources: list[dict[str, Any]] = field(default_factory=list)
    options: dict[str, Any] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)
    origins: bool = True
    created: str = ""
    version: int = FORMAT_VERSION
    complete: bool = True

    @property
    def task(self) -> str | None:
        task = self.info.get("task")
        return task if isinstance(task, str) else None

    def to_json(self) -> dict[str, Any]:
        """The manifest as JSON data, ``complete`` the last key."""
        return {
            "format": FORMAT,
            "version": self.version,
            "created": self.created,
            "task": self.task,
            "num_examples": self.num_examples,
            "sides": {name: asdict(side) for name, side in self.sides.items()},
            "counts": self.counts,
            "sources": self.sources,
            "options": self.options,
            "info": self.info,
            "origins": self.origins,
            "complete": self.complete,
        }

    @classmethod
    def from_json(cls, data: Any, *, path: Path) -> Manifest:
        """Parse ``manifest.json`` data; a missing or wrong field is a `DataError` naming ``path`` and it."""
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise DataError(f'{path}: not a zoo prepared-data manifest (no "format": "{FORMAT}")')
        version = data.get("version")
        if not isinstance(version, int) or version > FORMAT_VERSION:
            raise DataError(
                f"{path}: format version {version!r}, this zoo reads up to {FORMAT_VERSION}; "
                "prepare the data again with this version"
            )
        if data.get("complete") is not True:
            raise DataError(f"{path}: not marked complete; the prepare that wrote it did not finish")
        try:
            sides = {
                str(name): SideManifest(**{key: side[key] for key in _SIDE_KEYS})
                for name, side in _typed(data, "sides", dict).items()
            }
            return cls(
                num_examples=_typed(data, "num_examples", int),
                sides=sides,
                counts=_typed(data, "counts", dict),
                sources=_typed(data, "sources", list),
                options=_typed(data, "options", dict),
                info=_typed(data, "info", dict),
                origins=_typed(data, "origins", bool),
                created=str(data.get("created", "")),
                version=version,
            )
        except (KeyError, TypeError, ValueError) as error:
            message = error.args[0] if isinstance(error, ValueError) else f"a side lacks {error}"
            raise DataError(f"{path}: {message}") from None


_SIDE_KEYS = ("kind", "vocab_size", "dtype", "tokenizer", "tokens")


def _typed(data: dict[str, Any], key: str, kind: type) -> Any:
    value = data.get(key)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ValueError(f"{key!r} must be {kind.__name__}, found {type(value).__name__}")
    return value


def side_files(name: str, kind: SideKind) -> tuple[str, ...]:
    """The file names of one side: (tokens, offsets) for a sequence side, (values,) for a scalar one."""
    return (f"{name}.tokens.bin", f"{name}.offsets.bin") if kind == "sequence" else (f"{name}.values.bin",)


# --- writing -----------------------------------------------------------------------------------------------


class ShardWriter:
    """Append chunks of encoded examples; `close` writes the manifest and moves the folder into place.

        with ShardWriter(out, {"source": SideInfo(vocab_size=8000), "target": SideInfo(vocab_size=8000)}) as w:
            w.write({"source": [[5, 6], [7]], "target": [[8], [9, 10]]}, origins=[(0, 1), (0, 2)])
            manifest = w.close(sources=[...])

    Leaving the ``with`` block without `close` (an error, say) removes the temp folder.
    """

    def __init__(
        self, out_dir: str | os.PathLike[str], sides: Mapping[str, SideInfo], *, origins: bool = True
    ) -> None:
        if not sides:
            raise ValueError("ShardWriter needs at least one side")
        for name in sides:
            if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_-]*", name):
                raise ValueError(f"side name {name!r} must be letters, digits, '_' or '-' (it names files)")
        self.out_dir = Path(out_dir)
        self.sides = dict(sides)
        self.with_origins = origins
        check_replaceable(self.out_dir)
        self.out_dir.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temps(self.out_dir.parent, re.compile(re.escape(self.out_dir.name)))
        self.temp = Path(
            tempfile.mkdtemp(dir=self.out_dir.parent, prefix=f".{self.out_dir.name}.", suffix=TEMP_SUFFIX)
        )
        self.num_examples = 0
        self._tokens = dict.fromkeys(sides, 0)
        self._files: dict[str, Any] = {}
        self._closed = False
        try:
            for name, side in self.sides.items():
                for file in side_files(name, side.kind):
                    self._files[file] = (self.temp / file).open("wb")
                if side.kind == "sequence":
                    self._files[f"{name}.offsets.bin"].write(np.zeros(1, dtype="<i8").tobytes())
            if origins:
                self._files[PREPARED_ORIGINS_NAME] = (self.temp / PREPARED_ORIGINS_NAME).open("wb")
        except BaseException:
            self.abort()
            raise

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        if not self._closed:
            self.abort()

    def write(
        self, chunk: Mapping[str, Rows], *, origins: Sequence[tuple[int, int]] | np.ndarray | None = None
    ) -> None:
        """Append ``n`` examples: every side's rows (``n`` of them), and with ``origins`` on, ``n``
        (source index, line) pairs. Ids outside the side's range (``vocab_size``, the dtype) are refused."""
        if set(chunk) != set(self.sides):
            raise ValueError(f"a chunk has sides {sorted(chunk)}, the writer {sorted(self.sides)}")
        arrays = {name: self._flatten(name, rows) for name, rows in chunk.items()}
        counts = {name: len(lengths) for name, (_, lengths) in arrays.items()}
        n = next(iter(counts.values()))
        if any(count != n for count in counts.values()):
            raise ValueError(f"a chunk's sides hold different numbers of examples: {counts}")
        origin_rows = None
        if self.with_origins:
            if origins is None:
                raise ValueError("this writer records origins: write(chunk, origins=...) needs them")
            origin_rows = np.asarray(origins, dtype="<i8").reshape(-1, 2)
            if len(origin_rows) != n:
                raise ValueError(f"{len(origin_rows)} origins for {n} examples")
        for name, (flat, lengths) in arrays.items():
            side = self.sides[name]
            if side.kind == "sequence":
                ends = self._tokens[name] + np.cumsum(lengths, dtype=np.int64)
                self._files[f"{name}.tokens.bin"].write(flat.tobytes())
                self._files[f"{name}.offsets.bin"].write(ends.astype("<i8").tobytes())
            else:
                self._files[f"{name}.values.bin"].write(flat.tobytes())
            self._tokens[name] += len(flat)
        if origin_rows is not None:
            self._files[PREPARED_ORIGINS_NAME].write(origin_rows.tobytes())
        self.num_examples += n

    def _flatten(self, name: str, rows: Rows) -> tuple[np.ndarray, np.ndarray]:
        """(the ids end to end in the side's dtype, the (n,) row lengths); range-checked."""
        side = self.sides[name]
        if side.kind == "scalar":
            flat = np.asarray(rows, dtype=np.int64)
            if flat.ndim != 1:
                raise ValueError(f"side {name!r} is scalar: one integer per example, got shape {flat.shape}")
            lengths = np.ones(len(flat), dtype=np.int64)
        elif isinstance(rows, np.ndarray):
            if rows.ndim != 2:
                raise ValueError(
                    f"side {name!r}: an array chunk must be (examples, length), got {rows.shape}"
                )
            flat = rows.astype(np.int64, copy=False).reshape(-1)
            lengths = np.full(len(rows), rows.shape[1], dtype=np.int64)
        else:
            lengths = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
            flat = np.fromiter(itertools.chain.from_iterable(rows), dtype=np.int64, count=int(lengths.sum()))
        dtype = np.dtype(side.resolved_dtype).newbyteorder("<")
        if len(flat):
            low, high = int(flat.min()), int(flat.max())
            top = (
                np.iinfo(dtype).max
                if side.vocab_size is None
                else min(np.iinfo(dtype).max, side.vocab_size - 1)
            )
            if low < np.iinfo(dtype).min or high > top:
                bad = low if low < np.iinfo(dtype).min else high
                limit = (
                    f"vocab_size {side.vocab_size}" if side.vocab_size is not None else side.resolved_dtype
                )
                raise ValueError(f"side {name!r}: id {bad} is outside the range of {limit}")
        return flat.astype(dtype), lengths

    def close(
        self,
        *,
        counts: Mapping[str, int] | None = None,
        sources: Sequence[Mapping[str, Any]] = (),
        options: Mapping[str, Any] | None = None,
        info: Mapping[str, Any] | None = None,
    ) -> Manifest:
        """Finish: sync the files, write the manifest (``complete`` last), move the folder into place.

        ``counts`` are added to the manifest's (examples and tokens per side are counted here); ``sources``
        are the files read, ``{"path", "bytes", "mtime_ns", "sha256"}`` each. Refuses a folder with no
        examples."""
        if self._closed:
            raise ValueError("the writer is already closed")
        try:
            if self.num_examples == 0:
                raise DataError(
                    f"{self.out_dir}: no examples to write (the sources are empty or every line was bad)"
                )
            sides = {
                name: SideManifest(
                    kind=side.kind,
                    vocab_size=side.vocab_size,
                    dtype=side.resolved_dtype,
                    tokenizer=side.tokenizer,
                    tokens=self._tokens[name],
                )
                for name, side in self.sides.items()
            }
            all_counts = {"examples": self.num_examples}
            all_counts.update(
                {f"{name}_tokens": side.tokens for name, side in sides.items() if side.kind == "sequence"}
            )
            all_counts.update(counts or {})
            manifest = Manifest(
                num_examples=self.num_examples,
                sides=sides,
                counts=all_counts,
                sources=[dict(s) for s in sources],
                options=dict(options or {}),
                info=dict(info or {}),
                origins=self.with_origins,
                created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
            )
            for handle in self._files.values():
                handle.flush()
                os.fsync(handle.fileno())
                handle.close()
            text = json.dumps(manifest.to_json(), indent=2, ensure_ascii=False) + "\n"
            with (self.temp / PREPARED_MANIFEST_NAME).open("w", encoding="utf-8") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            for name in [*self._files, PREPARED_MANIFEST_NAME]:
                os.chmod(self.temp / name, 0o644)
            os.chmod(self.temp, 0o755)
            fsync_dir(self.temp)
            _swap_into_place(self.temp, self.out_dir)
        except BaseException:
            self.abort()
            raise
        self._closed = True
        return manifest

    def abort(self) -> None:
        """Drop everything written: close the files and remove the temp folder."""
        self._closed = True
        for handle in self._files.values():
            with contextlib.suppress(OSError):
                handle.close()
        shutil.rmtree(self.temp, ignore_errors=True)


def check_replaceable(out_dir: Path) -> None:
    """Refuse to write over a folder that is not prepared data (it holds files and no manifest)."""
    if out_dir.is_symlink() or (out_dir.exists() and not out_dir.is_dir()):
        raise DataError(f"{out_dir}: exists and is not a folder; name a new or empty folder")
    if out_dir.is_dir() and not (out_dir / PREPARED_MANIFEST_NAME).is_file() and any(out_dir.iterdir()):
        raise DataError(
            f"{out_dir}: holds files and no {PREPARED_MANIFEST_NAME}, so it is not prepared data; name a new or "
            "empty folder (prepare replaces a prepared folder, nothing else)"
        )


def _swap_into_place(temp: Path, final: Path) -> None:
    """Rename ``temp`` to ``final``; an existing ``final`` is first moved into a temp folder of its own
    (so a crash in between leaves no ``final``, never a half one) and removed after."""
    old = None
    if final.exists():
        old = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}.", suffix=TEMP_SUFFIX))
        os.rename(final, old / "old")
    os.rename(temp, final)
    fsync_dir(final.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


# --- reading -----------------------------------------------------------------------------------------------


class PreparedData:
    """A prepared folder, memory-mapped read-only on first use of each file (see `open_prepared`).

    Arrays returned are views of the maps (read-only, no copy); ``np.array(view)`` copies one out.
    """

    def __init__(self, path: Path, manifest: Manifest) -> None:
        self.path, self.manifest = path, manifest
        self._maps: dict[str, np.ndarray] = {}

    @property
    def num_examples(self) -> int:
        return self.manifest.num_examples

    def __len__(self) -> int:
        return self.manifest.num_examples

    @property
    def sides(self) -> tuple[str, ...]:
        return tuple(self.manifest.sides)

    def side(self, name: str) -> SideManifest:
        try:
            return self.manifest.sides[name]
        except KeyError:
            raise KeyError(f"{self.path}: no side {name!r} (sides: {', '.join(self.sides)})") from None

    def tokens(self, side: str) -> np.ndarray:
        """(tokens,) every example's ids of a sequence side, end to end."""
        return self._map(self._file(side, "tokens"), self.side(side).resolved_dtype, self.side(side).tokens)

    def offsets(self, side: str) -> np.ndarray:
        """(N + 1,) int64: example i is ``tokens[offsets[i]:offsets[i + 1]]``."""
        return self._map(self._file(side, "offsets"), "int64", self.num_examples + 1)

    def values(self, side: str) -> np.ndarray:
        """(N,) a scalar side's integers, one per example."""
        return self._map(self._file(side, "values"), self.side(side).resolved_dtype, self.num_examples)

    def lengths(self, side: str) -> np.ndarray:
        """(N,) int64 length of each example's row (reads the offsets only); all ones for a scalar side."""
        if self.side(side).kind == "scalar":
            return np.ones(self.num_examples, dtype=np.int64)
        return np.diff(self.offsets(side))

    def read_rows(
        self, indices: Sequence[int] | np.ndarray, side: str, *, limit: int | None = None
    ) -> list[np.ndarray]:
        """The rows of ``indices`` on a sequence side (each its first ``limit`` entries at most), read from
        the files (positioned reads), not the maps. Training reads its batches this way: pages a map touches
        stay in the process's resident set (with the kernel's read-ahead around each one), so a run through
        a corpus far larger than memory would grow with it; reads leave the pages to the page cache, outside
        the process."""
        dtype = np.dtype(self.side(side).resolved_dtype).newbyteorder("<")
        rows = []
        offsets_path, tokens_path = (self.path / self._file(side, kind) for kind in ("offsets", "tokens"))
        with offsets_path.open("rb") as offsets, tokens_path.open("rb") as tokens:
            for i in np.asarray(indices, dtype=np.int64).tolist():
                offsets.seek(8 * i)
                start, stop = np.frombuffer(offsets.read(16), dtype="<i8").tolist()
                stop = stop if limit is None else min(stop, start + limit)
                tokens.seek(start * dtype.itemsize)
                rows.append(np.frombuffer(tokens.read((stop - start) * dtype.itemsize), dtype=dtype))
        return rows

    def read_span(self, side: str, start: int, stop: int, *, what: str = "tokens") -> np.ndarray:
        """``tokens(side)[start:stop]`` (or the offsets', ``what="offsets"``), read from the file."""
        dtype = np.dtype("int64" if what == "offsets" else self.side(side).resolved_dtype).newbyteorder("<")
        path = self.path / self._file(side, what)
        return np.fromfile(path, dtype=dtype, count=stop - start, offset=start * dtype.itemsize)

    def read_lengths(self, side: str, start: int, stop: int) -> np.ndarray:
        """(stop - start,) int64 row lengths of examples ``start:stop``, read from the offsets file rather
        than its map: a pass over every example's length (planning) leaves no mapped pages resident."""
        if self.side(side).kind == "scalar":
            return np.ones(stop - start, dtype=np.int64)
        return np.diff(self.read_span(side, start, stop + 1, what="offsets"))

    def example(self, i: int) -> dict[str, np.ndarray]:
        """Example ``i``, every side: a (length,) row, or a () scalar."""
        if not -self.num_examples <= i < self.num_examples:
            raise IndexError(f"example {i} is out of range for {self.num_examples} examples")
        i %= self.num_examples
        return {name: self._row(name, i) for name in self.sides}

    def gather(self, indices: Sequence[int] | np.ndarray, side: str) -> list[np.ndarray]:
        """The rows of ``indices`` on one side (for a scalar side, () arrays: ``values(side)[indices]`` is
        the one-array way)."""
        index = np.asarray(indices, dtype=np.int64)
        if self.side(side).kind == "scalar":
            values = self.values(side)
            return [np.asarray(values[i]) for i in index]
        offsets, tokens = self.offsets(side), self.tokens(side)
        starts, ends = offsets[index], offsets[index + 1]
        return [tokens[s:e] for s, e in zip(starts.tolist(), ends.tolist())]

    def origin(self, i: int) -> str:
        """``"file:line"`` of example ``i`` (its index when the folder records no origins)."""
        if not self.manifest.origins:
            return f"{self.path} example {i}"
        source, line = (
            int(v)
            for v in self._map(PREPARED_ORIGINS_NAME, "int64", 2 * self.num_examples)[2 * i : 2 * i + 2]
        )
        sources = self.manifest.sources
        name = sources[source]["path"] if 0 <= source < len(sources) else f"source {source}"
        return f"{name}:{line}"

    def _row(self, side: str, i: int) -> np.ndarray:
        if self.side(side).kind == "scalar":
            return np.asarray(self.values(side)[i])
        offsets = self.offsets(side)
        return self.tokens(side)[int(offsets[i]) : int(offsets[i + 1])]

    def _file(self, side: str, kind: str) -> str:
        wanted = self.side(side).kind
        if (kind == "values") != (wanted == "scalar"):
            raise ValueError(f"side {side!r} is a {wanted} side: it has no {kind}")
        return f"{side}.{kind}.bin"

    def _map(self, name: str, dtype: str, count: int) -> np.ndarray:
        if name not in self._maps:
            if count == 0:  # mmap cannot map an empty file
                self._maps[name] = np.zeros(0, dtype=np.dtype(dtype).newbyteorder("<"))
            else:
                self._maps[name] = np.memmap(
                    self.path / name, dtype=np.dtype(dtype).newbyteorder("<"), mode="r", shape=(count,)
                )
        return self._maps[name]

    def __repr__(self) -> str:
        return f"PreparedData({str(self.path)!r}, {self.num_examples} examples, sides {list(self.sides)})"


def read_manifest(directory: str | os.PathLike[str]) -> Manifest:
    """The manifest of a prepared folder, checked for completeness and version (not the data files)."""
    path = Path(directory)
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: no prepared data there (prepare it first: zoo data prepare)")
    file = path / PREPARED_MANIFEST_NAME
    if not file.is_file():
        raise DataError(
            f"{path}: no {PREPARED_MANIFEST_NAME}; not prepared data, or a prepare that did not finish"
        )
    try:
        data = read_json(file)
    except ValueError as error:  # the bounded reader's message names the file
        raise DataError(f"{error}; the folder was damaged") from None
    return Manifest.from_json(data, path=file)


def open_prepared(directory: str | os.PathLike[str]) -> PreparedData:
    """Open a prepared folder: read and check the manifest and every file's size, map nothing yet.

    A folder without a complete manifest, from a newer format, or with a file whose size disagrees with
    the manifest's counts (truncated, or changed since) is a `DataError` naming the file.
    """
    path = Path(directory)
    manifest = read_manifest(path)
    expected: dict[str, int] = {}
    for name, side in manifest.sides.items():
        itemsize = np.dtype(side.resolved_dtype).itemsize
        if side.kind == "sequence":
            expected[f"{name}.tokens.bin"] = side.tokens * itemsize
            expected[f"{name}.offsets.bin"] = (manifest.num_examples + 1) * 8
        else:
            expected[f"{name}.values.bin"] = manifest.num_examples * itemsize
    if manifest.origins:
        expected[PREPARED_ORIGINS_NAME] = manifest.num_examples * 16
    for name, size in expected.items():
        file = path / name
        if not file.is_file():
            raise DataError(f"{file}: missing; the prepared folder is incomplete (prepare it again)")
        found = file.stat().st_size
        if found != size:
            raise DataError(
                f"{file}: {found} bytes, expected {size} from {PREPARED_MANIFEST_NAME} (truncated or changed "
                "since it was prepared; prepare it again)"
            )
    data = PreparedData(path, manifest)
    for name, side in manifest.sides.items():
        if side.kind == "sequence" and manifest.num_examples:
            offsets = data.offsets(name)
            if int(offsets[0]) != 0 or int(offsets[-1]) != side.tokens:
                raise DataError(
                    f"{path / f'{name}.offsets.bin'}: offsets run {int(offsets[0])}..{int(offsets[-1])}, "
                    f"expected 0..{side.tokens} (damaged; prepare it again)"
                )
    return data
