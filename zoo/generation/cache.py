"""A key/value cache preallocated for a whole generation run (one per decoder stack).

Shapes: B batch (beams included), K key/value heads, L max length (prompt + new tokens), D head dim,
N attention applications in the stack (``num_layers``, also with ALBERT-style shared weights).

    self-attention   one (N, 2, B, K, L, D) buffer, allocated once. Step t writes its keys/values at
                     [length, length + T) and attention reads the views [:, :, :length + T]:
                     no torch.cat, no reallocation, the prompt is never recomputed.
    cross-attention  the encoder output's keys/values, projected once at the first decoder step and
                     reused by every later step (and shared by every beam of a sentence).

The stack reads ``length`` (keys cached before this forward), hands ``layers[i]`` to application i and
calls ``advance(T)`` once all layers have written their T new positions (`zoo.stacks.StackCache`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import torch

if TYPE_CHECKING:
    from zoo.layers import Layer
    from zoo.stacks import Stack


class SelfAttentionSlot:
    """One self-attention application's slice of the shared buffer (`zoo.blocks.attention.KVSlot`)."""

    filled = False  # self-attention always projects the new tokens; only cross-attention reuses

    def __init__(self, cache: KVCache, keys: torch.Tensor, values: torch.Tensor) -> None:
        self._cache, self._keys, self._values = cache, keys, values  # (B, K, L, D) views of the buffer

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write this step's k, v (B, K, T, D); return every key/value so far, (B, K, length + T, D) views."""
        start = self._cache.length
        end = start + k.shape[2]
        if end > self._keys.shape[2]:
            raise ValueError(
                f"KV cache overflow: {start} cached + {k.shape[2]} new positions exceed the "
                f"preallocated max_length ({self._keys.shape[2]})"
            )
        self._keys[:, :, start:end] = k
        self._values[:, :, start:end] = v
        return self._keys[:, :, :end], self._values[:, :, :end]

    def get(self) -> tuple[torch.Tensor, torch.Tensor]:
        end = self._cache.length
        return self._keys[:, :, :end], self._values[:, :, :end]


class CrossAttentionSlot:
    """The encoder output's keys/values (B, K, S, D) for one cross-attention application, stored once."""

    def __init__(self, dtype: torch.dtype) -> None:
        self.filled, self.dtype = False, dtype
        self._kv: tuple[torch.Tensor, torch.Tensor] | None = None

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self._kv, self.filled = (k.to(self.dtype), v.to(self.dtype)), True
        return self._kv

    def get(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self._kv is None:
            raise RuntimeError("cross-attention cache read before the first decoder step filled it")
        return self._kv


def cache_dtype(model_dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """The dtype keys/values are cached in: the model's, except float32 for a half-precision model on CPU.

    There, torch's bfloat16 attention kernel for one query over a long cache is several times slower than
    the float32 one (measured 6x at 160 keys, batch 8); the cache is small next to the weights, and the
    keys/values were computed in the model's precision anyway, so storing them wider loses nothing.
    """
    if device.type == "cpu" and model_dtype in (torch.bfloat16, torch.float16):
        return torch.float32
    return model_dtype


@dataclass
class LayerSlots:
    self_attn: SelfAttentionSlot
    cross_attn: CrossAttentionSlot | None


class KVCache:
    """Preallocated keys/values for every attention application of one stack.

    >>> cache = KVCache.for_stack(model.decoder, batch_size=2, max_length=64)
    >>> model(prompt, cache=cache); model(next_token, cache=cache)  # the second call reads the prompt's keys
    """

    def __init__(
        self,
        *,
        num_layers: int,
        batch_size: int,
        num_kv_heads: int,
        head_dim: int,
        max_length: int,
        cross_attention: bool,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        self.length = 0
        self.max_length = max_length
        self.buffer = torch.empty(
            num_layers, 2, batch_size, num_kv_heads, max_length, head_dim, dtype=dtype, device=device
        )  # (N, 2, B, K, L, D); only positions < length are ever read
        self.layers = [
            LayerSlots(
                SelfAttentionSlot(self, self.buffer[i, 0], self.buffer[i, 1]),
                CrossAttentionSlot(dtype) if cross_attention else None,
            )
            for i in range(num_layers)
        ]

    @classmethod
    def for_stack(
        cls, stack: Stack, *, batch_size: int, max_length: int, dtype: torch.dtype | None = None
    ) -> KVCache:
        """A cache sized for ``stack``: its heads, width and device.

        ``dtype`` defaults to `cache_dtype` of the stack's weights.
        """
        first = cast("Layer", stack.layers[0])  # nn.ModuleList types its items as Module; these are Layers
        attention = first.self_attn
        weight = attention.qkv_proj.weight
        return cls(
            num_layers=stack.num_layers,
            batch_size=batch_size,
            num_kv_heads=attention.num_kv_heads,
            head_dim=attention.head_dim,
            max_length=max_length,
            cross_attention=first.cross_attn is not None,
            dtype=dtype or cache_dtype(weight.dtype, weight.device),
            device=weight.device,
        )

    def advance(self, steps: int) -> None:
        """Called by the stack after every layer wrote its ``steps`` new positions."""
        self.length += steps

    def reorder(self, rows: torch.Tensor) -> None:
        """Beam search: row i of the cache becomes old row ``rows[i]`` (B,). Cross-attention keys need no
        reordering: beams only move within their own sentence, whose encoder output they all share."""
        filled = self.buffer[:, :, :, :, : self.length]  # (N, 2, B, K, length, D)
        filled.copy_(filled.index_select(2, rows))
