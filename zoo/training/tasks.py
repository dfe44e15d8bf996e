"""What differs between training tasks, looked up by task name, so setup and the loop hold no task branches.

    language modelling and translation   `zoo.training.data` (text), `zoo.training.batching.Collator`
    sequence / token classification      `zoo.training.labelled` (text), `zoo.training.classification`
                                         (labels, the head, batches, accuracy)

Every task's batch has ``targets`` aligned with the logits its model returns (`Batch.logits_mask`), so
one loss serves them all.
"""

from __future__ import annotations

from typing import Any

from zoo.io.tokenizer import Tokenizer
from zoo.spec import EncoderSpec, ModelSpec
from zoo.spec.model import SequenceClassifierSpec
from zoo.training.batching import Collator
from zoo.training.classification import (
    HEAD_OF_TASK,
    ClassificationCollator,
    ClassificationMetric,
    LabelledExamples,
    encode_labelled,
)
from zoo.training.config import DataFiles, ParallelFiles, Task
from zoo.training.data import (
    DataError,
    EncodedExamples,
    TextExamples,
    TooLong,
    encode_examples,
    read_examples,
)
from zoo.training.labelled import LabelledText, read_labelled

CLASSIFICATION = frozenset(HEAD_OF_TASK)


def read_split(files: DataFiles, *, task: Task) -> TextExamples:
    """Read and check one split of ``task``'s data."""
    if task not in CLASSIFICATION:
        return read_examples(files, task=task)
    if isinstance(files, ParallelFiles):
        raise DataError(f"{task} reads one file per split, not {{source, target}} files")
    return read_labelled(files, task=task)


def encode_split(
    text: TextExamples,
    *,
    task: Task,
    spec: ModelSpec | None,
    target_tokenizer: Tokenizer,
    source_tokenizer: Tokenizer | None,
    max_length: int,
    too_long: TooLong,
) -> EncodedExamples:
    """Token ids (and, for classification, class ids by ``spec``'s label names) of one split."""
    if isinstance(text, LabelledText):
        return encode_labelled(
            text,
            names=label_names(spec),
            tokenizer=target_tokenizer,
            max_length=max_length,
            too_long=too_long,
        )
    return encode_examples(
        text,
        task=task,
        target_tokenizer=target_tokenizer,
        source_tokenizer=source_tokenizer,
        max_length=max_length,
        too_long=too_long,
    )


def make_collator(
    data: EncodedExamples, *, task: Task, pad_id: int, **options: Any
) -> Collator | ClassificationCollator:
    """The collator of ``task``: `Collator` (``options``: its keyword arguments) or, for labelled data,
    `ClassificationCollator`."""
    if isinstance(data, LabelledExamples):
        return ClassificationCollator(data, pad_id=pad_id)
    return Collator(data, task=task, pad_id=pad_id, **options)


def has_unused_parameters(task: Task, spec: ModelSpec) -> bool:
    """Whether the model computes outputs the task's loss never reads, which DDP must be told about:
    BERT's pooler under an MLM head, or under a classifier that does not read it."""
    if task == "masked_lm":
        return True
    heads = spec.heads if isinstance(spec, EncoderSpec) else None
    if heads is None or not heads.pooler:
        return False
    classifier = heads.classifier
    return not (isinstance(classifier, SequenceClassifierSpec) and classifier.pooling == "pooler")


def validation_metric(task: Task, spec: ModelSpec) -> ClassificationMetric | None:
    """A fresh accumulator of ``task``'s validation scores beyond the loss (None: the loss says it all)."""
    if task not in CLASSIFICATION:
        return None
    return ClassificationMetric(label_names(spec), per_token=task == "token_classification")


def label_names(spec: ModelSpec | None) -> tuple[str, ...]:
    """The class names of a classifier spec (set by `zoo.training.classification.with_classifier`)."""
    classifier = spec.heads.classifier if isinstance(spec, EncoderSpec) else None
    assert classifier is not None and classifier.labels is not None, "with_classifier names the labels"
    return classifier.labels
