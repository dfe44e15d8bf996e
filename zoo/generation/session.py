"""The model side of one generation run: the token buffer, the mask, positions, the KV cache, the step.

Shapes: B rows (batch x beams), L = decoder prompt length + max_new_tokens, V vocab, S source length.

    tokens = state.prompt (B, T) ++ new tokens, where the model's `prepare_generation` says what the
    decoder starts from: a decoder-only model's prompt, or an encoder-decoder's start token or decoder
    prompt (after running its encoder once; the cross-attention keys/values are then projected at the
    first step and cached). A prompt of any length is prefilled in one step.
    The mask and positions come from the prompt's left padding (positions count real tokens only, so a
    padded row matches itself alone); each step asks the model for `next_token_logits`.

Everything that grows is preallocated for the whole run: the (B, L) token buffer, the (B, L) mask (the
prompt's padding followed by ones), the (B, L) position table, and the KV cache. A step slices views out
of them, runs only the tokens the cache has not seen, and computes logits for the last position only.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from zoo.generation.cache import KVCache
from zoo.generation.protocol import GenerationState, GenerativeModel

# (model, ids, position_ids, attention_mask, cache, state) -> next-token logits (B, V)
StepFn = Callable[
    [GenerativeModel, torch.Tensor, torch.Tensor, torch.Tensor | None, KVCache | None, GenerationState],
    torch.Tensor,
]


def decode_step(
    model: GenerativeModel,
    ids: torch.Tensor,
    position_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    cache: KVCache | None,
    state: GenerationState,
) -> torch.Tensor:
    """ids (B, t) -> next-token logits (B, V): the function ``torch.compile`` traces (`compiled_decode_step`).

    A plain function around the model's method, so its compiled graphs live on zoo's own code; a cache of
    fixed size keeps the buffers' shapes static (only the attended length grows).
    """
    return model.next_token_logits(ids, position_ids, attention_mask, cache, state)


class Session:
    """Prefill and step a decoder (with or without a cache) over a growing, preallocated token buffer."""

    def __init__(
        self,
        model: GenerativeModel,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        *,
        max_new_tokens: int,
        num_beams: int = 1,
        use_cache: bool = True,
        step: StepFn = decode_step,
        decoder_prompt: tuple[torch.Tensor, torch.Tensor | None] | None = None,
        rolling: bool = True,
    ) -> None:
        """``num_beams``: rows per input (beams, or independent samples); ``decoder_prompt``: an
        encoder-decoder's checked decoder ids (B, P) and padding mask or None (`zoo.generation.prompt`);
        ``rolling``: False keeps a full KV cache for sliding-window layers too (`KVCache.for_stack`)."""
        self.model, self.step = model, step
        device = input_ids.device
        if attention_mask is not None and bool(attention_mask.bool().all()):
            # No padding: no mask at all, SDPA runs its causal / unmasked fast path. Asked here, once per run on
            # the host; a stack applies any mask it is given without asking (`zoo.blocks.masks`).
            attention_mask = None
        if decoder_prompt is None:  # the keywords only when used: a model of one's own need not take them
            self.state = model.prepare_generation(input_ids, attention_mask, num_beams=num_beams)
        else:
            ids, mask = decoder_prompt
            self.state = model.prepare_generation(
                input_ids,
                attention_mask,
                num_beams=num_beams,
                decoder_input_ids=ids,
                decoder_attention_mask=mask,
            )
        prompt, prompt_mask = self.state.prompt, self.state.prompt_mask
        B, T = prompt.shape
        L = T + max_new_tokens
        self.prompt_length = self.length = T
        self.tokens = torch.empty(B, L, dtype=torch.long, device=device)  # (B, L)
        self.tokens[:, :T] = prompt
        if prompt_mask is None:
            self.mask = None
            self.positions = torch.arange(L, device=device)[None]  # (1, L), shared by every row
        else:
            self.mask = torch.ones(B, L, dtype=torch.bool, device=device)  # (B, L): new tokens are real
            self.mask[:, :T] = prompt_mask.bool()
            self.positions = (self.mask.long().cumsum(dim=1) - 1).clamp(min=0)  # (B, L), left pads skipped
        # L - 1 positions would do (the last new token is never fed back); one spare keeps every view of the
        # buffer non-contiguous, so torch.compile does not recompile for the step that would fill it.
        self.cache = (
            KVCache.for_stack(self.state.stack, batch_size=B, max_length=L, rolling=rolling)
            if use_cache
            else None
        )
        self.refill_column = self._refill_column() if self.cache is not None else None

    def _refill_column(self) -> int | None:
        """The first token column whose forward switches the stack's rotary tables (LongRoPE, `switch_length`:
        a forward reads the long tables once any of its positions reaches past the original context).

        Keys cached before that column were rotated with the short tables, so the step that first feeds it
        recomputes the whole sequence instead (transformers' Phi-3 drops its cache at that step too): every
        step's logits then equal an uncached forward over the sequence so far. None: nothing switches.
        """
        switch = getattr(self.state.stack.positions, "switch_length", None)
        if switch is None:
            return None
        longest = self.positions.amax(dim=0)  # (L,) the largest position of each column (non-decreasing)
        past = (longest + 1 >= switch).nonzero()  # one host sync per run, for LongRoPE models only
        return int(past[0, 0]) if len(past) else None

    @property
    def batch_size(self) -> int:
        return self.tokens.shape[0]

    @property
    def sequences(self) -> torch.Tensor:
        """(B, length): the prompt (or start token) and every token appended so far."""
        return self.tokens[:, : self.length]

    @property
    def valid(self) -> torch.Tensor | None:
        """(B, length) bool: which positions of `sequences` are real tokens; None when all are."""
        return self.mask[:, : self.length] if self.mask is not None else None

    def logits(self) -> torch.Tensor:
        """Next-token logits (B, V) after the current sequences, in the model's dtype."""
        start = self.cache.length if self.cache is not None else 0  # without a cache: the whole sequence
        end = self.length
        if (
            self.cache is not None
            and self.refill_column is not None
            and 0 < start <= self.refill_column < end
        ):
            self.cache.clear()  # the cached keys were rotated with the tables this forward no longer uses
            start = 0
        # The first forward of a run (the prompt's prefill; an encoder-decoder's first step, which projects
        # the encoder's keys/values into the cache) runs eagerly: a compiled step would compile a second graph
        # for it (torch.compile specialises one token against many, and the cross-attention path differs
        # once its cache is filled), and a frozen graph holds its own copy of the weights. It is one call of
        # large matmuls that eager runs at full speed; the per-token steps are where compile pays.
        step = decode_step if self.cache is not None and (start == 0 or end - start > 1) else self.step
        return step(
            self.model,
            self.tokens[:, start:end],
            self.positions[:, start:end],
            self.mask[:, :end] if self.mask is not None else None,
            self.cache,
            self.state,
        )

    def append(self, tokens: torch.Tensor) -> None:
        """Write the next token of every row, (B,)."""
        self.tokens[:, self.length] = tokens
        self.length += 1

    def reorder(self, rows: torch.Tensor) -> None:
        """Beam search: row i continues old row ``rows[i]`` (B,). Masks and positions are equal across the
        beams of a sentence, and beams never leave their sentence, so only tokens and keys/values move."""
        filled = self.tokens[:, : self.length]
        filled.copy_(filled.index_select(0, rows))
        if self.cache is not None:
            self.cache.reorder(rows)
