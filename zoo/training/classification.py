"""Sequence and token classification for the trainer: the model's head, encoding, batches, metrics.

The data (``text<TAB>label``, JSON lines, CoNLL) is read by `zoo.training.labelled`. Texts are framed as
the language-model tasks frame them, ``bos text eos`` (``[CLS] text [SEP]`` with a BERT tokenizer), so a
sequence head reads ``[CLS]``. A word's tag goes on its first sub-word; later sub-words and special tokens
get -100 (not scored), as in transformers' token-classification examples.

The label names are the model's (``heads.classifier.labels``) when it has them, else the training data's,
sorted (numerically when every label is an integer). They are written into the spec, so a trained model
carries them, and `zoo.to_hf` writes them as ``id2label``. A model without a classifier for the task gets
a new one (replacing an MLM head): reading the pooler when it has one, else the first token; a token
classifier drops the pooler, as transformers' ``*ForTokenClassification`` do.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from tokenizers import Tokenizer as HFTokenizer

from zoo.io.tokenizer import Tokenizer
from zoo.io.tokenizer.lengths import char_budget, cut_before_encoding, cut_words
from zoo.losses import IGNORE_INDEX
from zoo.spec import EncoderSpec, ModelSpec
from zoo.training.batching import Batch, Collator
from zoo.training.config import ConfigError, Task
from zoo.training.data import DataError, EncodedExamples, TooLong, report_length_cuts
from zoo.training.labelled import LabelledText

log = logging.getLogger(__name__)

HEAD_OF_TASK = {"sequence_classification": "sequence", "token_classification": "token"}
OUTSIDE = "O"  # the tag of tokens outside any entity (IOB / BIO tagging), left out of the token F1


@dataclass(frozen=True)
class LabelledExamples(EncodedExamples):
    """Token ids (``targets``) and class ids: one per sequence, or one per token (-100: not scored)."""

    labels: list[Any]


# --- the model's head -------------------------------------------------------------------------------------


def split_overrides(overrides: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(overrides to apply now, those under ``heads.classifier`` to apply once the classifier exists);
    dotted (``heads.classifier.pooling``) or nested (``heads: {classifier: {pooling: ...}}``) alike."""
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


def with_classifier(
    spec: ModelSpec, *, task: Task, train: LabelledText, overrides: dict[str, Any], where: str
) -> EncoderSpec:
    """``spec`` with a classifier for ``task`` whose label names cover the training data.

    An existing classifier for the task keeps its weights' meaning: its names (or, unnamed, the data's
    sorted names, which must be as many) are the class ids. Otherwise a new head is made, then
    ``overrides`` (the config's ``heads.classifier.*``) are applied.
    """
    assert isinstance(spec, EncoderSpec)  # `resolve_task` checked the family
    head = HEAD_OF_TASK[task]
    found = sorted_names({label for labels in _flat(train) for label in labels})
    classifier = spec.heads.classifier
    try:
        if classifier is None or classifier.task != head:
            spec = spec.override(**_new_head(spec, head, found))
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
                f"training data has {len(found)} ({_names(found)}); name them in "
                "heads.classifier.labels (model.overrides), in class-id order"
            )
        spec = spec.override(**{"heads.classifier.labels": list(found)})
    assert isinstance(spec, EncoderSpec)
    return spec


def _new_head(spec: EncoderSpec, head: str, names: tuple[str, ...]) -> dict[str, Any]:
    """Overrides giving ``spec`` a fresh ``head`` classifier for ``names`` (in place of an MLM head)."""
    classifier: dict[str, Any] = {"task": head, "num_labels": len(names), "labels": list(names)}
    changes: dict[str, Any] = {"heads.mlm": None, "heads.classifier": classifier}
    if head == "sequence":
        classifier["pooling"] = "pooler" if spec.heads.pooler else "first_token"
    else:
        changes["heads.pooler"] = False  # as transformers' *ForTokenClassification
    return changes


def sorted_names(names: set[str]) -> tuple[str, ...]:
    """Label names in class-id order: numerically when all are integers, else alphabetically."""
    if all(re.fullmatch(r"-?[0-9]+", name) for name in names):
        return tuple(sorted(names, key=int))
    return tuple(sorted(names))


def check_labels(text: LabelledText, names: Sequence[str]) -> None:
    """Every label of ``text`` must be one of ``names``; else a `DataError` naming the first stray line."""
    known = set(names)
    for labels, origin in zip(_flat(text), text.origins):
        stray = next((label for label in labels if label not in known), None)
        if stray is not None:
            raise DataError(
                f"{origin}: label {stray!r:.60} is not one of the model's labels ({_names(names)})"
            )


def _flat(text: LabelledText) -> list[list[str]]:
    return [labels if isinstance(labels, list) else [labels] for labels in text.labels]


def _names(names: Sequence[str]) -> str:
    shown = ", ".join(repr(n) for n in list(names)[:8])
    return shown + (f", ... ({len(names)} in all)" if len(names) > 8 else "")


# --- encoding ---------------------------------------------------------------------------------------------


