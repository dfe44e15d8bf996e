"""What generation needs of a model: the `GenerativeModel` protocol.

`DecoderModel` and `EncoderDecoderModel` implement it; generation calls only these members (and
`nn.Module`'s ``parameters`` / ``train`` / ``eval``), never a model's submodules, and never asks its family.
Shapes: B batch, N rows per input (beams, or samples), R = B * N rows, T prompt length, t tokens fed this step, V vocab, S source length.

    generate(model, input_ids (B, T), attention_mask (B, T)[, decoder_input_ids (B, P)])
      │ check the call against spec.max_positions, `input_vocab_size`, `continues_input`; begin a
      │ decoder prompt with `decoder_start_token_id` (`zoo.generation.prompt`)
      v
    state = model.prepare_generation(input_ids, attention_mask, num_beams=N)     once per run
      │ state.prompt (R, T') starts the token buffer; state.stack sizes the KV cache
      v
    logits = model.next_token_logits(ids, position_ids, mask, cache, state)      once per step, (R, V)
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn

from zoo.spec import ModelSpec
from zoo.stacks import Stack, StackCache

__all__ = ["GenerationState", "GenerativeModel"]


@dataclass(frozen=True)
class GenerationState:
    """What a model hands generation for one run (`prepare_generation`); R = batch x beams rows.

    Generation never imports a model: it sees one only through this state and `GenerativeModel`.
    """

    prompt: torch.Tensor  # (R, T) the decoder's first tokens: the prompt itself, or the start token
    prompt_mask: torch.Tensor | None  # (R, T) 1 = token, 0 = (left) padding; None when there is none
    stack: Stack  # the decoder stack, which a KV cache is sized for and filled by
    memory: torch.Tensor | None = None  # (R, S, C) the encoder output, computed once per run
    memory_mask: torch.Tensor | None = None  # (R, S) the source padding for cross-attention


@runtime_checkable
class GenerativeModel(Protocol):
    """A model `zoo.generation.generate` can decode from (an `nn.Module` with these members)."""

    # Read-only properties here, so a model may narrow them (``spec: DecoderSpec``, a ``ClassVar`` flag).
    @property
    def spec(self) -> ModelSpec:
        """max_positions, vocab_size, eos/pad token ids; ``lm_head: null`` means no LM head."""
        ...

    @property
    def continues_input(self) -> bool:
        """True: the output continues ``input_ids`` (a decoder's prompt: left-padded, returned with the new
        tokens). False: ``input_ids`` are a source the output is conditioned on (an encoder-decoder's)."""
        ...

    # What generation uses of `nn.Module`: the parameters' device and dtype, and eval mode while decoding.
    training: bool

    def parameters(self, recurse: bool = True) -> Iterator[nn.Parameter]: ...

    def train(self, mode: bool = True) -> Any: ...

    def eval(self) -> Any: ...

    @property
    def input_vocab_size(self) -> int:
        """Ids of ``input_ids`` must lie in [0, input_vocab_size) (an encoder-decoder's source vocabulary)."""
        ...

    @property
    def decoder_start_token_id(self) -> int | None:
        """The token an encoder-decoder's decoder starts from (None for a decoder-only model): a decoder
        prompt (``decoder_input_ids``) must begin with it, or is given it (`zoo.generation.prompt`)."""
        ...

    def prepare_generation(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        *,
        num_beams: int,
        decoder_input_ids: torch.Tensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
    ) -> GenerationState:
        """Everything computed once per run, before the first step: input_ids (B, T) and attention_mask
        (B, T; None when nothing is padded) -> the decoder's prompt (R, T') and its padding, the decoder
        stack a KV cache is built for, and any memory (an encoder output, (R, S, C), with its mask).
        Rows come in sentence order, the N rows of a sentence (its beams, or its samples) next to each other.

        ``decoder_input_ids`` (B, P) and ``decoder_attention_mask`` (B, P; None when nothing is padded), an
        encoder-decoder's decoder prompt, are passed only when a call gives one: already checked and begun
        with the start token, the decoder starts from them instead of the start token alone."""
        ...

    def next_token_logits(
        self,
        ids: torch.Tensor,
        position_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        cache: StackCache | None,
        state: GenerationState,
    ) -> torch.Tensor:
        """One decoder step: ids (R, t) — the tokens ``cache`` has not seen (all of them without a cache)
        — at position_ids (R or 1, t), attention_mask (R, cached + t) or None -> next-token logits (R, V)
        in the model's dtype. Writes the new keys/values into ``cache``. Must trace under
        ``torch.compile`` (no data-dependent Python branches)."""
        ...
