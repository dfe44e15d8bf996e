"""The task protocol, and what every task shares: framing, cutting to length, padding, the batch.

A task is one object (`Task`), built with its own settings (``settings``: the config's ``task``,
`zoo.training.task_settings`) and ``packing`` (``data.packing``, which the language-model tasks and chat
read), that answers everything setup and the loop need to know about it; its hooks are given the run's
pieces they need (tokenizers, the spec, a split), never the whole config:

    the model      ``family``; `Task.check_model` (the heads it needs); `Task.natural_for` (the default
                   task of a model); `Task.spec_overrides` and `Task.fit_spec` (a classifier's head)
    tokenizers     `Task.separate_vocabularies`, `Task.tokenizer_lines`, `Task.frame_tokenizer`,
                   `Task.missing_tokens`
    data           ``sides`` (the token arrays of its prepared data); `Task.check_data`; `Task.source` (how
                   a raw split is read); `Task.encoder` (records -> raw token ids per side, cut to length);
                   `Task.units` (what batches are planned from: examples, or packed windows);
                   `Task.collator` (units -> one `Batch`)
    loss, metrics  `Task.objective` (what each batch's loss is: token cross-entropy, or DPO's),
                   `Task.label_smoothing`, `Task.chunk_tokens`, `Task.metric` (accuracy), `Task.scores` (BLEU),
                   `Task.has_unused_parameters`

Prepared data holds raw token ids, without special tokens: a task frames them (``bos ids eos``, or
``ids eos``) when it collates a batch, and cuts each framed sequence to the length limit keeping its
closing token. Every batch has ``targets`` aligned with the logits its model returns
(`Batch.logits_mask`), so one loss serves every token-level task; a task with another loss (DPO) returns
its own `Task.objective`.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol

import numpy as np
import torch

from zoo.io.tokenizer import Tokenizer
from zoo.io.tokenizer.lengths import char_budget, cut_before_encoding
from zoo.losses.chunked import auto_chunk_tokens
from zoo.spec import DecoderSpec, ModelSpec
from zoo.training.batching import Batch
from zoo.training.config import ConfigError, DataConfig, PackingConfig, ParallelFiles, TokenizerConfig
from zoo.training.data import DataError
from zoo.training.data.prepare import tokenizer_fingerprint
from zoo.training.data.shards import PreparedData, SideInfo
from zoo.training.data.sources import OnBadLine, ReadStats, Record, Source, iter_records
from zoo.training.evaluate import ScoreAccumulator
from zoo.training.objectives import Objective, TokenCrossEntropy
from zoo.training.task_settings import TaskSettings

if TYPE_CHECKING:
    from zoo.models.base import ZooModel

log = logging.getLogger(__name__)

TooLong = Literal["truncate", "skip", "error"]
Family = Literal["encoder-decoder", "decoder", "encoder"]
Encode = Callable[[list[Record]], dict[str, Any]]  # side -> one row per record (None: dropped)


# --- what tasks are given and give back ---------------------------------------------------------------


@dataclass
class Tokenizers:
    text: Tokenizer | None  # the shared one, or the target side; None: a task that reads no text (images)
    source: Tokenizer | None = None  # only with separate vocabularies
    trained: bool = False  # zoo trained them for this run (so their special ids define the spec's)

    @property
    def target(self) -> Tokenizer:
        """The shared (or target) tokenizer; a `ConfigError` for a run without one (`Task.reads_text`)."""
        if self.text is None:
            raise ConfigError("this task reads no text: the run has no tokenizer")
        return self.text

    @target.setter
    def target(self, tokenizer: Tokenizer) -> None:
        self.text = tokenizer

    @property
    def for_source(self) -> Tokenizer:
        return self.source or self.target


class Collate(Protocol):
    """Units of a split (example or window indices) -> one `Batch`; ``generator`` draws anything random
    (MLM's masks), so a batch is a function of its units and the generator's seed."""

    def __call__(self, units: np.ndarray, *, generator: torch.Generator | None = None) -> Batch: ...


@dataclass(frozen=True)
class Split:
    """One split of prepared data, as a task trains on it."""

    name: str  # "train" or "valid", for messages
    data: PreparedData
    raw: Source | None = None  # the raw files it was prepared from (None: a prepared folder was given)

    @property
    def where(self) -> str:
        """The split's files, for messages."""
        if self.raw is not None:
            return ", ".join(str(p) for p in self.raw.paths)
        return str(self.data.path)


@dataclass(frozen=True)
class Units:
    """What a split's batches are planned from: unit ``u`` costs ``lengths[u]`` padded tokens (per side
    that batches pad separately: (U, sides)); ``examples[u]`` is its example (None: unit u is example u)."""

    lengths: np.ndarray  # (U,) or (U, sides) int
    examples: np.ndarray | None = None  # (U,) int64
    name: Callable[[int], str] | None = None  # unit -> "file:line" (or "folder: window 3"), for messages

    def __len__(self) -> int:
        return len(self.lengths)

    def describe(self, unit: int) -> str:
        """Unit ``unit`` for a message."""
        return self.name(unit) if self.name is not None else f"unit {unit}"

    def example_indices(self, units: np.ndarray) -> np.ndarray:
        """The examples of ``units``."""
        return units if self.examples is None else self.examples[units]


@dataclass(frozen=True)
class Limits:
    """The length limit a run cuts sequences to: ``max_length`` framed tokens per side, and what to do
    with a longer one (``data.too_long``)."""

    max_length: int
    too_long: TooLong = "truncate"


# --- the protocol ----------------------------------------------------------------------------------------


class Task(ABC):
    """One training task. Subclasses set the class attributes and implement the abstract methods; the
    defaults fit the tasks that have no opinion (no head to add, nothing unused, no extra scores)."""

    name: ClassVar[str]  # the config's ``task`` (its settings' ``kind``)
    settings_type: ClassVar[type[TaskSettings]]  # what the config's ``task: {kind: name, ...}`` becomes
    family: ClassVar[Family]  # the model family it trains
    sides: ClassVar[tuple[str, ...]]  # the token arrays of its prepared data, e.g. ("source", "target")
    fields: ClassVar[tuple[str, ...]]  # the record fields its raw data has, e.g. ("source", "target")
    packs: ClassVar[bool] = False  # whether it reads ``data.packing`` (documents packed into windows)
    reads_text: ClassVar[bool] = True  # False (images): setup loads, trains and wires no tokenizer
    chunks_loss: ClassVar[bool] = False  # its loss reads a decoder's LM head at the scored tokens only

    def __init__(self, settings: TaskSettings | None = None, *, packing: PackingConfig | None = None) -> None:
        """The task with its ``settings`` (default: all at their defaults) and ``data.packing``; packing
        for a task that does not pack is a `ConfigError`."""
        settings = settings if settings is not None else self.settings_type(kind=self.name)
        if not isinstance(settings, self.settings_type):
            raise TypeError(
                f"task {self.name} takes {self.settings_type.__name__}, not {type(settings).__name__}"
            )
        if packing is not None and not self.packs:
            raise ConfigError(f"data.packing is for causal_lm, masked_lm, chat and seq2seq, not {self.name}")
        self.settings: TaskSettings = settings
        self.packing = packing

    # -- the model -------------------------------------------------------------------------------------------

    @classmethod
    def natural_for(cls, spec: ModelSpec) -> bool:
        """Whether this is the task a model trains on when the config names none: its family's."""
        return spec.family == cls.family

    def check_model(self, spec: ModelSpec, *, where: str) -> None:
        """Refuse a model this task cannot train (the family is checked before): a `ConfigError`."""
        return None  # every model of the family will do

    def spec_overrides(self, overrides: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """(``model.overrides`` to apply to the spec now, those that wait for `fit_spec`)."""
        return overrides, {}

    def fit_spec(
        self, spec: ModelSpec, *, train: PreparedData, overrides: dict[str, Any], where: str
    ) -> ModelSpec:
        """The spec fitted to the training data once it is prepared (a classifier's labels); ``overrides``
        are those `spec_overrides` held back."""
        return spec

    def started_from(self, folder: Path | None) -> None:
        """Told the folder the run's weights start from (``model.init_from``; None: the seed's), before
        `objective`: a task that reads more of it than the weights (contrastive: the pooling) reads it here."""
        return None

    def save_final(self, output_dir: Path, tokenizers: Tokenizers) -> Path | None:
        """After the trained model is saved in ``output_dir`` (rank 0): write any further form of it the task
        promises (contrastive: a sentence-transformers folder), returning its path; None: nothing more."""
        return None

    def has_unused_parameters(self, spec: ModelSpec) -> bool:
        """Whether the model computes outputs this task's loss never reads, which DDP must be told about."""
        return False

    # -- tokenizers --------------------------------------------------------------------------------------

    def separate_vocabularies(self, tokenizer: TokenizerConfig) -> bool:
        """Whether the source side gets its own tokenizer (and embedding), as ``tokenizer`` says; a task with
        no source side refuses ``shared: false`` rather than ignore it."""
        if not tokenizer.shared:
            raise ConfigError(
                f"tokenizer.shared: false needs a task with a source side (seq2seq); {self.name} reads one "
                "vocabulary: leave tokenizer.shared at true"
            )
        return False

    def tokenizer_lines(self, records: Iterator[Record], *, side: str) -> Iterator[str]:
        """Text to train a tokenizer on from raw records: ``side`` "source", "target" or "both"."""
        for record in records:
            for name in self.fields:
                value = record.fields[name]
                yield " ".join(value) if isinstance(value, list) else value

    def frame_tokenizer(self, tokenizer: Tokenizer) -> Tokenizer:
        """The tokenizer as this task's model reads it (a classifier's gets ``bos text eos`` framing)."""
        return tokenizer

    def missing_tokens(self, spec: ModelSpec, tokenizers: Tokenizers) -> list[str]:
        """What the tokenizer / spec lacks that this task needs, each as "a pad token (why)"."""
        return [] if spec.pad_token_id is not None else ["a pad token (batches are padded)"]

    # -- data --------------------------------------------------------------------------------------------

    def check_data(self, data: DataConfig) -> None:
        """Refuse data settings this task cannot use (a `ConfigError` naming the field); packing is refused
        when the task is built."""
        return None

    @staticmethod
    def refuse_parallel_files(data: DataConfig, message: str) -> None:
        """For the tasks that read one file per split: a `ConfigError` with ``message`` when a split is
        given as {source, target} files."""
        if any(isinstance(split, ParallelFiles) for split in (data.train, data.valid)):
            raise ConfigError(message)

    @abstractmethod
    def source(self, files: Path | Any, *, on_bad_line: OnBadLine = "error") -> Source:
        """How a raw split given in the config (a path, or {source, target} files) is read."""

    def records(self, source: Source, *, stats: ReadStats | None = None) -> Iterator[Record]:
        """The raw split's records, checked as this task needs them (a `DataError` names the line);
        ``stats`` counts the bad lines a ``skip`` source passes over."""
        return iter_records(source, stats=stats)

    def side_infos(self, tokenizers: Tokenizers, *, info: Mapping[str, Any]) -> dict[str, SideInfo]:
        """What each side of the prepared data holds: token ids of the side's tokenizer by default
        (``info``: what `manifest_info` found, a classifier's labels)."""
        return {
            side: SideInfo(vocab_size=tok.vocab_size, tokenizer=self.fingerprint(side, tokenizers))
            for side in self.sides
            if (tok := self.tokenizer_of(side, tokenizers)) is not None
        }

    def tokenizer_of(self, side: str, tokenizers: Tokenizers) -> Tokenizer | None:
        """The tokenizer that encodes ``side`` (None: the side holds no token ids, a classifier's labels)."""
        return tokenizers.for_source if side == "source" else tokenizers.target

    def fingerprint(self, side: str, tokenizers: Tokenizers) -> str | None:
        """What made ``side``'s ids, recorded in the manifest, checked against a prepared folder and part of
        the cache key: its tokenizer's fingerprint (None: no tokenizer made them). A task whose ids depend on
        more than the tokenizer (chat's template) adds that."""
        tok = self.tokenizer_of(side, tokenizers)
        return tokenizer_fingerprint(tok) if tok is not None else None

    @abstractmethod
    def encoder(
        self, tokenizers: Tokenizers, *, cuts: LengthCuts | None, labels: Sequence[str] = ()
    ) -> Encode:
        """Records -> raw token ids per side (no special tokens); with ``cuts``, each example cut to its
        limit (framing included), dropped or refused as it says, and counted there. ``labels``: a
        classifier's label names, in class-id order."""

    def check_prepared(self, data: PreparedData, *, where: str) -> None:
        """Refuse a prepared folder this task cannot read beyond its sides (checked before), naming it."""
        return None  # its sides are all it reads

    def manifest_info(self, records: Callable[[], Iterator[Record]]) -> dict[str, Any]:
        """What the task writes into the manifest beyond the tokens (a classifier's label names): computed
        from a fresh pass over the records when needed."""
        return {}

    def units(self, split: Split, *, tokenizers: Tokenizers, limits: Limits) -> Units:
        """What the split's batches are planned from: one unit per example by default, costing its framed
        length on each side that batches pad (`example_units`)."""
        return example_units(split, self.framed_sides(tokenizers), limits=limits)

    @abstractmethod
    def framed_sides(self, tokenizers: Tokenizers) -> dict[str, int]:
        """The sides batches pad, each with the special tokens framing adds to it."""

    @abstractmethod
    def collator(
        self,
        split: Split,
        units: Units,
        *,
        spec: ModelSpec,
        tokenizers: Tokenizers,
        limits: Limits,
    ) -> Collate:
        """Units of ``split`` (as `units` planned them) -> batches for ``spec``'s model."""

    # -- loss and metrics --------------------------------------------------------------------------------

    def label_smoothing(self, eps: float | None) -> float:
        """The training loss's label smoothing: ``eps`` (``loss.label_smoothing``), else this task's
        default (0)."""
        return eps if eps is not None else 0.0

    def chunk_tokens(self, setting: int | Literal["auto"] | None, spec: ModelSpec) -> int | None:
        """Tokens per chunk of the loss through the LM head (``loss.chunk_tokens``, `zoo.losses.chunked`),
        or None: all logits at once. A task whose loss reads a decoder's LM head at the scored tokens
        (``chunks_loss``) takes a number, or ``auto`` (the default): `auto_chunk_tokens` of the vocabulary; any other task
        computes its loss whole, and refuses a number (a `ConfigError`)."""
        if setting is None:
            return None
        if not (self.chunks_loss and isinstance(spec, DecoderSpec) and spec.lm_head is not None):
            if setting == "auto":
                return None
            raise ConfigError(
                f"loss.chunk_tokens ({setting}) is for causal_lm, chat and dpo on a decoder with an LM head, "
                f"not {self.name}: leave it at auto or null"
            )
        return auto_chunk_tokens(spec.vocab_size) if setting == "auto" else setting

    def objective(
        self,
        spec: ModelSpec,
        *,
        label_smoothing: float | None,
        model: ZooModel,
        starting_model: Callable[[], ZooModel],
        chunk_tokens: int | None = None,
    ) -> Objective:
        """What the loop and validation compute on each batch (`zoo.training.objectives`): token
        cross-entropy, label-smoothed as `label_smoothing` says of ``label_smoothing``
        (``loss.label_smoothing``), by default. ``model`` is the model being trained (its adapters added,
        for LoRA); ``starting_model()`` builds a new one holding the weights the run started from
        (``model.init_from``'s, or the seed's), for an objective that needs them; ``chunk_tokens``: as
        `chunk_tokens` resolved ``loss.chunk_tokens``."""
        return TokenCrossEntropy(
            label_smoothing=self.label_smoothing(label_smoothing), chunk_tokens=chunk_tokens
        )

    def metric(self, spec: ModelSpec) -> ScoreAccumulator | None:
        """A fresh accumulator of validation scores beyond the loss (None: the loss says it all)."""
        return None

    def scores(
        self,
        model: ZooModel,
        split: Split,
        *,
        tokenizers: Tokenizers,
        autocast: AbstractContextManager,
    ) -> dict[str, Any]:
        """Validation scores computed by running the model beyond the loss (translation's BLEU)."""
        return {}


# --- shared helpers ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Framing:
    """The special tokens around one side's raw ids: ``bos ids eos``, with those that exist."""

    bos: int | None = None
    eos: int | None = None

    @property
    def extra(self) -> int:
        """Special tokens framing adds."""
        return (self.bos is not None) + (self.eos is not None)

    def __call__(self, ids: Sequence[int], limit: int | None = None) -> list[int]:
        """``ids`` framed, cut to ``limit`` tokens keeping the closing token (`cut`)."""
        framed = [
            *([self.bos] if self.bos is not None else []),
            *ids,
            *([self.eos] if self.eos is not None else []),
        ]
        return cut(framed, limit) if limit is not None else framed


def cut(ids: list[int], limit: int) -> list[int]:
    """``ids`` cut to ``limit`` tokens, keeping the closing special token (eos / [SEP]): the model still
    learns where sequences end."""
    return ids if len(ids) <= limit else [*ids[: limit - 1], ids[-1]]


def pad(sequences: Sequence[Sequence[int] | np.ndarray], value: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad to the longest: (B, L) ids and the (B, L) 1/0 mask."""
    width = max(map(len, sequences))
    ids = torch.full((len(sequences), width), value, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, seq in enumerate(sequences):
        ids[row, : len(seq)] = torch.as_tensor(seq, dtype=torch.long)
        mask[row, : len(seq)] = 1
    return ids, mask


def rows(data: PreparedData, examples: np.ndarray, side: str) -> list[list[int]]:
    """The raw token ids of ``examples`` on one side, as lists, read from the files (not mapped:
    `PreparedData.read_rows`, so a run's memory does not grow with the corpus it goes through)."""
    return [row.tolist() for row in data.read_rows(examples, side)]


@dataclass
class LengthCuts:
    """Examples over the length limit, decided as they are encoded: cut (``truncate``), dropped (``skip``)
    or refused (``error``, a `DataError` naming the line). A truncated example left with nothing to train
    (a chat conversation whose answers all fall past the cut, a DPO pair whose prompt fills the limit) is
    dropped too, counted in ``hollow``. `report` logs the counts once."""

    limits: Limits
    total: int = 0
    cut: int = 0
    first: str | None = None  # origin of the first example cut
    hollow: int = 0  # of those cut, dropped: nothing left to train
    first_hollow: str | None = None

    def apply(
        self,
        records: Sequence[Record],
        sides: Sequence[tuple[list[Any], int]],
        over: set[int],
        *,
        trains: Callable[[int], bool] | None = None,
    ) -> None:
        """Decide every record of a chunk. ``sides``: (raw ids per record, framing's extra tokens) for
        each side; ``over``: the records cut before encoding (certainly too long). Cuts the ids in place;
        a dropped record's row becomes None on every side (`zoo.training.data.prepare` drops it).
        ``trains(i)``: whether truncated record ``i`` (its rows cut) still has something to train."""
        limit, too_long = self.limits.max_length, self.limits.too_long
        for i, record in enumerate(records):
            self.total += 1
            longest = max(len(ids[i]) + extra for ids, extra in sides)
            if i not in over and longest <= limit:
                continue
            if too_long == "error":
                found = (
                    f"{max(_chars(record)):,} characters, more than the limit of {limit} tokens can cover"
                    if i in over
                    else f"{longest} tokens, more than the limit of {limit}"
                )
                raise DataError(
                    f"{record.origin}: {found} (data.max_length or the model's max_positions); set "
                    "data.too_long to truncate or skip"
                )
            self.cut += 1
            self.first = self.first or record.origin
            for ids, extra in sides:
                if too_long == "skip":
                    ids[i] = None
                elif len(ids[i]) + extra > limit:
                    ids[i] = ids[i][: limit - extra]  # framing's closing token then ends it
            if too_long == "truncate" and trains is not None and not trains(i):
                self.hollow += 1
                self.first_hollow = self.first_hollow or record.origin
                for ids, _ in sides:
                    ids[i] = None

    def counts(self) -> dict[str, int]:
        """For the manifest: how many examples were cut (and how), and how many of them were dropped with
        nothing left to train."""
        return {"over_max_length": self.cut, "nothing_to_train": self.hollow}

    def report(self, where: str, *, kept: int) -> None:
        """Log how many examples were truncated or skipped; refuse a split that keeps none of them."""
        if self.cut:
            action = "truncated" if self.limits.too_long == "truncate" else "skipped"
            first = f" (first: {self.first})" if self.first else ""
            log.warning(
                "%d of %d examples are longer than %d tokens and were %s%s",
                self.cut, self.total, self.limits.max_length, action, first,
            )  # fmt: skip
        if self.hollow:
            first = f" (first: {self.first_hollow})" if self.first_hollow else ""
            log.warning(
                "%d of them left nothing to train within the limit (every answer, or the responses, past the "
                "cut) and were skipped%s",
                self.hollow, first,
            )  # fmt: skip
        if self.total and not kept:
            hollow = " or left nothing to train within them" if self.hollow else ""
            raise DataError(f"{where}: every example is longer than {self.limits.max_length} tokens{hollow}")


def _chars(record: Record) -> list[int]:
    return [sum(map(len, v)) if isinstance(v, list) else len(v) for v in record.fields.values()]


def raw_ids(tokenizer: Tokenizer, texts: list[str]) -> list[list[int]]:
    """Token ids of ``texts``, no special tokens, encoded in parallel by the Rust backend (without the
    character offsets where the library can skip them)."""
    return tokenizer.encode_ids(texts)  # the library's errors name the tokenizer file (io.tokenizer.errors)


def cut_texts(texts: list[str], tokenizer: Tokenizer, cuts: LengthCuts | None) -> tuple[list[str], list[int]]:
    """Texts longer than the limit can cover cut before encoding (`zoo.io.tokenizer.lengths`), and the
    indices of those cut."""
    if cuts is None:
        return texts, []
    return cut_before_encoding(texts, char_budget(tokenizer, cuts.limits.max_length))


LENGTH_CHUNK = 1 << 18  # examples per pass over the offsets: bounded temporaries, whatever the corpus
ROWS_CHUNK = 1 << 10  # examples whose rows are read at once to see what a cut leaves them to train


def example_units(
    split: Split,
    sides: dict[str, int],
    *,
    limits: Limits,
    trains: Callable[[np.ndarray], np.ndarray] | None = None,
) -> Units:
    """One unit per example, costing its framed length per side (side -> framing's extra tokens), cut to the
    limit, in the narrowest integer type that holds it (2 bytes per example and side below 65,536 tokens).
    Prepared data cut to a longer limit (or none) is cut here as ``data.too_long`` says: truncated (by the
    collator), skipped, or refused naming the first example over it. The offsets are read in chunks, never
    held whole. ``trains``: as `measured_units`'s."""
    data = split.data

    def measure(start: int, stop: int) -> np.ndarray:
        columns = [data.read_lengths(side, start, stop) + extra for side, extra in sides.items()]
        return np.stack(columns, axis=1)  # (n, sides)

    return measured_units(split, measure, columns=len(sides), limits=limits, trains=trains)


def measured_units(
    split: Split,
    measure: Callable[[int, int], np.ndarray],
    *,
    columns: int,
    limits: Limits,
    trains: Callable[[np.ndarray], np.ndarray] | None = None,
) -> Units:
    """`example_units` with the lengths a task computes: ``measure(start, stop)`` gives examples
    ``start:stop``'s (n, columns) framed lengths (a DPO pair's longest sequence, say). ``trains(examples)``:
    (n,) bool, whether each of these examples, truncated to the limit, still has something to train; those
    that have not are skipped and counted (`LengthCuts`)."""
    data, limit = split.data, limits.max_length
    n = data.num_examples
    table = np.empty((n, columns), dtype=np.uint16 if limit < 1 << 16 else np.int32)  # (N, columns)
    over = np.zeros(n, dtype=bool)
    for start in range(0, n, LENGTH_CHUNK):
        stop = min(start + LENGTH_CHUNK, n)
        lengths = measure(start, stop)  # (n, columns)
        longer = lengths > limit
        if limits.too_long == "error" and longer.any():
            row = int(np.argmax(longer.any(axis=1)))
            raise DataError(
                f"{data.origin(start + row)}: {int(lengths[row].max())} tokens, more than the limit of {limit} "
                "(data.max_length or the model's max_positions); set data.too_long to truncate or skip"
            )
        over[start:stop] = longer.any(axis=1)
        table[start:stop] = np.minimum(lengths, limit)
    cut = np.flatnonzero(over)
    if not len(cut):
        return Units(table, name=lambda u: data.origin(u))
    report = LengthCuts(limits, total=n, cut=len(cut), first=data.origin(int(cut[0])))
    dropped = over
    if limits.too_long == "truncate":  # the collator cuts them; those left with nothing to train are dropped
        hollow = _untrained(cut, trains) if trains is not None else cut[:0]
        report.hollow = len(hollow)
        report.first_hollow = data.origin(int(hollow[0])) if len(hollow) else None
        dropped = np.zeros(n, dtype=bool)
        dropped[hollow] = True
    keep = np.flatnonzero(~dropped)
    report.report(split.where, kept=len(keep))
    if len(keep) == n:
        return Units(table, name=lambda u: data.origin(u))
    return Units(table[keep], keep, name=lambda u: data.origin(int(keep[u])))


def _untrained(examples: np.ndarray, trains: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """The ``examples`` that ``trains`` says keep nothing to train, asked a chunk at a time (a reader of
    their rows holds no more than a chunk's)."""
    parts = [examples[i : i + ROWS_CHUNK] for i in range(0, len(examples), ROWS_CHUNK)]
    return np.concatenate([part[~trains(part)] for part in parts]) if parts else examples


def field_text(record: Record, name: str) -> str:
    """A text field of ``record`` (a `DataError` naming the line when it holds a list)."""
    value = record.fields[name]
    if not isinstance(value, str):
        raise DataError(f"{record.origin}: {name} must be text, found a list")
    return value
