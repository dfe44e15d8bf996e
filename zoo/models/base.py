"""What every zoo model shares: its spec, parameter counts; and, for the models that decode, the hooks
generation calls (`GenerationMixin`, the `zoo.generation.protocol.GenerativeModel` protocol)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar, overload, runtime_checkable

import torch
from torch import nn

from zoo.blocks import AudioEmbedding, PatchEmbedding, TokenEmbedding
from zoo.generation.generate import GenerationOutput, generate
from zoo.generation.protocol import GenerationState, GenerativeModel
from zoo.generation.weight_layout import row_major
from zoo.losses import load_balancing_loss
from zoo.spec import EmbeddingSpec, EncoderDecoderSpec, ModelSpec, PatchEmbeddingSpec
from zoo.stacks import Stack, StackCache, StackOutput

if TYPE_CHECKING:
    from zoo.models.heads import LMHead


@runtime_checkable
class _FixedBuffers(Protocol):
    """A module with fixed tables to recompute (`zoo.blocks.position`)."""

    def reset_buffers(self) -> None: ...


_Model = TypeVar("_Model", bound="ZooModel")


class ZooModel(nn.Module):
    """Base of `EncoderModel`, `DecoderModel` and `EncoderDecoderModel`; ``model.spec`` built it."""

    spec: ModelSpec

    def num_parameters(self, *, trainable_only: bool = False) -> int:
        """Distinct parameters (a tied or shared tensor counts once)."""
        return sum(p.numel() for p in self.parameters() if p.requires_grad or not trainable_only)

    def train(self: _Model, mode: bool = True) -> _Model:
        """``nn.Module.train``; training mode also puts back weight matrices that single-row CPU decoding
        stored column-major (`zoo.generation.weight_layout`), so training always sees contiguous weights."""
        if mode:
            row_major(self)
        return super().train(mode)

    def reset_buffers(self) -> None:
        """Recompute fixed tables (sinusoids, rotary angles, ALiBi slopes), e.g. after a meta-device build."""
        for module in self.modules():
            if module is not self and isinstance(module, _FixedBuffers):
                module.reset_buffers()

    def extra_repr(self) -> str:
        return f"spec={self.spec.name or self.spec.family!r}"


def build_stack(spec: ModelSpec, name: str) -> Stack:
    """The ``name`` stack ("encoder" or "decoder") of ``spec``, with the model-level context it needs."""
    return Stack(
        spec.stacks()[name],
        embedding=spec.embedding,
        d_model=spec.d_model,
        max_positions=spec.max_positions,
        dropout=spec.dropout,
    )


def build_embedding(spec: ModelSpec, *, vocab_size: int | None = None) -> TokenEmbedding:
    """Token embeddings for ``spec`` (its target vocabulary unless ``vocab_size`` says otherwise)."""
    embedding = spec.embedding
    if not isinstance(embedding, EmbeddingSpec):  # the spec allows other front-ends in encoders only
        raise ValueError(f"embedding.kind {embedding.kind!r}: a {spec.family} model embeds tokens")
    return TokenEmbedding(embedding, vocab_size=vocab_size or spec.vocab_size, d_model=spec.d_model)


def build_front_end(spec: ModelSpec) -> TokenEmbedding | PatchEmbedding:
    """What turns an encoder's inputs into its first vectors: token embeddings, or image patches."""
    if isinstance(spec.embedding, PatchEmbeddingSpec):
        return PatchEmbedding(spec.embedding, d_model=spec.d_model)
    return build_embedding(spec)


def build_source_embedding(spec: EncoderDecoderSpec) -> TokenEmbedding | AudioEmbedding | None:
    """An encoder-decoder's own encoder input: a front-end (``encoder.embedding``: Whisper's audio
    convolutions), a separate source vocabulary's table, or None when the source shares the target's."""
    front_end = spec.encoder.embedding
    if front_end is not None:
        return AudioEmbedding(front_end, d_model=spec.d_model)
    return build_embedding(spec, vocab_size=spec.source_vocab_size) if spec.source_vocab_size else None


