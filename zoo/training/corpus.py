"""A task's data as prepared token shards: raw files prepared (once) into a cache, or a prepared folder.

    split = prepare_split(task, config.data.train, tokenizers, name="train", limits=limits)   # training
    result = prepare_corpus("seq2seq", ["train.tsv"], tokenizer="tok.json", out="prepared/train")  # the CLI

A config that names raw files (a TSV, a text file, ...) is prepared on the fly by the task's reader and
encoder (`zoo.training.tasks`) into `zoo.training.data.prepare.prepared_cache_dir`, keyed by the files'
content, the tokenizer(s), the task and the length limit; the next run with the same key opens it without
reading the text again. A ``{prepared: DIR}`` split is opened as it is, after checking that it holds the
task's sides, made by the run's tokenizer. Either way the run memory-maps the token ids and reads only
the batches it takes.

Examples longer than the limit are cut, dropped or refused as they are encoded (``data.too_long``): a
prepared folder records the limit it was cut to, and a run with a shorter one cuts again when batching
(`zoo.training.tasks.base.example_units`). Packed language-model data is never cut: documents of any
length go into the stream whole.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from zoo.io.tokenizer import Tokenizer
from zoo.training.config import DataFiles, ParallelFiles, PreparedFiles
from zoo.training.data import DataError
from zoo.training.data.prepare import prepare, prepared_cache_dir
from zoo.training.data.shards import Manifest, PreparedData, open_prepared
from zoo.training.data.sources import Format, OnBadLine, ReadStats, Record, Source
from zoo.training.tasks import Task, get_task
from zoo.training.tasks.base import LengthCuts, Limits, Split, Tokenizers

log = logging.getLogger(__name__)


def prepare_split(
    task: Task,
    files: DataFiles,
    tokenizers: Tokenizers,
    *,
    name: str,
    limits: Limits | None,
    on_bad_line: OnBadLine = "error",
) -> Split:
    """One split of ``task``'s data, ready to train on: a prepared folder opened and checked, or raw files
    prepared into the cache (or found there). ``limits``: the length the examples are cut to as they are
    encoded (None: not cut, for packing); ``on_bad_line``: "skip" passes over bad lines, counted."""
    if isinstance(files, PreparedFiles):
        data = open_prepared(files.prepared)
        check_prepared(task, data, tokenizers, where=f"data.{name}.prepared")
        return Split(name, data)
    source = task.source(files, on_bad_line=on_bad_line)
    out = prepared_cache_dir(source, _fingerprints(task, tokenizers), _options(task, source, limits))
    done = _prepare(task, source, tokenizers, limits=limits, out=out)
    data = open_prepared(out)
    cuts, counts = done.cuts, done.manifest.counts
    if cuts is not None and done.encoded:  # prepared now: cuts counted as the examples were encoded
        cuts.report(", ".join(map(str, source.paths)), kept=data.num_examples)
    elif cuts is not None and counts.get("over_max_length"):  # found in the cache: its counts said again
        found = LengthCuts(
            cuts.limits,
            total=counts.get("records", 0),
            cut=counts["over_max_length"],
            hollow=counts.get("nothing_to_train", 0),
        )
        found.report(", ".join(map(str, source.paths)), kept=data.num_examples)
    return Split(name, data, raw=source)


@dataclass
class _Done:
    manifest: Manifest
    cuts: LengthCuts | None
    encoded: bool  # False: the folder was already prepared, nothing was read


def _prepare(
    task: Task,
    source: Source,
    tokenizers: Tokenizers,
    *,
    limits: Limits | None,
    out: Path,
    progress: Callable[[int], None] | None = None,
) -> _Done:
    info = {"task": task.name, **task.manifest_info(lambda: task.records(source))}
    cuts = LengthCuts(limits) if limits is not None else None
    stats = ReadStats()
    encode = task.encoder(tokenizers, cuts=cuts, labels=info.get("labels", ()))
    encoded = False

    def counted(records: list[Record]) -> dict[str, Any]:
        nonlocal encoded
        encoded = True
        return encode(records)

    manifest = prepare(
        task.records(source, stats=stats),
        counted,
        out,
        sides=task.side_infos(tokenizers, info=info),
        manifest_info=info,
        options=_options(task, source, limits),
        sources=source,
        stats=stats,
        counts=cuts.counts if cuts is not None else None,
        progress=progress,
    )
    return _Done(manifest, cuts, encoded)


def _options(task: Task, source: Source, limits: Limits | None) -> dict[str, Any]:
    """What changes the prepared output besides the files and tokenizers (compared for the no-op)."""
    return {
        "task": task.name,
        "format": source.format,
        "fields": list(source.fields),
        "columns": list(source.resolved_columns),
        "documents": source.documents,
        "on_bad_line": source.on_bad_line,
        "max_length": limits.max_length if limits is not None else None,
        "too_long": limits.too_long if limits is not None else None,
    }


def _fingerprints(task: Task, tokenizers: Tokenizers) -> dict[str, str]:
    return {
        side: fingerprint
        for side in task.sides
        if (fingerprint := task.fingerprint(side, tokenizers)) is not None
    }


def check_prepared(task: Task, data: PreparedData, tokenizers: Tokenizers, *, where: str) -> None:
    """Refuse a prepared folder that lacks the task's sides or was made by another tokenizer, naming it."""
    missing = [side for side in task.sides if side not in data.sides]
    if missing:
        raise DataError(
            f"{where}: {data.path} has sides {', '.join(data.sides)}, not {', '.join(missing)}, which "
            f"{task.name} reads (it was prepared for {data.manifest.task or 'another task'})"
        )
    for side, fingerprint in _fingerprints(task, tokenizers).items():
        made_by = data.side(side).tokenizer
        if made_by is not None and made_by != fingerprint:
            raise DataError(
                f"{where}: {data.path}'s {side} ids were made by another tokenizer ({made_by[:19]}) than this "
                f"run's ({fingerprint[:19]}); give the tokenizer it was prepared with (tokenizer.path, and "
                "for chat the same chat template), or prepare it again"
            )
    task.check_prepared(data, where=where)


