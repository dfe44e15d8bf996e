"""Decoder-only models (GPT-2, Llama; Radford et al. 2019): causal self-attention and an LM head."""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from zoo.generation.protocol import GenerationState
from zoo.losses import select_labels, shift_labels_left, token_cross_entropy
from zoo.models.base import (
    GenerationMixin,
    ZooModel,
    build_embedding,
    build_stack,
    repeat_rows,
)
from zoo.models.heads import LMHead, select_positions
from zoo.models.inputs import check_labels, check_logits_mask, check_tokens
from zoo.models.outputs import ModelOutput
from zoo.spec import DecoderSpec


class DecoderModel(GenerationMixin, ZooModel):
    continues_input: ClassVar[bool] = True  # generation: the output is the prompt + its continuation
    spec: DecoderSpec

    def __init__(self, spec: DecoderSpec) -> None:
        super().__init__()
        self.spec = spec
        self.embed = build_embedding(spec)
        self.decoder = build_stack(spec, "decoder")
        head = spec.lm_head
        self.lm_head = (
            LMHead(
                head,
                d_model=spec.d_model,
                vocab_size=spec.vocab_size,
                tied_to=self.embed.tokens if head.tied else None,
            )
            if head is not None
            else None
        )

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        *,
        position_ids: torch.Tensor | None = None,
        cache: Any = None,
        logits_mask: torch.Tensor | None = None,
        output_attentions: bool = False,
    ) -> ModelOutput:
        """input_ids (B, T); attention_mask (B, cached + T); labels (B, T) are the inputs themselves:
        the loss predicts token t + 1 from tokens <= t (shifted here, as in Hugging Face).

        ``logits_mask`` (B, T) bool runs the LM head only where it is True: logits are then (N, V) and the
        loss counts only those positions (position t is scored against label t + 1, so pass
        ``shift_labels_left(labels) != -100`` to skip padding and the last position).

        Every argument is checked first (`zoo.models.inputs`): a bad one is a ValueError, before any compute.
        """
        where, V = "DecoderModel.forward", self.spec.vocab_size
        B, T = check_tokens(
            input_ids,
            attention_mask,
            where=where,
            vocab_size=V,
            max_positions=self.spec.max_positions,
            cached=cache.length if cache is not None else 0,
        )
        check_labels(labels, where=where, shape=(B, T), num_classes=V, like="input_ids")
        check_logits_mask(
            logits_mask, input_ids, where=where, head="LM head", has_head=self.lm_head is not None
        )
        out = self.decoder(
            self.embed(input_ids),
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache,
            output_attentions=output_attentions,
        )
        logits = self.lm_head(select_positions(out.hidden, logits_mask)) if self.lm_head is not None else None
        loss = None
        if labels is not None and logits is not None:
            loss = token_cross_entropy(logits, select_labels(shift_labels_left(labels), logits_mask))
        return ModelOutput(logits=logits, last_hidden_state=out.hidden, loss=loss, attentions=out.attentions)

    @property
    def input_vocab_size(self) -> int:
        """Generation: prompt ids must lie in [0, input_vocab_size)."""
        return self.spec.vocab_size

    def prepare_generation(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, *, num_beams: int
    ) -> GenerationState:
        """The decoder starts from the (left-padded) prompt itself, (B, T) -> (B * num_beams, T)."""
        return GenerationState(
            prompt=repeat_rows(input_ids.long(), num_beams),
            prompt_mask=repeat_rows(attention_mask, num_beams),
            stack=self.decoder,
        )
