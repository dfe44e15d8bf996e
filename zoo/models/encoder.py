"""Encoder-only models (BERT, RoBERTa, ALBERT, MiniLM, DistilBERT, ELECTRA, MPNet; Devlin et al. 2019):
bidirectional self-attention over a padding mask, with an optional pooler, and a masked-LM head, a sequence-
or token-classification head (`zoo.models.heads.ClassificationHead`) or ELECTRA's replaced-token detector."""

from __future__ import annotations

import torch

from zoo.losses import select_labels, token_cross_entropy
from zoo.models.base import ZooModel, aux_loss, build_embedding, build_stack
from zoo.models.heads import (
    ClassificationHead,
    MLMHead,
    Pooler,
    ReplacedTokenHead,
    classification_loss,
    replaced_token_loss,
    resolve_problem_type,
    select_positions,
)
from zoo.models.inputs import (
    check_devices,
    check_labels,
    check_logits_mask,
    check_positions,
    check_token_types,
    check_tokens,
    model_device,
)
from zoo.models.outputs import ModelOutput
from zoo.spec import EncoderSpec
from zoo.spec.model import SequenceClassifierSpec


class EncoderModel(ZooModel):
    spec: EncoderSpec

    def __init__(self, spec: EncoderSpec) -> None:
        super().__init__()
        self.spec = spec
        self.embed = build_embedding(spec)
        self.encoder = build_stack(spec, "encoder")
        heads = spec.heads
        self.pooler = Pooler(d_model=spec.d_model) if heads.pooler else None
        self.mlm_head = (
            MLMHead(
                heads.mlm,
                norm=spec.norm,
                d_model=spec.d_model,
                embed_dim=spec.embedding_dim,
                vocab_size=spec.vocab_size,
                tied_to=self.embed.tokens if heads.mlm.tied else None,
            )
            if heads.mlm
            else None
        )
        self.classifier = (
            ClassificationHead(heads.classifier, d_model=spec.d_model, dropout=spec.dropout, norm=spec.norm)
            if heads.classifier is not None
            else None
        )
        self.replaced_token_head = (
            ReplacedTokenHead(heads.replaced_token, d_model=spec.d_model)
            if heads.replaced_token is not None
            else None
        )

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        *,
        logits_mask: torch.Tensor | None = None,
        output_attentions: bool = False,
        position_ids: torch.Tensor | None = None,
        document_ids: torch.Tensor | None = None,
    ) -> ModelOutput:
        """input_ids (B, T); attention_mask (B, T) 1 = token, or a (B, T, T) bool mask (True = may attend,
        ANDed with the encoder's attention patterns); labels (B, T) for MLM or token
        classification (-100 = ignore), (B,) class ids for sequence classification ((B, L) floats for
        multi-label, (B,) or (B, L) floats for regression), (B, T) 0/1 for the replaced-token head (1 =
        replaced; its loss counts the real tokens of a (B, T) mask, as ELECTRA's). logits: (B, T, V) from
        the MLM head, (B, T, L) from a token classifier, (B, L) from a sequence classifier (L = num_labels),
        (B, T) from the replaced-token head.

        ``logits_mask`` (B, T) bool runs a token-level head (MLM, token classifier) only where it is True
        (e.g. ``labels != -100``): logits are then (N, V) or (N, L) for those N positions and the loss counts
        only them. MLM labels ~15% of the positions, so this skips most of the vocabulary-wide projection.

        ``document_ids`` (B, T): packed rows, a document id per token: each token attends only within its
        document, and positions (``position_ids`` (B, T), default 0 .. T - 1) restart at each document's start.

        Every argument is checked first (`zoo.models.inputs`): a bad one is a ValueError, before any compute.
        """
        where, spec = "EncoderModel.forward", self.spec
        check_devices(
            where,
            model_device(self),
            input_ids=input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            labels=labels,
            position_ids=position_ids,
            document_ids=document_ids,
        )
        B, T = check_tokens(
            input_ids,
            attention_mask,
            where=where,
            vocab_size=spec.vocab_size,
            max_positions=spec.max_positions,
            user_masks=True,
        )
        check_token_types(
            token_type_ids, where=where, shape=(B, T), segment_vocab_size=spec.embedding.segment_vocab_size
        )
        check_positions(
            position_ids, document_ids, where=where, shape=(B, T), max_positions=spec.max_positions
        )
        classifier = spec.heads.classifier
        per_token = self.classifier is not None and self.classifier.per_token
        if self.mlm_head is not None:
            check_labels(labels, where=where, shape=(B, T), num_classes=spec.vocab_size, like="input_ids")
        elif classifier is not None and per_token:
            check_labels(
                labels, where=where, shape=(B, T), num_classes=classifier.num_labels, like="input_ids"
            )
        elif isinstance(classifier, SequenceClassifierSpec):
            _check_sequence_labels(labels, classifier, where=where, batch=B)
        elif self.replaced_token_head is not None:
            check_labels(labels, where=where, shape=(B, T), num_classes=2, like="input_ids")
        check_logits_mask(
            logits_mask,
            input_ids,
            where=where,
            head="token classifier"
            if per_token
            else "replaced-token head"
            if self.replaced_token_head is not None
            else "MLM head",
            has_head=self.mlm_head is not None or per_token or self.replaced_token_head is not None,
        )
        out = self.encoder(
            self.embed(input_ids, token_type_ids),
            attention_mask=attention_mask,
            position_ids=position_ids,
            output_attentions=output_attentions,
            document_ids=document_ids,
        )
        pooled = self.pooler(out.hidden) if self.pooler is not None else None
        logits = loss = None
        if self.mlm_head is not None:
            logits = self.mlm_head(select_positions(out.hidden, logits_mask))  # (B, T, V) or (N, V)
            if labels is not None:
                loss = token_cross_entropy(logits, select_labels(labels, logits_mask))
        elif self.classifier is not None and per_token:
            logits = self.classifier(select_positions(out.hidden, logits_mask))  # (B, T, L) or (N, L)
            if labels is not None:
                loss = token_cross_entropy(logits, select_labels(labels, logits_mask))
        elif isinstance(classifier, SequenceClassifierSpec) and self.classifier is not None:
            padding = attention_mask if attention_mask is not None and attention_mask.dim() == 2 else None
            logits = self.classifier(out.hidden, pooled, padding)  # (B, L)
            if labels is not None:
                loss = classification_loss(logits, labels, problem_type=classifier.problem_type)
        elif self.replaced_token_head is not None:
            logits = self.replaced_token_head(select_positions(out.hidden, logits_mask))  # (B, T) or (N,)
            if labels is not None:
                padding = attention_mask if attention_mask is not None and attention_mask.dim() == 2 else None
                mask = select_labels(padding, logits_mask) if padding is not None else None
                loss = replaced_token_loss(logits, select_labels(labels, logits_mask), mask)
        return ModelOutput(
            logits=logits,
            last_hidden_state=out.hidden,
            loss=loss,
            attentions=out.attentions,
            pooler_output=pooled,
            aux_loss=aux_loss((out, attention_mask)),
        )


def _check_sequence_labels(
    labels: torch.Tensor | None, classifier: SequenceClassifierSpec, *, where: str, batch: int
) -> None:
    """Class ids (B,) for single-label classification; floats (B, L) for multi-label, (B,) or (B, L) for
    regression (the problem type resolved as transformers resolves it)."""
    if labels is None or not isinstance(labels, torch.Tensor):
        check_labels(
            labels, where=where, shape=(batch,), num_classes=classifier.num_labels, like="one label per row"
        )
        return
    L = classifier.num_labels
    problem = resolve_problem_type(classifier.problem_type, num_labels=L, labels=labels)
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