def aux_loss(*stacks: tuple[StackOutput, torch.Tensor | None]) -> torch.Tensor | None:
    """The load-balancing loss of every Mixture-of-Experts layer, summed over stacks; None without one.

    stacks: (a stack's output, the attention mask it ran with): a (B, cached + T) padding mask keeps
    padding out of the statistics; a (B, T, K) boolean mask, or none, counts every position."""
    total = None
    for out, mask in stacks:
        T = out.hidden.shape[1]
        padding = mask[:, -T:] if mask is not None and mask.dim() == 2 else None
        loss = load_balancing_loss([(r.probs, r.experts) for r in out.routers], padding)
        if loss is not None:
            total = loss if total is None else total + loss
    return total


@overload
def repeat_rows(tensor: torch.Tensor, times: int) -> torch.Tensor: ...
@overload
def repeat_rows(tensor: torch.Tensor | None, times: int) -> torch.Tensor | None: ...
def repeat_rows(tensor: torch.Tensor | None, times: int) -> torch.Tensor | None:
    """(B, ...) -> (B * times, ...), each row repeated in place (the beams of a sentence stay together)."""
    if tensor is None or times == 1:
        return tensor
    return tensor.repeat_interleave(times, dim=0)


class GenerationMixin:
    """The decoding half of `zoo.generation.protocol.GenerativeModel`, shared by the models that have a
    token embedding ``embed``, a ``decoder`` stack and an ``lm_head``; each model adds its own
    ``prepare_generation`` (what the decoder starts from) — and ``model.generate(...)``."""

    embed: TokenEmbedding
    decoder: Stack
    lm_head: LMHead | None

    def next_token_logits(
        self,
        ids: torch.Tensor,
        position_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        cache: StackCache | None,
        state: GenerationState,
    ) -> torch.Tensor:
        """ids (R, t) not yet in ``cache`` -> next-token logits (R, V): embed, run the decoder stack,
        project the last position only (slice first, so the prompt's other positions cost no logits).

        No data-dependent branches of its own, so ``torch.compile`` can trace it; attention_mask
        (R, cached + t) and position_ids (R or 1, t) come from generation's preallocated buffers.
        """
        hidden = self.decoder(
            self.embed(ids),
            attention_mask=attention_mask,
            position_ids=position_ids,
            memory=state.memory,
            memory_mask=state.memory_mask,
            cache=cache,
        ).hidden  # (R, t, C)
        assert self.lm_head is not None  # generation refuses a model without one (`check_model`)
        return self.lm_head(hidden[:, -1])  # (R, V)

    def all_token_logits(
        self,
        ids: torch.Tensor,
        position_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        cache: StackCache | None,
        state: GenerationState,
        keep: int,
    ) -> torch.Tensor:
        """`next_token_logits` for the last ``keep`` fed positions, (R, keep, V): speculative decoding verifies
        keep - 1 drafted tokens in one forward (`zoo.generation.speculative`)."""
        hidden = self.decoder(
            self.embed(ids),
            attention_mask=attention_mask,
            position_ids=position_ids,
            memory=state.memory,
            memory_mask=state.memory_mask,
            cache=cache,
        ).hidden  # (R, t, C)
        assert self.lm_head is not None
        return self.lm_head(hidden[:, -keep:])  # (R, keep, V)

    @overload
    def generate(
        self: GenerativeModel,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = ...,
        config: Any = ...,
        *,
        return_scores: Literal[False] = ...,
        **kwargs: Any,
    ) -> torch.Tensor: ...
    @overload
    def generate(
        self: GenerativeModel,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = ...,
        config: Any = ...,
        *,
        return_scores: Literal[True],
        **kwargs: Any,
    ) -> GenerationOutput: ...
    def generate(
        self: GenerativeModel,  # the mixin's host model: a decoder or encoder-decoder
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        config: Any = None,
        *,
        return_scores: bool = False,
        **kwargs: Any,
    ) -> torch.Tensor | GenerationOutput:
        """Greedy, sampling or beam search; see `zoo.generation.generate` for every argument."""
        if return_scores:
            return generate(self, input_ids, attention_mask, config, return_scores=True, **kwargs)
        return generate(self, input_ids, attention_mask, config, **kwargs)
