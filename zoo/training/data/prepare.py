"""Stream a corpus through an encoder into token shards, in bounded chunks; skip the work when it is done.

    prepare(Source("tsv", "train.tsv", ("source", "target")), encode_text_sides(tokenizer, ("source", "target")),
            "prepared/train", sides={"source": SideInfo(vocab_size=8000, tokenizer=fp), ...})

Records are read ``chunk_size`` at a time (10,000 by default), handed to the caller's ``encode`` and
appended to a `ShardWriter`, so memory holds a few chunks of text and ids whatever the corpus size. The
stages overlap: a reader thread reads chunk k + 2 while an encoder thread encodes k + 1 (the Rust
tokenizer releases the GIL) and the calling thread writes k.

Shards hold raw ids: `encode_text_sides` encodes with no special tokens. Framing (bos, eos, the decoder's
start token, [CLS]/[SEP]) is the task's, added when batches are collated or documents packed, so one
prepared corpus serves any framing and a packed stream of documents is not full of stray eos.

Parallelism: ``tokenizers``' ``encode_batch`` runs on every core (Rayon) unless the environment says
``TOKENIZERS_PARALLELISM=false`` (or ``0``/``off``/``no``), which `prepare` notes in the log; Rayon's
``RAYON_NUM_THREADS`` caps the thread count. zoo sets neither. A process that forks after using the
tokenizer's thread pool (DataLoader workers) has it turned off in the children by the library itself.

When it is a no-op: a second `prepare` into the same folder returns the existing manifest without reading
the corpus when the folder is complete and its manifest records the same sides (kind, dtype, vocabulary
size, tokenizer fingerprint), options, info and source files. A source file counts as the same when its
size and modification time (ns) match the manifest; when only the time differs (a copy, a touch) its
SHA-256 is computed and compared, so an unchanged file is not prepared again. The SHA-256 of every source
is computed once, while the corpus is being prepared (a thread beside the encoder: ~1 s per GB), and
recorded. A file rewritten in place with the same size within the same nanosecond tick is the one change
this cannot see (make and rsync share that blind spot); ``force=True`` prepares again regardless.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import queue
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from zoo.io.names import TOKENIZER_NAME
from zoo.io.tokenizer.errors import encode_checked
from zoo.training.data import DataError
from zoo.training.data.shards import (
    FORMAT_VERSION,
    Manifest,
    Rows,
    ShardWriter,
    SideInfo,
    check_replaceable,
    open_prepared,
    read_manifest,
)
from zoo.training.data.sources import ReadStats, Record, Source, data_files, iter_records

log = logging.getLogger(__name__)

CHUNK_SIZE = 10_000
HASH_BLOCK = 1 << 20
Encode = Callable[[list[Record]], Mapping[str, Rows | Sequence[Sequence[int] | None]]]
SourcesArg = Source | Sequence[Source] | Sequence[str | os.PathLike[str]]


def prepare(
    records: Source | Iterable[Record],
    encode: Encode,
    out_dir: str | os.PathLike[str],
    *,
    sides: Mapping[str, SideInfo],
    manifest_info: Mapping[str, Any] | None = None,
    options: Mapping[str, Any] | None = None,
    sources: SourcesArg = (),
    stats: ReadStats | None = None,
    counts: Callable[[], Mapping[str, int]] | None = None,
    chunk_size: int = CHUNK_SIZE,
    origins: bool = True,
    force: bool = False,
    progress: Callable[[int], None] | None = None,
) -> Manifest:
    """Encode ``records`` into a prepared folder at ``out_dir``; return its manifest.

    ``records``: a `Source` (read here, its bad-line count recorded) or any iterable of `Record`s, with
    the files they come from named in ``sources`` (without them there is nothing to compare, and every
    call prepares again). ``encode`` maps a chunk of records to ``{side: rows}``, one row per record; a
    row of None (in any side) drops that record, counted as ``dropped``. ``sides`` describes the sides
    (dtype, vocabulary, tokenizer fingerprint); ``options`` are the caller's settings that change the
    output (length limits, cut rules), ``manifest_info`` its notes (``{"task": ...}``); both are compared
    for the no-op. ``stats``: the `ReadStats` the records' reader counts into (a `Source` gets its own);
    ``counts``: called at the end for counters of the caller's to record (truncated examples, say).
    ``progress`` is called with the number of records read after each chunk.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size ({chunk_size}) must be >= 1")
    out = Path(out_dir)
    if isinstance(records, Source):
        sources = sources or records
        stats = stats if stats is not None else ReadStats()
        records = iter_records(records, stats=stats)
    files = source_files(sources)
    info, opts = _plain(dict(manifest_info or {})), _plain(dict(options or {}))
    check_replaceable(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with _exclusive(out):  # a second prepare of the same folder (another rank, say) waits, then finds it done
        if not force and files:
            done = _up_to_date(out, sides=sides, files=files, options=opts, info=info, origins=origins)
            if done is not None:
                log.info("%s is up to date with its sources: nothing to prepare", out)
                return done
        _note_parallelism()
        with ShardWriter(out, sides, origins=origins) as writer:
            tally, listed = _encode_into(writer, _chunks(records, chunk_size), encode, files, progress)
            if stats is not None:
                tally["skipped_lines"] = stats.skipped
                if stats.skipped:
                    log.warning("%d bad lines skipped (first: %s)", stats.skipped, stats.examples[0])
            tally.update(counts() if counts is not None else {})
            return writer.close(counts=tally, sources=listed, options=opts, info=info)


def _encode_into(
    writer: ShardWriter,
    chunks: Iterator[list[Record]],
    encode: Encode,
    files: list[Path],
    progress: Callable[[int], None] | None,
) -> tuple[dict[str, int], list[dict[str, Any]]]:
    """Encode every chunk into ``writer``; return the counts and the source files' manifest entries.

    Three stages at once: the reader thread reads chunk k + 2, the encoder thread encodes k + 1 (the Rust
    part without the GIL) while this thread writes k; a fourth thread hashes the source files."""
    with (
        ThreadPoolExecutor(1, "zoo-prepare-hash") as hasher,
        ThreadPoolExecutor(1, "zoo-prepare-encode") as encoder,
    ):
        store = _Store(writer, files, hasher)
        pending: tuple[list[Record], Future[Any]] | None = None
        for chunk in _read_ahead(chunks):
            future = encoder.submit(encode, chunk)
            if pending is not None:
                store.add(pending[0], pending[1].result(), progress)
            pending = (chunk, future)
        if pending is not None:
            store.add(pending[0], pending[1].result(), progress)
        if writer.num_examples == 0:
            named = ", ".join(map(str, files)) or str(writer.out_dir)
            raise DataError(f"{named}: no examples (the sources are empty or blank, or every line was bad)")
        return {"records": store.read, "dropped": store.dropped}, store.sources()


class _Store:
    """The writing end of `prepare`: drops the records the encoder dropped, notes where each example came
    from (a source file index and line), hashes every source file once in ``hasher``."""

    def __init__(self, writer: ShardWriter, files: list[Path], hasher: ThreadPoolExecutor) -> None:
        self.writer, self.files, self.hasher = writer, files, hasher
        self.before = [_stat(path) for path in files]
        self.digests: list[Future[str]] = [hasher.submit(file_sha256, path) for path in files]
        self.index: dict[Path, int] = {path: i for i, path in enumerate(files)}
        self.read = self.dropped = 0

    def add(
        self, chunk: list[Record], encoded: Mapping[str, Any], progress: Callable[[int], None] | None
    ) -> None:
        self.read += len(chunk)
        if progress is not None:
            progress(self.read)
        rows, keep = _kept_rows(encoded, len(chunk), self.writer.sides)
        if keep is not None:
            self.dropped += len(chunk) - len(keep)
            chunk = [chunk[i] for i in keep]
        if not chunk:
            return
        where = None
        if self.writer.with_origins:
            for record in chunk:
                if record.path not in self.index:  # a path as the reader spells it (relative, say)
                    self._note(record.path)
            where = np.array([(self.index[r.path], r.line) for r in chunk], dtype=np.int64).reshape(-1, 2)
        self.writer.write(rows, origins=where)

    def _note(self, spelled: Path) -> None:
        path = spelled.absolute()
        if path not in self.index:  # a file the caller did not name in sources
            self.index[path] = len(self.files)
            self.files.append(path)
            self.before.append(_stat(path))
            self.digests.append(self.hasher.submit(file_sha256, path))
        self.index[spelled] = self.index[path]

    def sources(self) -> list[dict[str, Any]]:
        """The manifest's list of source files; refuses a file that changed while it was read."""
        listed = []
        for path, (size, mtime), digest in zip(self.files, self.before, self.digests):
            if _stat(path) != (size, mtime):
                raise DataError(f"{path}: changed while it was being prepared; prepare again")
            listed.append({"path": str(path), "bytes": size, "mtime_ns": mtime, "sha256": digest.result()})
        return listed


def encode_text_sides(
    tokenizer: Any | Mapping[str, Any], fields: Sequence[str] | Mapping[str, str]
) -> Callable[[list[Record]], dict[str, list[list[int]]]]:
    """An ``encode`` for `prepare` that tokenizes plain text fields, no special tokens added.

    ``fields``: the record fields to encode, each its own side of the same name, or ``{side: field}``.
    ``tokenizer``: a zoo `Tokenizer`, a ``tokenizers.Tokenizer``, or ``{side: tokenizer}`` for sides with
    tokenizers of their own. Encodes with ``encode_batch_fast`` where the library has it (the ids of
    ``encode_batch``, without computing character offsets).
    """
    pairs = dict(fields) if isinstance(fields, Mapping) else {name: name for name in fields}
    encoders = {
        side: _batch_encoder(tokenizer[side] if isinstance(tokenizer, Mapping) else tokenizer)
        for side in pairs
    }

    def encode(records: list[Record]) -> dict[str, list[list[int]]]:
        out = {}
        for side, name in pairs.items():
            texts = [record.fields[name] for record in records]
            if not all(isinstance(text, str) for text in texts):
                first = next(r for r, t in zip(records, texts) if not isinstance(t, str))
                raise DataError(f"{first.origin}: field {name!r} is a list; plain text sides need a string")
            out[side] = [encoding.ids for encoding in encoders[side](texts)]
        return out

    return encode


def _batch_encoder(tokenizer: Any) -> Callable[[list[Any]], list[Any]]:
    backend = getattr(tokenizer, "hf", tokenizer)  # zoo's Tokenizer wraps a tokenizers.Tokenizer
    batch = partial(
        getattr(backend, "encode_batch_fast", None) or backend.encode_batch, add_special_tokens=False
    )
    # The library's errors as one line naming the tokenizer's file (`zoo.io.tokenizer.errors`).
    source = getattr(tokenizer, "source", "the tokenizer")
    return lambda texts: encode_checked(batch, texts, source=source)


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """``"sha256:<hex>"`` of a tokenizer's JSON (``tokenizer.json`` as the library serialises it, so the
    file's own indentation does not matter): a zoo `Tokenizer`, a ``tokenizers.Tokenizer``, or a path to a
    ``tokenizer.json`` (or its folder)."""
    if isinstance(tokenizer, (str, os.PathLike)):
        from tokenizers import Tokenizer as HFTokenizer

        path = Path(tokenizer)
        path = path / TOKENIZER_NAME if path.is_dir() else path
        if not path.is_file():
            raise FileNotFoundError(f"tokenizer file not found: {path}")
        tokenizer = HFTokenizer.from_file(str(path))
    backend = getattr(tokenizer, "hf", tokenizer)
    return "sha256:" + hashlib.sha256(backend.to_str().encode("utf-8")).hexdigest()


# --- sources and their fingerprints ------------------------------------------------------------------------


def source_files(sources: SourcesArg) -> list[Path]:
    """The files behind ``sources`` (`Source`s expanded, as they are read), absolute, in order."""
    items: Sequence[Any] = [sources] if isinstance(sources, (Source, str, os.PathLike)) else sources
    files: list[Path] = []
    for item in items:
        if isinstance(item, Source):
            files.extend(data_files(item))
        else:
            path = Path(item)
            if not path.is_file():
                raise FileNotFoundError(f"{path}: data file not found")
            files.append(path)
    return [path.absolute() for path in files]


def file_sha256(path: Path) -> str:
    """The SHA-256 of a file's bytes, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(HASH_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def _stat(path: Path) -> tuple[int, int]:
    info = path.stat()
    return info.st_size, info.st_mtime_ns


def _same_file(recorded: Mapping[str, Any], path: Path) -> bool:
    """Whether ``path`` is the file the manifest recorded: same size and time, or same size and bytes."""
    if recorded.get("path") != str(path):
        return False
    size, mtime = _stat(path)
    if recorded.get("bytes") != size:
        return False
    return recorded.get("mtime_ns") == mtime or recorded.get("sha256") == file_sha256(path)


def _up_to_date(
    out: Path,
    *,
    sides: Mapping[str, SideInfo],
    files: Sequence[Path],
    options: dict[str, Any],
    info: dict[str, Any],
    origins: bool,
) -> Manifest | None:
    """The existing manifest when ``out`` holds this very preparation, complete and intact; else None."""
    try:
        manifest = read_manifest(out)
    except (FileNotFoundError, DataError):
        return None
    wanted = {
        name: (side.kind, side.resolved_dtype, side.vocab_size, side.tokenizer)
        for name, side in sides.items()
    }
    found = {
        name: (side.kind, side.dtype, side.vocab_size, side.tokenizer)
        for name, side in manifest.sides.items()
    }
    same = (
        manifest.version == FORMAT_VERSION
        and wanted == found
        and manifest.options == options
        and manifest.info == info
        and manifest.origins == origins
        and len(manifest.sources) == len(files)
        and all(_same_file(recorded, path) for recorded, path in zip(manifest.sources, files))
    )
    if not same:
        return None
    try:
        open_prepared(out)  # the data files are all there, at their sizes
    except DataError:
        return None
    return manifest


def _plain(value: dict[str, Any]) -> dict[str, Any]:
    """``value`` as it reads back from JSON (tuples become lists), so that it compares with a manifest's."""
    result: dict[str, Any] = json.loads(json.dumps(value, default=str))
    return result


# --- the cache of on-the-fly preparations ------------------------------------------------------------------


def cache_root() -> Path:
    """Where prepared data for raw files named in configs goes: ``$ZOO_CACHE/prepared``, else
    ``$XDG_CACHE_HOME/zoo/prepared``, else ``~/.cache/zoo/prepared``."""
    if root := os.environ.get("ZOO_CACHE"):
        return Path(root).expanduser() / "prepared"
    base = os.environ.get("XDG_CACHE_HOME") or "~/.cache"
    return Path(base).expanduser() / "zoo" / "prepared"


_DIGESTS: dict[tuple[str, int, int], str] = {}  # (path, size, mtime_ns) -> sha256, for this process


def prepared_cache_dir(
    sources: SourcesArg,
    tokenizer_fingerprint: str | Mapping[str, str],
    options: Mapping[str, Any] | None = None,
    *,
    root: str | os.PathLike[str] | None = None,
) -> Path:
    """The cache folder for preparing ``sources`` with this tokenizer and these options (not created).

    The key is the sources' absolute paths and SHA-256 (hashed once per process for a file whose size and
    time stay the same), the tokenizer fingerprint(s), the options (the task among them, when it changes
    the output) and the format version: an edited file, another tokenizer or another length limit gets a
    folder of its own. ``root`` defaults to `cache_root`.
    """
    files = []
    for path in source_files(sources):
        size, mtime = _stat(path)
        key = (str(path), size, mtime)
        if key not in _DIGESTS:
            _DIGESTS[key] = file_sha256(path)
        files.append([str(path), _DIGESTS[key]])
    material = {
        "version": FORMAT_VERSION,
        "sources": files,
        "tokenizer": tokenizer_fingerprint,
        "options": dict(options or {}),
    }
    text = json.dumps(material, sort_keys=True, default=str)
    base = Path(root).expanduser() if root is not None else cache_root()
    return base / hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


# --- chunking ----------------------------------------------------------------------------------------------


def _chunks(records: Iterable[Record], size: int) -> Iterator[list[Record]]:
    chunk: list[Record] = []
    for record in records:
        chunk.append(record)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


_DONE = object()


def _read_ahead(chunks: Iterator[list[Record]]) -> Iterator[list[Record]]:
    """``chunks``, the next one read in a thread while the caller works on this one (at most two chunks
    in memory beyond the caller's). An error in the reader is raised here, in the caller's thread."""
    slots: queue.Queue[Any] = queue.Queue(maxsize=1)
    stop = threading.Event()

    def read() -> None:
        try:
            for chunk in chunks:
                while not stop.is_set():
                    try:
                        slots.put(chunk, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            slots.put(_DONE)
        except BaseException as error:
            slots.put(error)

    thread = threading.Thread(target=read, name="zoo-prepare-reader", daemon=True)
    thread.start()
    try:
        while (item := slots.get()) is not _DONE:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        thread.join()


def _kept_rows(
    encoded: Mapping[str, Any], n: int, sides: Mapping[str, SideInfo]
) -> tuple[dict[str, Any], list[int] | None]:
    """(the rows to write, the kept record indices, or None when every record is kept)."""
    if set(encoded) != set(sides):
        raise ValueError(f"encode returned sides {sorted(encoded)}, expected {sorted(sides)}")
    for name, rows in encoded.items():
        if len(rows) != n:
            raise ValueError(f"encode returned {len(rows)} rows of {name!r} for {n} records; one per record")
    listed = [rows for rows in encoded.values() if not isinstance(rows, np.ndarray)]
    if not any(row is None for rows in listed for row in rows):  # not `None in rows`: rows may be arrays
        return dict(encoded), None
    dropped = {i for rows in listed for i, row in enumerate(rows) if row is None}
    keep = [i for i in range(n) if i not in dropped]
    return {
        name: [rows[i] for i in keep] if not isinstance(rows, np.ndarray) else rows[keep]
        for name, rows in encoded.items()
    }, keep


@contextlib.contextmanager
def _exclusive(out: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``.<out>.lock`` beside ``out`` (flock; where there is none, as on Windows,
    nothing is locked): concurrent prepares of one folder run one after the other, so that the later ones
    find the work done instead of removing each other's temp folders."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    path = out.parent / f".{out.name}.lock"
    try:  # never through a symbolic link: the lock file is created, and a link would create it elsewhere
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
    except OSError as error:
        if error.errno != errno.ELOOP:
            raise
        raise DataError(
            f"{path} is a symbolic link: zoo never creates its lock through a link (it would create or "
            "change the file it points to); remove the link"
        ) from None
    with os.fdopen(fd, "a") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)


def _note_parallelism() -> None:
    value = os.environ.get("TOKENIZERS_PARALLELISM", "").strip().lower()
    if value in ("0", "false", "off", "no"):
        log.warning("TOKENIZERS_PARALLELISM=%s: the tokenizer encodes on one core", value)
