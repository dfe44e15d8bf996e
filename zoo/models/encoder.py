"""Encoder-only models (BERT, RoBERTa, ALBERT, MiniLM; Devlin et al. 2019): bidirectional self-attention
over a padding mask, with an optional pooler, masked-LM head or sequence-classification head."""

from __future__ import annotations

import torch
from torch.nn import functional as F

from zoo.losses import select_labels, token_cross_entropy
from zoo.models.base import ZooModel, build_embedding, build_stack
from zoo.models.heads import ClassificationHead, MLMHead, Pooler, select_positions
from zoo.models.inputs import check_labels, check_logits_mask, check_token_types, check_tokens
from zoo.models.outputs import ModelOutput
from zoo.spec import EncoderSpec


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
            ClassificationHead(d_model=spec.d_model, num_labels=heads.num_labels, dropout=spec.dropout)
            if heads.num_labels
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
    ) -> ModelOutput:
        """input_ids (B, T); attention_mask (B, T) 1 = token; labels (B, T) for MLM (-100 = ignore) or
        (B,) for classification. logits: (B, T, V) from the MLM head or (B, num_labels).

        ``logits_mask`` (B, T) bool runs the MLM head only where it is True (e.g. ``labels != -100``):
        logits are then (N, V) for those N positions and the loss counts only them. MLM labels ~15% of
        the positions, so this skips most of the vocabulary-wide projection and its softmax.

        Every argument is checked first (`zoo.models.inputs`): a bad one is a ValueError, before any compute.
        """
        where, spec = "EncoderModel.forward", self.spec
        B, T = check_tokens(
            input_ids,
            attention_mask,
            where=where,
            vocab_size=spec.vocab_size,
            max_positions=spec.max_positions,
        )
        check_token_types(
            token_type_ids, where=where, shape=(B, T), segment_vocab_size=spec.embedding.segment_vocab_size
        )
        if self.mlm_head is not None:
            check_labels(labels, where=where, shape=(B, T), num_classes=spec.vocab_size, like="input_ids")
        elif self.classifier is not None:
            num_labels = spec.heads.num_labels or 0
            check_labels(labels, where=where, shape=(B,), num_classes=num_labels, like="one label per row")
        check_logits_mask(
            logits_mask, input_ids, where=where, head="MLM head", has_head=self.mlm_head is not None
        )
        out = self.encoder(
            self.embed(input_ids, token_type_ids),
            attention_mask=attention_mask,
            output_attentions=output_attentions,
        )
        pooled = self.pooler(out.hidden) if self.pooler is not None else None
        logits = loss = None
        if self.mlm_head is not None:
            logits = self.mlm_head(select_positions(out.hidden, logits_mask))  # (B, T, V) or (N, V)
            if labels is not None:
                loss = token_cross_entropy(logits, select_labels(labels, logits_mask))
        elif self.classifier is not None:
            logits = self.classifier(pooled if pooled is not None else out.hidden[:, 0])
            loss = F.cross_entropy(logits.float(), labels) if labels is not None else None
        return ModelOutput(
            logits=logits,
            last_hidden_state=out.hidden,
            loss=loss,
            attentions=out.attentions,
            pooler_output=pooled,
        )
