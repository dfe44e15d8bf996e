"""An encoder's output head behind one interface, chosen when the model is built (`output_head`).

An encoder has at most one output head (`EncoderHeadsSpec`); each checks its own labels and turns the
encoder's output into logits and a loss, so `EncoderModel.forward` runs whichever the spec built without
asking which (``N``: the positions ``logits_mask`` selects; ``L``: num_labels):

    head                  logits               labels                                  loss
    MLM (BERT)            (B, T, V) / (N, V)   (B, T) token ids, -100 = ignored        token cross-entropy
    token classifier      (B, T, L) / (N, L)   (B, T) class ids, -100 = ignored        token cross-entropy
    sequence classifier   (B, L)               (B,) class ids; (B, L) or (B,) floats   as transformers'
    image classifier      (B, L)               as a sequence classifier's              as transformers'
    replaced-token        (B, T) / (N,)        (B, T) 0/1, 1 = replaced (ELECTRA)      BCE over real tokens
    none                  None                 not read                                None

The head modules themselves (`zoo.models.heads`) stay attributes of the model under their own names, which
are the state-dict names; the objects here only hold a reference to one of them.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import nn

from zoo.losses import select_labels, token_cross_entropy
from zoo.models.heads import (
    ClassificationHead,
    ImageClassificationHead,
    classification_loss,
    replaced_token_loss,
    resolve_problem_type,
    select_positions,
)
from zoo.models.inputs import check_labels
from zoo.spec.model import ImageClassifierSpec, SequenceClassifierSpec

Scores = tuple[torch.Tensor | None, torch.Tensor | None]  # (logits, loss)


class EncoderHead(Protocol):
    """What `EncoderModel.forward` asks of its output head."""

    @property
    def name(self) -> str:
        """What a logits_mask error calls it (the MLM head for a model without a token-level head)."""
        ...

    @property
    def per_token(self) -> bool:
        """Whether it scores each token, so that ``logits_mask`` may select the positions it runs on."""
        ...

    def check_labels(self, labels: object, *, where: str, shape: tuple[int, int]) -> None:
        """Refuse ``labels`` (a ValueError naming ``where``) that this head cannot score; shape is (B, T)."""
        ...

    def __call__(
        self,
        hidden: torch.Tensor,
        *,
        pooled: torch.Tensor | None,
        padding: torch.Tensor | None,
        labels: torch.Tensor | None,
        logits_mask: torch.Tensor | None,
    ) -> Scores:
        """hidden (B, T, C); pooled (B, C) the pooler's output; padding (B, T), 1 = token -> (logits, loss)."""
        ...


class TokenScores:
    """The MLM head or a token classifier: logits for every token (or the selected ones), token
    cross-entropy against labels at the same positions."""

    per_token = True

    def __init__(self, module: nn.Module, *, name: str, num_classes: int) -> None:
        self.module, self.name, self.num_classes = module, name, num_classes

    def check_labels(self, labels: object, *, where: str, shape: tuple[int, int]) -> None:
        check_labels(labels, where=where, shape=shape, num_classes=self.num_classes, like="input_ids")

    def __call__(
        self,
        hidden: torch.Tensor,
        *,
        pooled: torch.Tensor | None,
        padding: torch.Tensor | None,
        labels: torch.Tensor | None,
        logits_mask: torch.Tensor | None,
    ) -> Scores:
        logits = self.module(select_positions(hidden, logits_mask))  # (B, T, V) or (N, V)
        if labels is None:
            return logits, None
        return logits, token_cross_entropy(logits, select_labels(labels, logits_mask))


class ReplacedTokenScores:
    """ELECTRA's discriminator: one logit per token, "replaced", and binary cross-entropy over the real
    tokens of a (B, T) padding mask, as ElectraForPreTraining counts them."""

    name, per_token = "replaced-token head", True

    def __init__(self, module: nn.Module) -> None:
        self.module = module

    def check_labels(self, labels: object, *, where: str, shape: tuple[int, int]) -> None:
        check_labels(labels, where=where, shape=shape, num_classes=2, like="input_ids")

    def __call__(
        self,
        hidden: torch.Tensor,
        *,
        pooled: torch.Tensor | None,
        padding: torch.Tensor | None,
        labels: torch.Tensor | None,
        logits_mask: torch.Tensor | None,
    ) -> Scores:
        logits = self.module(select_positions(hidden, logits_mask))  # (B, T) or (N,)
        if labels is None:
            return logits, None
        mask = select_labels(padding, logits_mask) if padding is not None else None
        return logits, replaced_token_loss(logits, select_labels(labels, logits_mask), mask)


class SequenceScores:
    """A sequence (or image) classifier: one row of logits per sequence (or image), its loss by problem
    type (`classification_loss`)."""

    name, per_token = "MLM head", False  # logits_mask has no head here to select for

    def __init__(
        self,
        module: ClassificationHead | ImageClassificationHead,
        spec: SequenceClassifierSpec | ImageClassifierSpec,
    ) -> None:
        self.module, self.spec = module, spec

    def check_labels(self, labels: object, *, where: str, shape: tuple[int, int]) -> None:
        """Class ids (B,) for single-label classification; floats (B, L) for multi-label, (B,) or (B, L) for
        regression (the problem type resolved as transformers resolves it)."""
        batch, L = shape[0], self.spec.num_labels
        if labels is None or not isinstance(labels, torch.Tensor):
            check_labels(labels, where=where, shape=(batch,), num_classes=L, like="one label per row")
            return
        problem = resolve_problem_type(self.spec.problem_type, num_labels=L, labels=labels)
        if problem == "single_label_classification":
            check_labels(labels, where=where, shape=(batch,), num_classes=L, like="one label per row")
            return
        shapes = [(batch, L)] + ([(batch,)] if problem == "regression" and L == 1 else [])
        if tuple(labels.shape) not in shapes or not labels.dtype.is_floating_point:
            wanted = " or ".join(str(shape) for shape in shapes)
            raise ValueError(
                f"{where}: labels for {problem} must be floats of shape {wanted}; got {labels.dtype} of "
                f"shape {tuple(labels.shape)}"
            )

    def __call__(
        self,
        hidden: torch.Tensor,
        *,
        pooled: torch.Tensor | None,
        padding: torch.Tensor | None,
        labels: torch.Tensor | None,
        logits_mask: torch.Tensor | None,
    ) -> Scores:
        logits = self.module(hidden, pooled, padding)  # (B, L)
        if labels is None:
            return logits, None
        return logits, classification_loss(logits, labels, problem_type=self.spec.problem_type)


class NoScores:
    """An encoder without an output head: its last hidden state (and pooled output) is the result."""

    name, per_token = "MLM head", False

    def check_labels(self, labels: object, *, where: str, shape: tuple[int, int]) -> None:
        pass  # nothing reads them

    def __call__(
        self,
        hidden: torch.Tensor,
        *,
        pooled: torch.Tensor | None,
        padding: torch.Tensor | None,
        labels: torch.Tensor | None,
        logits_mask: torch.Tensor | None,
    ) -> Scores:
        return None, None
