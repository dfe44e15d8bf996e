"""Sequence and token classification: an encoder with a classifier head, its labels named by the data.

    sequence_classification   ``text<TAB>label`` lines, or JSON lines ``{"text": "...", "label": "pos"}``
    token_classification      JSON lines ``{"tokens": ["Ada", "sings"], "tags": ["B-PER", "O"]}``, or
                              CoNLL-style ``token<TAB>tag`` lines (or space-separated columns, tag last;
                              ``-DOCSTART-`` lines skipped), a blank line between sentences

A file is JSON lines when its name ends in ``.jsonl`` or ``.json``. A label is a non-empty string or an
integer (kept as its decimal string). A bad line is a `DataError` naming the file and line.

Texts are framed as the language-model tasks frame them, ``bos text eos`` (``[CLS] text [SEP]`` with a BERT
tokenizer), so a sequence head reads ``[CLS]``. A word's tag goes on its first sub-word; later sub-words and
special tokens get -100 (not scored), as in transformers' token-classification examples.

Prepared data keeps each split's own label names in its manifest and class ids by them; batches map them
to the model's (`zoo.training.tasks.labels`). The model's names
(``heads.classifier.labels``) are its own when it has them, else the training data's. They are written into
the spec, so a trained model carries them, and `zoo.to_hf` writes them as ``id2label``. A model without a
classifier for the task gets a new one (replacing an MLM head): reading the pooler when it has one, else
the first token; a token classifier drops the pooler, as transformers' ``*ForTokenClassification`` do.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
import torch

from zoo.io.tokenizer import Tokenizer
from zoo.io.tokenizer.lengths import char_budget, cut_words
from zoo.losses import IGNORE_INDEX
from zoo.spec import EncoderSpec, ModelSpec
from zoo.spec.model import SequenceClassifierSpec
from zoo.training.batching import Batch
from zoo.training.config import ConfigError, DataConfig
from zoo.training.data import DataError
from zoo.training.data.shards import PreparedData, SideInfo
from zoo.training.data.sources import Format, OnBadLine, ReadStats, Record, Source, iter_records
from zoo.training.task_settings import SequenceClassificationSettings, TokenClassificationSettings
from zoo.training.tasks.base import (
    Encode,
    Framing,
    LengthCuts,
    Limits,
    Split,
    Task,
    Tokenizers,
    Units,
    cut,
    cut_texts,
    field_text,
    pad,
    raw_ids,
    rows,
)
from zoo.training.tasks.labels import (
    class_ids,
    data_labels,
    label_names,
    new_head,
    quoted,
    sorted_names,
    with_encoder_framing,
)

OUTSIDE = "O"  # the tag of tokens outside any entity (IOB / BIO tagging), left out of the token F1


class Classification(Task):
    """What sequence and token classification share: the head, the labels, framing, the metric."""

    family = "encoder"
    head: ClassVar[Literal["sequence", "token"]]
    labels_side: ClassVar[str]  # the side holding class ids

    # -- the model -------------------------------------------------------------------------------------------

    @classmethod
    def natural_for(cls, spec: ModelSpec) -> bool:
        classifier = spec.heads.classifier if isinstance(spec, EncoderSpec) else None
        return classifier is not None and classifier.task == cls.head

    def spec_overrides(self, overrides: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """Overrides under ``heads.classifier`` wait for the classifier, made from the data; dotted
        (``heads.classifier.pooling``) or nested (``heads: {classifier: {pooling: ...}}``) alike."""
        now: dict[str, Any] = {}
        later: dict[str, Any] = {}
        for key, value in overrides.items():
            if key == "heads.classifier" or key.startswith("heads.classifier."):
                later[key] = value
            elif key == "heads" and isinstance(value, Mapping) and "classifier" in value:
                later["heads.classifier"] = value["classifier"]
                rest = {k: v for k, v in value.items() if k != "classifier"}
                now |= {key: rest} if rest else {}
            else:
                now[key] = value
        return now, later

    def fit_spec(
        self, spec: ModelSpec, *, train: PreparedData, overrides: dict[str, Any], where: str
    ) -> ModelSpec:
        """``spec`` with a classifier for this task whose label names cover the training data.

        An existing classifier for the task keeps its weights' meaning: its names (or, unnamed, the data's
        sorted names, which must be as many) are the class ids. Otherwise a new head is made, then
        ``overrides`` (the config's ``heads.classifier.*``) are applied.
        """
        assert isinstance(spec, EncoderSpec)  # the family was checked first
        head, found = self.head, data_labels(train)
        classifier = spec.heads.classifier
        try:
            if classifier is None or classifier.task != head:
                spec = spec.override(**new_head(spec, head, found))
            spec = spec.override(**overrides) if overrides else spec
        except ValueError as error:  # the config's heads.classifier overrides do not fit
            raise ConfigError(f"{where}: cannot give the model a {head} classifier: {error}") from None
        assert isinstance(spec, EncoderSpec)  # overrides cannot change the family
        classifier = spec.heads.classifier
        if classifier is None or classifier.task != head:
            raise ConfigError(f"{where}: model.overrides remove the {head} classifier the task needs")
        if classifier.labels is None:  # unnamed (a checkpoint's LABEL_0, ...): the data names them
            if len(found) != classifier.num_labels:
                raise ConfigError(
                    f"{where}: the model's classifier has {classifier.num_labels} unnamed labels but the "
                    f"training data has {len(found)} ({quoted(found)}); name them in "
                    "heads.classifier.labels (model.overrides), in class-id order"
                )
            spec = spec.override(**{"heads.classifier.labels": list(found)})
        return spec

    def has_unused_parameters(self, spec: ModelSpec) -> bool:
        """BERT's pooler under a classifier that does not read it."""
        heads = spec.heads if isinstance(spec, EncoderSpec) else None
        if heads is None or not heads.pooler:
            return False
        classifier = heads.classifier
        return not (isinstance(classifier, SequenceClassifierSpec) and classifier.pooling == "pooler")

    # -- tokenizers --------------------------------------------------------------------------------------

    def frame_tokenizer(self, tokenizer: Tokenizer) -> Tokenizer:
        return with_encoder_framing(tokenizer)

    # -- data --------------------------------------------------------------------------------------------

    def check_data(self, data: DataConfig) -> None:
        super().check_data(data)
        self.refuse_parallel_files(
            data, f"data: {self.name} reads one file per split, not {{source, target}} files"
        )

    def check_prepared(self, data: PreparedData, *, where: str) -> None:
        data_labels(data)  # named in the manifest

    def manifest_info(self, records: Callable[[], Iterator[Record]]) -> dict[str, Any]:
        """The data's label names, sorted (one pass over the records before encoding)."""
        found: set[str] = set()
        for record in records():
            value = record.fields[self.labels_side]
            found.update(value if isinstance(value, list) else [value])
        return {"labels": list(sorted_names(found))}

    def side_infos(self, tokenizers: Tokenizers, *, info: Mapping[str, Any]) -> dict[str, SideInfo]:
        sides = super().side_infos(tokenizers, info=info)
        sides[self.labels_side] = self.label_side(len(info["labels"]))
        return sides

    def tokenizer_of(self, side: str, tokenizers: Tokenizers) -> Tokenizer | None:
        return None if side == self.labels_side else tokenizers.target

    def label_side(self, count: int) -> SideInfo:
        """How the labels side stores class ids for ``count`` labels."""
        raise NotImplementedError

    def framed_sides(self, tokenizers: Tokenizers) -> dict[str, int]:
        return {"text": framing(tokenizers).extra}

    def collator(
        self,
        split: Split,
        units: Units,
        *,
        spec: ModelSpec,
        tokenizers: Tokenizers,
        limits: Limits,
    ) -> ClassificationCollator:
        assert spec.pad_token_id is not None  # wire_spec refuses a spec without one
        return ClassificationCollator(
            split,
            units,
            per_token=self.head == "token",
            labels_side=self.labels_side,
            to_class=class_ids(split, label_names(spec)),
            framing=framing(tokenizers),
            pad_id=spec.pad_token_id,
            max_length=limits.max_length,
        )

    # -- metrics -----------------------------------------------------------------------------------------

    def metric(self, spec: ModelSpec) -> ClassificationMetric:
        return ClassificationMetric(label_names(spec), per_token=self.head == "token")


class SequenceClassification(Classification):
    name = "sequence_classification"
    settings_type = SequenceClassificationSettings
    head = "sequence"
    sides: ClassVar[tuple[str, ...]] = ("text", "label")
    fields: ClassVar[tuple[str, ...]] = ("text", "label")
    labels_side = "label"

    def source(self, files: Path | Any, *, on_bad_line: OnBadLine = "error") -> Source:
        kind: Format = "jsonl" if Path(files).suffix in (".jsonl", ".json") else "tsv"
        return Source(kind, (files,), fields=self.fields, on_bad_line=on_bad_line)

    def records(self, source: Source, *, stats: ReadStats | None = None) -> Iterator[Record]:
        for record in iter_records(source, stats=stats):
            label = record.fields["label"]
            if not isinstance(label, str) or not isinstance(record.fields["text"], str):
                raise DataError(
                    f"{record.origin}: expected a text and a label, each a string (or an integer label)"
                )
            record.fields["label"] = label.strip()
            yield record

    def label_side(self, count: int) -> SideInfo:
        return SideInfo(kind="scalar", vocab_size=count)

    def encoder(
        self, tokenizers: Tokenizers, *, cuts: LengthCuts | None, labels: Sequence[str] = ()
    ) -> Encode:
        tokenizer, extra = tokenizers.target, framing(tokenizers).extra
        index = {name: i for i, name in enumerate(labels)}

        def encode(records: list[Record]) -> dict[str, Any]:
            texts, over = cut_texts([field_text(r, "text") for r in records], tokenizer, cuts)
            ids = raw_ids(tokenizer, texts)
            if cuts is not None:
                cuts.apply(records, [(ids, extra)], set(over))
            labels = [
                index[field_text(r, "label")] if row is not None else None for r, row in zip(records, ids)
            ]
            return {"text": ids, "label": labels}

        return encode


class TokenClassification(Classification):
    name = "token_classification"
    settings_type = TokenClassificationSettings
    head = "token"
    sides: ClassVar[tuple[str, ...]] = ("text", "tags")
    fields: ClassVar[tuple[str, ...]] = ("tokens", "tags")
    labels_side = "tags"

    def source(self, files: Path | Any, *, on_bad_line: OnBadLine = "error") -> Source:
        if Path(files).suffix in (".jsonl", ".json"):
            return Source("jsonl", (files,), fields=self.fields, on_bad_line=on_bad_line)
        # CoNLL: a sentence is a blank-line separated block of token lines, parsed by `records`
        return Source("text", (files,), fields=("conll",), documents="blank_line", on_bad_line=on_bad_line)

    def records(self, source: Source, *, stats: ReadStats | None = None) -> Iterator[Record]:
        for record in iter_records(source, stats=stats):
            if "conll" in record.fields:
                yield from _conll_sentences(record)
                continue
            tokens, tags = record.fields["tokens"], record.fields["tags"]
            if not isinstance(tokens, list) or not all(t.strip() for t in tokens):
                raise DataError(
                    f'{record.origin}: expected {{"tokens": [...], "tags": [...]}} with non-empty string tokens'
                )
            if not isinstance(tags, list) or len(tags) != len(tokens):
                count = len(tags) if isinstance(tags, list) else type(tags).__name__
                raise DataError(f"{record.origin}: {len(tokens)} tokens but {count} tags; one tag per token")
            for tag in tags:
                if not tag.strip():
                    raise DataError(
                        f"{record.origin}: a tag must be a non-empty string or an integer, got {tag!r}"
                    )
            yield record

    def tokenizer_lines(self, records: Iterator[Record], *, side: str) -> Iterator[str]:
        for record in records:
            yield " ".join(record.fields["tokens"])

    def label_side(self, count: int) -> SideInfo:
        return SideInfo(kind="sequence", dtype="int16" if count < 2**15 else "int32")

    def encoder(
        self, tokenizers: Tokenizers, *, cuts: LengthCuts | None, labels: Sequence[str] = ()
    ) -> Encode:
        tokenizer, extra = tokenizers.target, framing(tokenizers).extra
        index = {name: i for i, name in enumerate(labels)}

        def encode(records: list[Record]) -> dict[str, Any]:
            words, over = [], []
            for i, record in enumerate(records):
                row = record.fields["tokens"]
                assert isinstance(row, list)  # records() checked
                if cuts is not None:  # whole words, so the tags stay aligned (zoo.io.tokenizer.lengths)
                    row, left_out = cut_words(row, char_budget(tokenizer, cuts.limits.max_length))
                    if left_out:
                        over.append(i)
                words.append(row)
            encodings = tokenizer.encode_words(words)  # the library's errors name the tokenizer file
            ids, tags = [], []
            for encoding, record in zip(encodings, records):
                names, previous, classes = record.fields["tags"], None, list[int]()
                for word in encoding.word_ids:
                    first = word is not None and word != previous
                    classes.append(index[names[word]] if word is not None and first else IGNORE_INDEX)
                    previous = word
                ids.append(encoding.ids)
                tags.append(classes)
            if cuts is not None:
                cuts.apply(records, [(ids, extra), (tags, extra)], set(over))
            return {"text": ids, "tags": tags}

        return encode


def _conll_sentences(record: Record) -> Iterator[Record]:
    """The sentences of one blank-line block of CoNLL lines (``-DOCSTART-`` lines end a sentence too)."""
    words: list[str] = []
    tags: list[str] = []
    start = record.line
    text = record.fields["conll"]
    assert isinstance(text, str)
    for k, line in enumerate(text.split("\n")):
        number = record.line + k
        if line.startswith("-DOCSTART-"):
            if words:
                yield Record(record.path, start, {"tokens": words, "tags": tags})
            words, tags = [], []
            continue
        fields = line.split("\t") if "\t" in line else line.split()
        if len(fields) < 2 or not fields[0].strip() or not fields[-1].strip():
            raise DataError(f"{record.path}:{number}: expected 'token<TAB>tag', found {line[:60]!r}")
        start = start if words else number
        words.append(fields[0].strip())
        tags.append(fields[-1].strip())
    if words:
        yield Record(record.path, start, {"tokens": words, "tags": tags})


# --- framing and batches ---------------------------------------------------------------------------------


def framing(tokenizers: Tokenizers) -> Framing:
    """``bos text eos`` with the tokenizer's special tokens (``[CLS] text [SEP]``)."""
    return Framing(bos=tokenizers.target.bos_id, eos=tokenizers.target.eos_id)


class ClassificationCollator:
    """Units -> a `Batch`: right-padded ids and mask, and targets (B,) (sequence) or (B, T) (token, -100
    where not scored), in the model's class ids."""

    def __init__(
        self,
        split: Split,
        units: Units,
        *,
        per_token: bool,
        labels_side: str,
        to_class: np.ndarray,
        framing: Framing,
        pad_id: int,
        max_length: int,
    ) -> None:
        self.data, self.units, self.per_token, self.side = split.data, units, per_token, labels_side
        self.to_class, self.framing, self.pad_id, self.max_length = to_class, framing, pad_id, max_length

    def __call__(self, units: np.ndarray, *, generator: torch.Generator | None = None) -> Batch:
        examples = self.units.example_indices(units)
        texts = [self.framing(ids, self.max_length) for ids in rows(self.data, examples, "text")]
        input_ids, attention_mask = pad(texts, self.pad_id)  # (B, T)
        if self.per_token:
            edge = Framing(
                bos=IGNORE_INDEX if self.framing.bos is not None else None,
                eos=IGNORE_INDEX if self.framing.eos is not None else None,
            )
            tags = [
                self._classes(np.asarray(row, dtype=np.int64))
                for row in self.data.read_rows(examples, self.side)
            ]
            targets, _ = pad([cut(edge(row), self.max_length) for row in tags], IGNORE_INDEX)  # (B, T)
        else:
            targets = torch.from_numpy(self.to_class[self.data.values(self.side)[examples]])  # (B,)
        inputs = {"input_ids": input_ids, "attention_mask": attention_mask}
        return Batch(inputs, targets, int(attention_mask.sum()))

    def _classes(self, row: np.ndarray) -> list[int]:
        scored = row != IGNORE_INDEX
        return np.where(scored, self.to_class[np.where(scored, row, 0)], IGNORE_INDEX).tolist()


class ClassificationMetric:
    """Accuracy over the scored rows (sequences or tokens) and, for tags with an outside label ``O``, the
    token-level micro F1 of the other labels: 2·TP / (predicted non-O + gold non-O). Not entity-level
    (seqeval's) F1, which scores whole spans. Counts stay on the device until `compute`."""

    def __init__(self, names: Sequence[str], *, per_token: bool) -> None:
        self.outside = names.index(OUTSIDE) if per_token and OUTSIDE in names else None
        self.counts: torch.Tensor | None = None  # correct, total, true positives, predicted, gold

    def update(self, logits: torch.Tensor, targets: torch.Tensor) -> None:
        """logits (N, L) and targets (N,) aligned row by row, -100 = not scored."""
        scored = targets != IGNORE_INDEX
        predicted, gold = logits.argmax(dim=-1)[scored], targets[scored]  # (M,), (M,)
        counts = [(predicted == gold).sum(), gold.new_tensor(gold.numel())]
        if self.outside is not None:
            inside_pred, inside_gold = predicted != self.outside, gold != self.outside
            counts += [((predicted == gold) & inside_gold).sum(), inside_pred.sum(), inside_gold.sum()]
        batch = torch.stack(counts)
        self.counts = batch if self.counts is None else self.counts + batch

    def compute(self) -> dict[str, float]:
        """``val_accuracy`` (and ``val_f1`` for tags with an ``O``), from every update since construction."""
        if self.counts is None:
            return {}
        counts = self.counts.tolist()  # the one host read of an evaluation
        scores = {"val_accuracy": counts[0] / max(counts[1], 1)}
        if self.outside is not None:
            scores["val_f1"] = 2 * counts[2] / max(counts[3] + counts[4], 1)
        return scores
