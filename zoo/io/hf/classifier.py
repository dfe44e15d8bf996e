"""Classification heads in Hugging Face configs: which head a checkpoint has, and its config fields both ways.

transformers keeps a classifier's settings in the config every model shares (``PretrainedConfig``):

    id2label / label2id   the class names; unnamed classes are LABEL_0, LABEL_1, ... (zoo: ``labels: null``)
    num_labels            not stored: len(id2label), or 2 when a config has no id2label
    problem_type          the sequence loss (null: chosen from the labels at the first forward)
    classifier_dropout    BERT, RoBERTa (null: hidden_dropout_prob); ALBERT's is classifier_dropout_prob

The head class is ``architectures[0]`` (``BertForSequenceClassification``, ``RobertaForTokenClassification``);
a config without it is read from the tensors: a sequence head reads the pooler (BERT, ALBERT) or has its own
``classifier.dense`` (RoBERTa), a token head has neither.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from zoo.io.hf.common import HFError, Rule, architecture, linear
from zoo.spec.model import ImageClassifierSpec, SequenceClassifierSpec, TokenClassifierSpec

Task = Literal["sequence", "token", "image"]
SEQUENCE_TENSORS = ("classifier.weight", "classifier.out_proj.weight")


def classifier_task(
    config: Mapping[str, Any], names: set[str], *, classes: tuple[str, str], pooler: str
) -> Task | None:
    """ "sequence", "token" or None (no classifier): from ``architectures`` when it names one of ``classes``
    (sequence, token), else from the tensors (``pooler``: the pooler's weight, body prefix stripped)."""
    arch = architecture(config)
    if arch in classes:
        return "sequence" if arch == classes[0] else "token"
    if "classifier.out_proj.weight" in names:
        return "sequence"  # RoBERTa's dense head
    if "classifier.weight" in names:
        return "sequence" if pooler in names else "token"
    return None


def classifier_from_hf(
    config: Mapping[str, Any],
    task: Task,
    *,
    pooling: str,
    dropout_key: str = "classifier_dropout",
    absent: float | None = None,
    model_dropout: float | None = None,
) -> dict[str, Any]:
    """The spec's ``heads.classifier`` from config.json.

    ``dropout_key`` holds the classifier dropout (``absent``: its value when missing); null means the
    model's dropout. ALBERT has no null for its sequence head and stores the hidden dropout instead: pass
    that as ``model_dropout``, and that value reads as null too (so the spec round-trips either way).
    """
    id2label = config.get("id2label")
    if id2label is None:
        num_labels = config.get("num_labels", 2)
        if not isinstance(num_labels, int) or num_labels < 1:
            raise HFError(f"config.json num_labels={num_labels!r}: expected a positive integer")
        labels = None
    else:
        labels = _label_names(id2label)
        num_labels = len(labels)
        if labels == tuple(f"LABEL_{i}" for i in range(num_labels)):
            labels = None  # transformers' placeholder names: unnamed
    dropout = config.get(dropout_key, absent)
    spec: dict[str, Any] = {
        "task": task,
        "num_labels": num_labels,
        "labels": labels,
        "dropout": None if model_dropout is not None and dropout == model_dropout else dropout,
    }
    if task in ("sequence", "image"):
        spec |= {"pooling": pooling, "problem_type": config.get("problem_type")}
    # A token head has no problem_type: transformers' token classifiers always use cross-entropy.
    return spec


def classifier_to_hf(
    classifier: SequenceClassifierSpec | TokenClassifierSpec | ImageClassifierSpec,
    *,
    dropout_key: str = "classifier_dropout",
    model_dropout: float | None = None,
) -> dict[str, Any]:
    """config.json fields for ``classifier``: id2label and label2id (always, so num_labels is explicit),
    problem_type and the classifier dropout (a null ``dropout`` is written as ``model_dropout``)."""
    names = classifier.labels or tuple(f"LABEL_{i}" for i in range(classifier.num_labels))
    return {
        "id2label": {str(i): name for i, name in enumerate(names)},
        "label2id": {name: i for i, name in enumerate(names)},
        "problem_type": getattr(classifier, "problem_type", None),
        dropout_key: classifier.dropout if classifier.dropout is not None else model_dropout,
    }


def classifier_rules(
    classifier: SequenceClassifierSpec | TokenClassifierSpec | ImageClassifierSpec | None,
) -> list[Rule]:
    """zoo <-> HF names of a classifier: ``classifier`` (one linear), RoBERTa's ``classifier.dense`` and
    ``classifier.out_proj``, or DistilBERT's ``pre_classifier`` before ``classifier``; the same in every
    BERT-like family."""
    if classifier is None:
        return []
    pooling = getattr(classifier, "pooling", None)
    if pooling == "dense":
        return [
            *linear("classifier.dense", "classifier.dense"),
            *linear("classifier.out_proj", "classifier.out_proj"),
        ]
    dense = linear("classifier.dense", "pre_classifier") if pooling == "pre_classifier" else []
    return [*dense, *linear("classifier.out_proj", "classifier")]


def _label_names(id2label: Any) -> tuple[str, ...]:
    """id2label ({"0": "NEG", "1": "POS"}) as names in id order; ids must be 0 .. n-1."""
    if not isinstance(id2label, Mapping) or not id2label:
        raise HFError(f"config.json id2label must map class ids to names, got {type(id2label).__name__}")
    by_id: dict[int, str] = {}
    for key, name in id2label.items():
        try:
            index = int(key)
        except (TypeError, ValueError):
            raise HFError(f"config.json id2label has the key {key!r}; class ids are integers") from None
        if not isinstance(name, str):
            raise HFError(f"config.json id2label[{key!r}] is {type(name).__name__}; a class name is a string")
        by_id[index] = name
    if sorted(by_id) != list(range(len(by_id))):
        raise HFError(f"config.json id2label must number its classes 0 .. {len(by_id) - 1}")
    return tuple(by_id[i] for i in range(len(by_id)))
