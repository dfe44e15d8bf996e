"""Decoder-only models (GPT-2, Llama, OPT, CTRL; Radford et al. 2019): causal self-attention and an LM head.

OPT's ``word_embed_proj_dim`` (`EmbeddingSpec.projection_dim`, E < C) narrows the token table and the tied
head, with bias-free projections on either side of the stack (Zhang et al. 2022; transformers' OPTDecoder):

    input_ids ──embed (V, E)──> project_in (E -> C) ──> stack (+ C-wide positions, layers, final norm)
        ──> project_out (C -> E) ──> last_hidden_state (B, T, E) ──lm_head (tied: the (V, E) table)──> logits
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn

from zoo.generation.protocol import GenerationState
from zoo.losses import select_labels, shift_labels_left, token_cross_entropy
from zoo.losses.chunked import ChunkedLoss
from zoo.models.base import GenerationMixin, ZooModel, aux_loss, build_embedding, build_stack, repeat_rows
from zoo.models.heads import LMHead, select_positions
from zoo.models.inputs import (
    check_chunked_loss,
    check_devices,
    check_labels,
    check_logits_mask,
    check_positions,
    check_prefix_lengths,
    check_tokens,
    model_device,
)
from zoo.models.outputs import ModelOutput
from zoo.spec import DecoderSpec
from zoo.stacks import StackCache


class DecoderModel(GenerationMixin, ZooModel):
    continues_input: ClassVar[bool] = True  # generation: the output is the prompt + its continuation
    decoder_start_token_id: ClassVar[None] = None  # generation: no start token, the prompt comes first
    spec: DecoderSpec

    def __init__(self, spec: DecoderSpec) -> None:
        super().__init__()
        self.spec = spec
        E, C = spec.embedding_dim, spec.d_model
        projected = spec.embedding.projection_dim is not None
        self.embed = build_embedding(spec)
        self.project_in = nn.Linear(E, C, bias=False) if projected else None
        self.decoder = build_stack(spec, "decoder")
        self.project_out = nn.Linear(C, E, bias=False) if projected else None
        head = spec.lm_head
        self.lm_head = (
            LMHead(
                head,
                d_model=C,
                input_dim=E,
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
        prefix_lengths: torch.Tensor | None = None,
        document_ids: torch.Tensor | None = None,
        chunked_loss: ChunkedLoss | None = None,
    ) -> ModelOutput:
        """input_ids (B, T); attention_mask (B, cached + T); labels (B, T) are the inputs themselves:
        the loss predicts token t + 1 from tokens <= t (shifted here, as in Hugging Face).

        ``attention_mask`` may instead be a (B, T, cached + T) bool mask, True = query t may attend to key s,
        ANDed with the decoder's attention patterns (positions then count 0 .. T - 1 after the cache, unless
        ``position_ids`` say otherwise). ``prefix_lengths`` (B,): real tokens of each row's prefix, which
        ``prefix_lm`` layers attend to bidirectionally (docs/attention.md). ``document_ids`` (B, T): packed
        rows, a document id per token (training, no cache): each token attends only within its document, and
        positions restart at each document's start unless ``position_ids`` are given.

        ``logits_mask`` (B, T) bool runs the LM head only where it is True: logits are then (N, V) and the
        loss counts only those positions (position t is scored against label t + 1, so pass
        ``shift_labels_left(labels) != -100`` to skip padding and the last position).

        ``chunked_loss`` (the trainer's): no logits; ``token_losses`` (N,) holds each scored position's loss
        against ``chunked_loss.targets`` (N,), aligned with the logits ``logits_mask`` would select, computed
        through the LM head a chunk of tokens at a time (`zoo.losses.chunked`). Not with ``labels``.

        ``last_hidden_state`` is (B, T, E): after ``project_out`` where the spec projects (as transformers'
        OPTModel returns it), else the stack's (B, T, C) output.

        Every argument is checked first (`zoo.models.inputs`): a bad one is a ValueError, before any compute.
        """
        self._check_inputs(
            input_ids,
            attention_mask,
            labels,
            position_ids=position_ids,
            cache=cache,
            logits_mask=logits_mask,
            prefix_lengths=prefix_lengths,
            document_ids=document_ids,
            chunked_loss=chunked_loss,
        )
        out = self.decoder(
            self._embed(input_ids),
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache,
            output_attentions=output_attentions,
            prefix_lengths=prefix_lengths,
            document_ids=document_ids,
        )
        hidden = self._project_out(out.hidden)  # (B, T, E)
        token_losses = None
        if chunked_loss is not None:
            assert self.lm_head is not None  # `check_chunked_loss`
            logits, loss = None, None
            rows = select_positions(hidden, logits_mask).reshape(-1, hidden.shape[-1])  # (N, E)
            token_losses = self.lm_head.token_losses(rows, chunked_loss)
        else:
            logits, loss = self._scores(hidden, labels, logits_mask)
        return ModelOutput(
            logits=logits,
            last_hidden_state=hidden,
            loss=loss,
            token_losses=token_losses,
            attentions=out.attentions,
            aux_loss=aux_loss((out, attention_mask)),
        )

    def _check_inputs(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        labels: torch.Tensor | None,
        *,
        position_ids: torch.Tensor | None,
        cache: Any,
        logits_mask: torch.Tensor | None,
        prefix_lengths: torch.Tensor | None,
        document_ids: torch.Tensor | None,
        chunked_loss: ChunkedLoss | None,
    ) -> None:
        """Every argument of `forward`, before any compute (`zoo.models.inputs`)."""
        where, V, cached = (
            "DecoderModel.forward",
            self.spec.vocab_size,
            cache.length if cache is not None else 0,
        )
        check_devices(
            where,
            model_device(self),
            input_ids=input_ids,
            attention_mask=attention_mask,
            labels=labels,
            position_ids=position_ids,
            prefix_lengths=prefix_lengths,
            document_ids=document_ids,
        )
        B, T = check_tokens(
            input_ids,
            attention_mask,
            where=where,
            vocab_size=V,
            max_positions=self.spec.max_positions,
            cached=cached,
            user_masks=True,
        )
        check_labels(labels, where=where, shape=(B, T), num_classes=V, like="input_ids")
        check_positions(
            position_ids,
            document_ids,
            where=where,
            shape=(B, T),
            max_positions=self.spec.max_positions,
            cached=cached,
        )
        check_logits_mask(
            logits_mask, input_ids, where=where, head="LM head", has_head=self.lm_head is not None
        )
        check_prefix_lengths(
            prefix_lengths,
            where=where,
            rows=B,
            length=T + cached,
            patterned=any(pattern.kind == "prefix_lm" for pattern in self.decoder.patterns.distinct),
        )
        check_chunked_loss(
            chunked_loss,
            where=where,
            device=model_device(self),
            positions=B * T if logits_mask is None else logits_mask,
            labels=labels,
            has_head=self.lm_head is not None,
        )

    def _scores(
        self, hidden: torch.Tensor, labels: torch.Tensor | None, logits_mask: torch.Tensor | None
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The LM head on hidden (B, T, E) -> logits (B, T, V), or (N, V) where ``logits_mask`` selects, and
        the loss of predicting token t + 1 at position t; (None, None) for a model without a head."""
        if self.lm_head is None:
            return None, None
        logits = self.lm_head(select_positions(hidden, logits_mask))
        if labels is None:
            return logits, None
        return logits, token_cross_entropy(logits, select_labels(shift_labels_left(labels), logits_mask))

    def _embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """(B, T) -> (B, T, C): the token lookup, projected in when the table is narrower than the stack."""
        x = self.embed(input_ids)  # (B, T, E)
        return self.project_in(x) if self.project_in is not None else x

    def _project_out(self, hidden: torch.Tensor) -> torch.Tensor:
        """(..., C) -> (..., E): the stack's output at the width the LM head reads."""
        return self.project_out(hidden) if self.project_out is not None else hidden

    @property
    def input_vocab_size(self) -> int:
        """Generation: prompt ids must lie in [0, input_vocab_size)."""
        return self.spec.vocab_size

    def prepare_generation(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        *,
        num_beams: int,
        decoder_input_ids: torch.Tensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
    ) -> GenerationState:
        """The decoder starts from the (left-padded) prompt itself, (B, T) -> (B * num_beams, T)."""
        if decoder_input_ids is not None or decoder_attention_mask is not None:
            raise ValueError("DecoderModel.prepare_generation: the prompt is input_ids; no decoder_input_ids")
        return GenerationState(
            prompt=repeat_rows(input_ids.long(), num_beams),
            prompt_mask=repeat_rows(attention_mask, num_beams),
            stack=self.decoder,
        )

    def next_token_logits(
        self,
        ids: torch.Tensor,
        position_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        cache: StackCache | None,
        state: GenerationState,
    ) -> torch.Tensor:
        """ids (R, t) not yet in ``cache`` -> next-token logits (R, V): `GenerationMixin.next_token_logits`,
        through the width projections where the spec has them (a fixed attribute, not data: compilable)."""
        if self.project_in is None:
            return super().next_token_logits(ids, position_ids, attention_mask, cache, state)
        hidden = self.decoder(
            self._embed(ids), attention_mask=attention_mask, position_ids=position_ids, cache=cache
        ).hidden  # (R, t, C)
        assert self.lm_head is not None  # generation refuses a model without one (`check_model`)
        return self.lm_head(self._project_out(hidden[:, -1]))  # (R, V)

    def all_token_logits(
        self,
        ids: torch.Tensor,
        position_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        cache: StackCache | None,
        state: GenerationState,
        keep: int,
    ) -> torch.Tensor:
        """ids (R, t) -> logits (R, keep, V) at the last ``keep`` positions: `GenerationMixin.all_token_logits`."""
        if self.project_in is None:
            return super().all_token_logits(ids, position_ids, attention_mask, cache, state, keep)
        hidden = self.decoder(
            self._embed(ids), attention_mask=attention_mask, position_ids=position_ids, cache=cache
        ).hidden  # (R, t, C)
        assert self.lm_head is not None
        return self.lm_head(self._project_out(hidden[:, -keep:]))  # (R, keep, V)
