"""Encoder-decoder models (Vaswani et al. 2017; T5, BART, Marian).

    source ids ─> embed ─> encoder ──────────────┐ memory (B, S, C) + source padding mask
                                                 v
    target ids ─> embed ─> decoder (causal self-attn, cross-attn, FFN) x N ─> lm_head ─> logits (B, T, V)

`encode` and `decode` are separate so generation runs the encoder once and the decoder step by step.
Source and target share one embedding table (and, when tied, the output projection) unless the spec
gives the source its own vocabulary.

Packed training rows hold several (source, target) pairs each: ``document_ids`` gives every source token
its pair, ``decoder_document_ids`` every target token (the same id for the two sides of a pair). Each pair
is then computed as it would be alone: the encoder attends within each source, the decoder causally within
each target, cross-attention only to the pair's own source (`zoo.blocks.masks.same_pair`), positions (and
T5's relative-bias buckets, which depend on the distance inside a pair) restart at each pair, and labels
shift right behind one start token per pair:

    source row   [a1 a2 eos][b1 eos][c1 c2 c3 eos]          document_ids          0 0 0 1 1 2 2 2 2
    target row   [x1 eos][y1 y2 eos][z1 eos]                decoder_document_ids  0 0 1 1 1 2 2
    decoder in   [bos x1][bos y1 y2][bos z1]                ``shift_right(labels, decoder_document_ids)``
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from zoo.blocks.masks import keys_seen
from zoo.generation.protocol import GenerationState
from zoo.losses import IGNORE_INDEX, select_labels, token_cross_entropy
from zoo.models.base import (
    GenerationMixin,
    ZooModel,
    aux_loss,
    build_embedding,
    build_source_embedding,
    build_stack,
    repeat_rows,
)
from zoo.models.heads import LMHead, select_positions
from zoo.models.inputs import (
    check_devices,
    check_labels,
    check_logits_mask,
    check_mask,
    check_memory,
    check_positions,
    check_tokens,
    model_device,
)
from zoo.models.outputs import ModelOutput
from zoo.spec import EncoderDecoderSpec
from zoo.stacks import StackOutput


class EncoderDecoderModel(GenerationMixin, ZooModel):
    continues_input: ClassVar[bool] = False  # generation: input_ids are the source, not the output's start
    spec: EncoderDecoderSpec
    lm_head: LMHead  # always present (`GenerationMixin` allows None for a bare decoder)

    def __init__(self, spec: EncoderDecoderSpec) -> None:
        super().__init__()
        self.spec = spec
        self.embed = build_embedding(spec)
        self.source_embed = build_source_embedding(spec)
        self.encoder = build_stack(spec, "encoder")
        self.decoder = build_stack(spec, "decoder")
        head = spec.lm_head
        self.lm_head = LMHead(
            head,
            d_model=spec.d_model,
            vocab_size=spec.vocab_size,
            tied_to=self.embed.tokens if head.tied else None,
        )

    def encode(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        *,
        output_attentions: bool = False,
    ) -> StackOutput:
        """Source ids (B, S) -> the encoder output (B, S, C). Checks its arguments first (`zoo.models.inputs`)."""
        where = "EncoderDecoderModel.encode"
        check_devices(where, model_device(self), input_ids=input_ids, attention_mask=attention_mask)
        self._check_source(input_ids, attention_mask, where=where)
        return self._encode(input_ids, attention_mask, output_attentions=output_attentions)

    def _encode(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        *,
        output_attentions: bool = False,
        document_ids: torch.Tensor | None = None,
    ) -> StackOutput:
        embed = self.source_embed if self.source_embed is not None else self.embed
        return self.encoder(
            embed(input_ids),
            attention_mask=attention_mask,
            output_attentions=output_attentions,
            document_ids=document_ids,
        )

    def _check_source(self, input_ids: object, attention_mask: object, *, where: str) -> tuple[int, int]:
        return check_tokens(
            input_ids,
            attention_mask,
            where=where,
            vocab_size=self.input_vocab_size,
            max_positions=self.spec.max_positions,
            user_masks=True,
        )

    def _check_target(
        self, ids: object, mask: object, *, where: str, cached: int = 0, mask_name: str
    ) -> tuple[int, int]:
        return check_tokens(
            ids,
            mask,
            where=where,
            vocab_size=self.spec.vocab_size,
            max_positions=self.spec.max_positions,
            cached=cached,
            ids_name="decoder_input_ids",
            mask_name=mask_name,
            user_masks=True,
        )

    def decode(
        self,
        decoder_input_ids: torch.Tensor,
        *,
        memory: torch.Tensor,
        memory_mask: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        cache: Any = None,
        logits_mask: torch.Tensor | None = None,
        output_attentions: bool = False,
    ) -> tuple[StackOutput, torch.Tensor]:
        """Target ids (B, T) attending to ``memory`` (B, S, C) -> (decoder output, logits (B, T, V)), or
        logits (N, V) at the N positions where ``logits_mask`` (B, T) is True.

        Checks its arguments first (`zoo.models.inputs`); ``attention_mask`` covers cached + new tokens."""
        where, cached = "EncoderDecoderModel.decode", cache.length if cache is not None else 0
        check_devices(
            where,
            model_device(self),
            decoder_input_ids=decoder_input_ids,
            memory=memory,
            memory_mask=memory_mask,
            attention_mask=attention_mask,
            position_ids=position_ids,
        )
        B, T = self._check_target(
            decoder_input_ids, attention_mask, where=where, mask_name="attention_mask", cached=cached
        )
        check_positions(
            position_ids,
            None,
            where=where,
            shape=(B, T),
            max_positions=self.spec.max_positions,
            cached=cached,
        )
        S = check_memory(memory, where=where, rows=B, d_model=self.spec.d_model)
        check_mask(memory_mask, where=where, name="memory_mask", shape=(B, S), like="memory")
        check_logits_mask(logits_mask, decoder_input_ids, where=where, head="LM head")
        return self._decode(
            decoder_input_ids,
            memory=memory,
            memory_mask=memory_mask,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache,
            logits_mask=logits_mask,
            output_attentions=output_attentions,
        )

    def _decode(
        self,
        decoder_input_ids: torch.Tensor,
        *,
        memory: torch.Tensor,
        memory_mask: torch.Tensor | None,
        attention_mask: torch.Tensor | None,
        position_ids: torch.Tensor | None = None,
        cache: Any = None,
        logits_mask: torch.Tensor | None,
        output_attentions: bool,
        document_ids: torch.Tensor | None = None,
        memory_document_ids: torch.Tensor | None = None,
    ) -> tuple[StackOutput, torch.Tensor]:
        out = self.decoder(
            self.embed(decoder_input_ids),
            attention_mask=attention_mask,
            position_ids=position_ids,
            memory=memory,
            memory_mask=memory_mask,
            cache=cache,
            output_attentions=output_attentions,
            document_ids=document_ids,
            memory_document_ids=memory_document_ids,
        )
        return out, self.lm_head(select_positions(out.hidden, logits_mask))

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.Tensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        *,
        logits_mask: torch.Tensor | None = None,
        output_attentions: bool = False,
        document_ids: torch.Tensor | None = None,
        decoder_document_ids: torch.Tensor | None = None,
    ) -> ModelOutput:
        """input_ids (B, S) source; decoder_input_ids (B, T) target inputs, or made from labels (B, T) by
        shifting right behind the decoder start token (teacher forcing, as in Hugging Face).

        ``document_ids`` (B, S) and ``decoder_document_ids`` (B, T), given together: packed rows of several
        (source, target) pairs, a pair id per token (the same id on both sides of a pair; padding a pair of
        its own, -1 say). Each pair is computed as it would be alone (see the module's docstring); labels
        shift right per pair.

        ``attention_mask`` may be a (B, S, S) bool mask for the encoder's self-attention and
        ``decoder_attention_mask`` a (B, T, T) one for the decoder's, True = may attend (ANDed with each
        stack's patterns); cross-attention then hides the source keys no encoder query may see.

        ``logits_mask`` (B, T) bool (e.g. ``labels != -100``) runs the LM head only where it is True:
        logits are then (N, V) and the loss counts only those positions.

        Every argument is checked first (`zoo.models.inputs`): a bad one is a ValueError, before any compute.
        """
        decoder_input_ids = self._check_inputs(
            input_ids,
            attention_mask,
            decoder_input_ids,
            decoder_attention_mask,
            labels,
            logits_mask=logits_mask,
            document_ids=document_ids,
            decoder_document_ids=decoder_document_ids,
        )
        encoded = self._encode(
            input_ids, attention_mask, output_attentions=output_attentions, document_ids=document_ids
        )
        decoded, logits = self._decode(
            decoder_input_ids,
            memory=encoded.hidden,
            memory_mask=keys_seen(attention_mask),
            attention_mask=decoder_attention_mask,
            logits_mask=logits_mask,
            output_attentions=output_attentions,
            document_ids=decoder_document_ids,
            memory_document_ids=document_ids,
        )
        loss = token_cross_entropy(logits, select_labels(labels, logits_mask)) if labels is not None else None
        return ModelOutput(
            logits=logits,
            last_hidden_state=decoded.hidden,
            loss=loss,
            attentions=decoded.attentions,
            cross_attentions=decoded.cross_attentions,
            encoder_last_hidden_state=encoded.hidden,
            encoder_attentions=encoded.attentions,
            aux_loss=aux_loss((encoded, attention_mask), (decoded, decoder_attention_mask)),
        )

    def _check_inputs(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        decoder_input_ids: torch.Tensor | None,
        decoder_attention_mask: torch.Tensor | None,
        labels: torch.Tensor | None,
        *,
        logits_mask: torch.Tensor | None,
        document_ids: torch.Tensor | None = None,
        decoder_document_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Every argument of `forward`, before any compute (`zoo.models.inputs`); returns the decoder inputs,
        made from the labels (`shift_right`, per pair with ``decoder_document_ids``) when none are given."""
        where, V = "EncoderDecoderModel.forward", self.spec.vocab_size
        check_devices(
            where,
            model_device(self),
            input_ids=input_ids,
            attention_mask=attention_mask,
            decoder_input_ids=decoder_input_ids,
            decoder_attention_mask=decoder_attention_mask,
            labels=labels,
            document_ids=document_ids,
            decoder_document_ids=decoder_document_ids,
        )
        B, S = self._check_source(input_ids, attention_mask, where=where)
        if (document_ids is None) != (decoder_document_ids is None):
            raise ValueError(
                f"{where}: packed pairs need document_ids (source) and decoder_document_ids (target) together"
            )
        check_positions(None, document_ids, where=where, shape=(B, S), max_positions=self.spec.max_positions)
        if decoder_input_ids is None:
            if labels is None:
                raise ValueError(f"{where} needs decoder_input_ids or labels")
            # the labels become the decoder inputs: (B, length) ids before they are shifted
            check_labels(labels, where=where, shape=(B, None), num_classes=V, like="input_ids")
            if decoder_document_ids is not None:  # its shape is that of the labels
                check_positions(
                    None,
                    decoder_document_ids,
                    where=where,
                    shape=(B, labels.shape[1]),
                    max_positions=self.spec.max_positions,
                    documents_name="decoder_document_ids",
                )
            decoder_input_ids = self.shift_right(labels, decoder_document_ids)
        rows, T = self._check_target(
            decoder_input_ids, decoder_attention_mask, where=where, mask_name="decoder_attention_mask"
        )
        check_positions(
            None,
            decoder_document_ids,
            where=where,
            shape=(rows, T),
            max_positions=self.spec.max_positions,
            documents_name="decoder_document_ids",
        )
        if rows != B:
            raise ValueError(
                f"{where}: decoder_input_ids has {rows} rows and input_ids {B}: give one target per source"
            )
        check_labels(labels, where=where, shape=(B, T), num_classes=V, like="decoder_input_ids")
        check_logits_mask(logits_mask, decoder_input_ids, where=where, head="LM head")
        return decoder_input_ids

    @property
    def input_vocab_size(self) -> int:
        """Generation: source ids must lie in [0, input_vocab_size)."""
        return self.spec.source_vocab_size or self.spec.vocab_size

    @property
    def decoder_start_token_id(self) -> int:
        """Generation: the decoder's first token (a decoder prompt begins with it)."""
        return self.spec.start_token_id

    def prepare_generation(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        *,
        num_beams: int,
        decoder_input_ids: torch.Tensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
    ) -> GenerationState:
        """Run the encoder once over the source (B, S); the decoder starts from the start token (B * N, 1),
        or from ``decoder_input_ids`` (B, P) -> (B * N, P), left-padded where ``decoder_attention_mask`` is 0.

        The beams of a sentence share its encoder output (repeated, not recomputed).
        """
        # `zoo.generation` has checked the source and any decoder prompt: straight to the encoder.
        memory = self._encode(input_ids, attention_mask).hidden  # (B, S, C)
        if decoder_input_ids is None:
            decoder_input_ids = torch.full(
                (input_ids.shape[0], 1), self.spec.start_token_id, dtype=torch.long, device=memory.device
            )
        return GenerationState(
            prompt=repeat_rows(decoder_input_ids.long(), num_beams),
            prompt_mask=repeat_rows(decoder_attention_mask, num_beams),
            stack=self.decoder,
            memory=repeat_rows(memory, num_beams),
            memory_mask=repeat_rows(attention_mask, num_beams),
        )

    def shift_right(self, labels: torch.Tensor, document_ids: torch.Tensor | None = None) -> torch.Tensor:
        """(B, T) labels -> decoder inputs: the start token, then labels[:, :-1] with -100 made padding.

        ``document_ids`` (B, T): packed pairs, a pair id per target token: every pair starts with the start
        token (never the last label of the pair before it)."""
        start = torch.full_like(labels[:, :1], self.spec.start_token_id)
        shifted = torch.cat([start, labels[:, :-1]], dim=1)
        if document_ids is not None:
            first = torch.zeros_like(labels, dtype=torch.bool)  # (B, T): where a pair begins
            first[:, 1:] = document_ids[:, 1:] != document_ids[:, :-1]
            shifted = shifted.masked_fill(first, self.spec.start_token_id)
        return shifted.masked_fill(shifted == IGNORE_INDEX, self.spec.pad_token_id or 0)