# --- zoo data prepare --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Prepared:
    """What `prepare_corpus` did: the folder, its manifest, and whether it wrote it now (False: it was
    already prepared from these very inputs) in how many seconds."""

    out: Path
    manifest: Manifest
    written: bool
    seconds: float


def prepare_corpus(
    task: str | Task,
    inputs: Sequence[str | Path],
    *,
    tokenizer: str | Path | Tokenizer,
    out: str | Path,
    target_tokenizer: str | Path | Tokenizer | None = None,
    format: Format | None = None,
    fields: Sequence[str] | None = None,
    documents: str = "line",
    on_bad_line: OnBadLine = "error",
    max_length: int | None = None,
    too_long: str = "truncate",
    progress: Callable[[int], None] | None = None,
) -> Prepared:
    """Prepare a corpus for ``task`` into ``out`` (what ``zoo data prepare`` runs).

    ``inputs``: the files, read as the task reads a config's split unless ``format`` says otherwise
    (tsv, aligned, text, jsonl, parquet, arrow); ``fields``: where each of the task's fields comes from (a
    tsv column index, a JSON key, a column name), in the task's order. ``tokenizer``: the shared one, or the
    source side's with ``target_tokenizer``. ``max_length``: cut examples to this many framed tokens as
    ``too_long`` says (default: not cut). A second call with the same inputs and settings writes nothing.
    """
    task = get_task(task) if isinstance(task, str) else task
    if not task.reads_text:
        raise ValueError(
            f"{task.name} reads no text: zoo data prepare tokenizes corpora; zoo train prepares image data itself "
            "(an image folder is resized to the model's size)"
        )
    shared = _tokenizer(tokenizer)
    target = _tokenizer(target_tokenizer) if target_tokenizer is not None else None
    tokenizers = Tokenizers(
        task.frame_tokenizer(target or shared), source=task.frame_tokenizer(shared) if target else None
    )
    source = corpus_source(
        task, inputs, format=format, fields=fields, documents=documents, on_bad_line=on_bad_line
    )
    limits = Limits(max_length, too_long) if max_length is not None else None  # type: ignore[arg-type]
    started = time.perf_counter()
    done = _prepare(task, source, tokenizers, limits=limits, out=Path(out), progress=progress)
    if done.encoded and done.cuts is not None:
        done.cuts.report(str(out), kept=done.manifest.num_examples)
    return Prepared(Path(out), done.manifest, done.encoded, time.perf_counter() - started)


def corpus_source(
    task: Task,
    inputs: Sequence[str | Path],
    *,
    format: Format | None,
    fields: Sequence[str] | None,
    documents: str = "line",
    on_bad_line: OnBadLine = "error",
) -> Source:
    """How ``inputs`` are read for ``task``: as a config's split (one file, or a source and a target file)
    unless ``format`` is given, then as that format with ``fields`` naming the task's fields' columns."""
    paths = tuple(Path(p) for p in inputs)
    if not paths:
        raise ValueError("no input files")
    if format is None and fields is None and documents == "line":
        if len(paths) == 1:
            return _with_bad_lines(task.source(paths[0]), on_bad_line)
        if len(paths) == 2 and "source" in task.fields:
            return _with_bad_lines(task.source(ParallelFiles(source=paths[0], target=paths[1])), on_bad_line)
    if format is None:
        format = task.source(paths[0]).format
    columns: tuple[int | str, ...] | None = None
    if fields is not None:
        if len(fields) != len(task.fields):
            raise ValueError(
                f"--fields names {len(fields)} columns; {task.name} reads {len(task.fields)} "
                f"({', '.join(task.fields)}), in that order"
            )
        columns = tuple(int(f) if format == "tsv" else f for f in fields)
    return Source(
        format,
        paths,
        fields=task.fields,
        columns=None if format == "aligned" else columns,
        documents=documents,  # type: ignore[arg-type]
        on_bad_line=on_bad_line,
    )


def _with_bad_lines(source: Source, on_bad_line: OnBadLine) -> Source:
    return replace(source, on_bad_line=on_bad_line)


def _tokenizer(value: str | Path | Tokenizer) -> Tokenizer:
    return value if isinstance(value, Tokenizer) else Tokenizer.from_file(value)