def with_encoder_framing(tokenizer: Tokenizer) -> Tokenizer:
    """``tokenizer`` with BERT's framing ``bos text eos`` as its post-processor, when it has none (those
    zoo trains): the batch call, and transformers' ``AutoTokenizer`` on an exported folder, then frame
    texts as training did, and a sequence head reads the same first token."""
    tok, bos, eos = tokenizer.hf, tokenizer.bos_id, tokenizer.eos_id
    if tok.post_processor is not None or bos is None or eos is None:
        return tokenizer
    first, last = ({"SpecialToken": {"id": tok.id_to_token(i), "type_id": 0}} for i in (bos, eos))
    single = [first, {"Sequence": {"id": "A", "type_id": 0}}, last]
    data = json.loads(tok.to_str())
    data["post_processor"] = {  # JSON, not a template string: token names may hold ':' or spaces
        "type": "TemplateProcessing",
        "single": single,
        "pair": [*single, {"Sequence": {"id": "B", "type_id": 0}}, last],
        "special_tokens": {
            token: {"id": token, "ids": [i], "tokens": [token]}
            for i in (bos, eos)
            if (token := tok.id_to_token(i)) is not None
        },
    }
    framed = Tokenizer(HFTokenizer.from_str(json.dumps(data)), model_max_length=tokenizer.model_max_length)
    # Special tokens a tokenizer_config.json named (not found by their usual names) would be lost: keep it.
    return framed if framed.special_ids() == tokenizer.special_ids() else tokenizer


def encode_labelled(
    text: LabelledText,
    *,
    names: Sequence[str],
    tokenizer: Tokenizer,
    max_length: int,
    too_long: TooLong = "truncate",
) -> LabelledExamples:
    """Token ids framed ``bos ... eos`` and class ids (per token: on each word's first sub-word)."""
    check_labels(text, names)
    index = {name: i for i, name in enumerate(names)}
    bos, eos = tokenizer.bos_id, tokenizer.eos_id
    head, tail = [bos] if bos is not None else [], [eos] if eos is not None else []
    ids: list[list[int]] = []
    labels: list[Any] = []
    budget = char_budget(tokenizer, max_length)  # longer texts are cut before encoding (io.tokenizer.lengths)
    if text.words is None:  # one label per text
        texts, over = cut_before_encoding(text.targets, budget)
        ids = tokenizer.encode_batch(texts, add_bos=bos is not None, add_eos=eos is not None)
        labels = [index[label] for label in text.labels]
    else:
        words = [cut_words(row, budget) for row in text.words]  # whole words, so the tags stay aligned
        over = [i for i, (_, left_out) in enumerate(words) if left_out]
        encodings = tokenizer.hf.encode_batch(
            [w for w, _ in words], is_pretokenized=True, add_special_tokens=False
        )
        for encoding, tags in zip(encodings, text.labels):
            previous, row = None, []
            for word in encoding.word_ids:
                first = word is not None and word != previous
                row.append(index[tags[word]] if first else IGNORE_INDEX)
                previous = word
            ids.append([*head, *encoding.ids, *tail])
            labels.append([IGNORE_INDEX] * len(head) + row + [IGNORE_INDEX] * len(tail))
    too_many_chars = set(over)  # certainly too long, whatever their cut text encodes to
    keep, cut = [], []
    for i, row in enumerate(ids):
        if i not in too_many_chars and len(row) <= max_length:
            keep.append(i)
            continue
        if too_long == "error":
            found = (
                f"{len(text.targets[i]):,} characters, more than the limit of {max_length} tokens can cover"
                if i in too_many_chars
                else f"{len(row)} tokens, more than the limit of {max_length}"
            )
            raise DataError(
                f"{text.origins[i]}: {found} "
                "(data.max_length or the model's max_positions); set data.too_long to truncate or skip"
            )
        cut.append(i)
        if too_long == "truncate":  # keep the closing special token, as `zoo.training.data` does
            if len(row) > max_length:  # (a text cut before encoding may already fit)
                ids[i] = [*row[: max_length - 1], row[-1]]
                if text.words is not None:
                    labels[i] = [*labels[i][: max_length - 1], labels[i][-1]]
            keep.append(i)
    report_length_cuts(
        cut, keep, total=len(ids), max_length=max_length, too_long=too_long, origins=text.origins
    )
    return LabelledExamples(
        targets=[ids[i] for i in keep],
        sources=None,
        origins=[text.origins[i] for i in keep],
        labels=[labels[i] for i in keep],
    )


# --- batches and metrics ----------------------------------------------------------------------------------


class ClassificationCollator:
    """Example indices -> a `Batch`: right-padded ids and mask, and targets (B,) (sequence) or (B, T)
    (token, -100 where not scored)."""

    def __init__(self, data: LabelledExamples, *, pad_id: int) -> None:
        self.data, self.pad_id = data, pad_id

    def __call__(self, indices: list[int], *, generator: torch.Generator | None = None) -> Batch:
        rows = [self.data.targets[i] for i in indices]
        input_ids, attention_mask = Collator._pad(rows, self.pad_id)  # (B, T)
        labels = [self.data.labels[i] for i in indices]
        if labels and isinstance(labels[0], list):
            targets, _ = Collator._pad(labels, IGNORE_INDEX)  # (B, T)
        else:
            targets = torch.tensor(labels, dtype=torch.long)  # (B,)
        inputs = {"input_ids": input_ids, "attention_mask": attention_mask}
        return Batch(inputs, targets, int(attention_mask.sum()))


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
