"""The model side of one generation run: the token buffer, the mask, positions, the KV cache, the step.

Shapes: B rows (batch x beams), L = decoder prompt length + max_new_tokens, V vocab, S source length.

    decoder-only:     tokens = prompt (B, T) ++ new tokens; the mask and positions come from the prompt's
                      left padding (positions count real tokens only, so a padded row matches itself alone).
    encoder-decoder:  the encoder runs once; tokens = [decoder start] ++ new tokens; the cross-attention
                      keys/values are projected at the first step and cached.

Everything that grows is preallocated for the whole run: the (B, L) token buffer, the (B, L) mask (the
prompt's padding followed by ones), the (B, L) position table, and the KV cache. A step slices views out
of them, runs only the tokens the cache has not seen, and computes logits for the last position only.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from zoo.generation.cache import KVCache

StepFn = Callable[..., torch.Tensor]


def decode_step(
    model: nn.Module,
    ids: torch.Tensor,
    position_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    cache: KVCache | None,
    memory: torch.Tensor | None,
    memory_mask: torch.Tensor | None,
) -> torch.Tensor:
    """ids (B, t) -> next-token logits (B, V): embed, run the decoder stack, project the last position.

    One function with no data-dependent branches of its own, so ``torch.compile`` can trace it; a cache of
    fixed size keeps the buffers' shapes static (only the attended length grows).
    """
    hidden = model.decoder(
        model.embed(ids),
        attention_mask=attention_mask,
        position_ids=position_ids,
        memory=memory,
        memory_mask=memory_mask,
        cache=cache,
    ).hidden  # (B, t, C)
    return model.lm_head(hidden[:, -1])  # (B, V): slice first, so the prompt's other positions cost no logits


class Session:
    """Prefill and step a decoder (with or without a cache) over a growing, preallocated token buffer."""

    def __init__(
        self,
        model: nn.Module,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        *,
        max_new_tokens: int,
        num_beams: int = 1,
        use_cache: bool = True,
        step: StepFn = decode_step,
    ) -> None:
        self.model, self.step = model, step
        device = input_ids.device
        if attention_mask is not None and bool(attention_mask.bool().all()):
            attention_mask = None  # no padding: no mask at all, SDPA runs its causal / unmasked fast path
        self.memory = self.memory_mask = None
        if model.spec.family == "encoder-decoder":
            self.memory = model.encode(input_ids, attention_mask).hidden  # (B, S, C), once per run
            self.memory_mask = attention_mask
            if num_beams > 1:  # beams of a sentence share its encoder output
                self.memory = self.memory.repeat_interleave(num_beams, dim=0)
                if self.memory_mask is not None:
                    self.memory_mask = self.memory_mask.repeat_interleave(num_beams, dim=0)
            prompt = torch.full(
                (input_ids.shape[0] * num_beams, 1),
                model.spec.start_token_id,
                dtype=torch.long,
                device=device,
            )
            prompt_mask = None
        else:
            prompt = input_ids.long().repeat_interleave(num_beams, dim=0)
            prompt_mask = (
                attention_mask.repeat_interleave(num_beams, dim=0) if attention_mask is not None else None
            )
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
        self.cache = KVCache.for_stack(model.decoder, batch_size=B, max_length=L) if use_cache else None

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
        return self.step(
            self.model,
            self.tokens[:, start:end],
            self.positions[:, start:end],
            self.mask[:, :end] if self.mask is not None else None,
            self.cache,
            self.memory,
            self.memory_mask,
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
