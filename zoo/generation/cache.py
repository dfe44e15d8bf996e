"""A key/value cache preallocated for a whole generation run (one per decoder stack).

Shapes: B batch (beams included), K key/value heads, L max length (prompt + new tokens), D head dim,
N attention applications in the stack (``num_layers``, also with ALBERT-style shared weights).

    self-attention   one (N, 2, B, K, L, D) buffer, allocated once. Step t writes its keys/values at
                     [length, length + T) and attention reads the views [:, :, :length + T]:
                     no torch.cat, no reallocation, the prompt is never recomputed.
    cross-attention  the encoder output's keys/values, projected once at the first decoder step and
                     reused by every later step (and shared by every beam of a sentence).
    rolling          the causal sliding-window layers of a stack (all of Mistral's, Gemma 2/3's local
                     ones) keep only W = the largest window: an (N_local, 2, B, K, W, D) buffer written
                     cyclically, position p in slot p % W, so their memory is bounded by the window, not by
                     max_length (`RollingSlot`); the stack's other layers keep the full (N_full, ..., L, D)
                     buffer beside it.

A rolling slot hands attention its keys in slot order; ``key_positions`` tells the stack where each one
sits, and the sliding-window layers' mask is built from those positions (`zoo.blocks.masks.make_frame`);
the full layers' keys are in order. Keys are stored already rotated (rotary), so a slot's key needs no
position of its own. A stack that adds a position bias (ALiBi, T5) that expects keys in order keeps the full
buffer for every layer.

The stack reads ``length`` (keys cached before this forward), hands ``layers[i]`` to application i and
calls ``advance(T)`` once all layers have written their T new positions (`zoo.stacks.StackCache`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import torch

from zoo.spec import SlidingWindowPattern

if TYPE_CHECKING:
    from zoo.layers import Layer
    from zoo.stacks import Stack


class Cursor:
    """How many positions a cache holds: shared by the cache and its slots.

    The slots read the length from here rather than from the `KVCache` that owns them, so no reference
    cycle (cache -> slots -> cache) keeps a finished run's buffers alive until the cyclic garbage collector
    happens to run: they are freed as soon as the last reference goes, before the next run allocates its own.
    """

    __slots__ = ("length",)

    def __init__(self) -> None:
        self.length = 0


class SelfAttentionSlot:
    """One self-attention application's slice of the shared buffer (`zoo.blocks.attention.KVSlot`)."""

    filled = False  # self-attention always projects the new tokens; only cross-attention reuses

    def __init__(self, cursor: Cursor, keys: torch.Tensor, values: torch.Tensor) -> None:
        self._cache, self._keys, self._values = cursor, keys, values  # (B, K, L, D) views of the buffer

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

    @property
    def buffers(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The whole preallocated keys and values, (B, K, L, D) views, written or not
        (`zoo.generation.graphs` attends to all L positions under a mask)."""
        return self._keys, self._values


class RollingSlot:
    """One self-attention application's W slots of a rolling buffer (`zoo.blocks.attention.KVSlot`).

    A step of one token writes slot ``position % W`` and attends to all W slots: they hold exactly the
    last W positions. A longer chunk (the prompt) attends to the slots' old keys followed by its own,
    and then keeps its last W in the slots.
    """

    filled = False

    def __init__(self, cursor: Cursor, keys: torch.Tensor, values: torch.Tensor) -> None:
        self._cache, self._keys, self._values = cursor, keys, values  # (B, K, W, D) views of the buffer

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write this step's k, v (B, K, T, D); return what attention sees, in `KVCache.key_positions` order."""
        start, T, W = self._cache.length, k.shape[2], self._keys.shape[2]
        if T == 1:
            self._keys[:, :, start % W] = k[:, :, 0]
            self._values[:, :, start % W] = v[:, :, 0]
            return self._keys, self._values  # (B, K, W, D)
        seen = (
            (k, v)
            if start == 0
            else (
                torch.cat([self._keys, k.to(self._keys.dtype)], 2),
                torch.cat([self._values, v.to(self._values.dtype)], 2),
            )
        )  # (B, K, [W +] T, D), taken before the slots are overwritten
        kept = min(T, W)
        slots = torch.arange(start + T - kept, start + T, device=k.device) % W
        self._keys.index_copy_(2, slots, k[:, :, T - kept :].to(self._keys.dtype))
        self._values.index_copy_(2, slots, v[:, :, T - kept :].to(self._values.dtype))
        return seen

    def get(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self._keys, self._values


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
    self_attn: SelfAttentionSlot | RollingSlot
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
        window: int | None = None,
        rolling_layers: Sequence[bool] | None = None,
    ) -> None:
        """``window``: the slots of the rolling layers (None, or at least ``max_length``: none roll);
        ``rolling_layers``: which layers roll, one flag per application (default: all, given a window)."""
        self.cursor = Cursor()
        self.max_length = max_length
        self.window = window if window is not None and window < max_length else None  # None: not rolling
        if self.window is None:
            rolls = [False] * num_layers
        else:
            rolls = list(rolling_layers) if rolling_layers is not None else [True] * num_layers
        if len(rolls) != num_layers:
            raise ValueError(f"rolling_layers has {len(rolls)} flags for {num_layers} layers")
        self.rolling_layers = tuple(rolls)
        num_local = sum(rolls)
        shape = (2, batch_size, num_kv_heads)
        # (N, 2, B, K, L or W, D); only positions < length are ever read
        full = (
            torch.empty(num_layers - num_local, *shape, max_length, head_dim, dtype=dtype, device=device)
            if num_local < num_layers
            else None
        )
        self.local_buffer = (
            # zeros, not empty: a slot not yet written is masked, but a weight of 0 times a NaN left in
            # uninitialised memory is still NaN
            torch.zeros(num_local, *shape, self.window or 0, head_dim, dtype=dtype, device=device)
            if num_local
            else None
        )
        buffer = full if full is not None else self.local_buffer
        assert buffer is not None  # num_layers >= 1
        self.buffer = buffer  # the full layers' buffer, or the rolling one when every layer rolls
        self._buffers = [b for b in (full, self.local_buffer) if b is not None]
        index = {True: 0, False: 0}  # the next row of each buffer
        self.layers = []
        for rolling in rolls:
            own = self.local_buffer if rolling else full
            assert own is not None
            row, index[rolling] = index[rolling], index[rolling] + 1
            slot = (RollingSlot if rolling else SelfAttentionSlot)(self.cursor, own[row, 0], own[row, 1])
            self.layers.append(LayerSlots(slot, CrossAttentionSlot(dtype) if cross_attention else None))

    @classmethod
    def for_stack(
        cls,
        stack: Stack,
        *,
        batch_size: int,
        max_length: int,
        dtype: torch.dtype | None = None,
        rolling: bool = True,
    ) -> KVCache:
        """A cache sized for ``stack``: its heads, width and device; its causal sliding-window layers
        rolling (W slots, the largest window) unless a position bias needs the keys in order, or
        ``rolling`` is False (speculative decoding: a rolling slot cannot take back a rejected token, whose
        write overwrote a key still in the window; the full buffer under the window's mask can).

        ``dtype`` defaults to `cache_dtype` of the stack's weights.
        """
        first = cast("Layer", stack.layers[0])  # nn.ModuleList types its items as Module; these are Layers
        attention = first.self_attn
        weight = attention.out_proj.weight
        return cls(
            num_layers=stack.num_layers,
            batch_size=batch_size,
            num_kv_heads=attention.cache_heads,  # latent attention: one "head" of half its latent + rope key
            head_dim=attention.cache_dim,
            max_length=max_length,
            cross_attention=first.cross_attn is not None,
            dtype=dtype or cache_dtype(weight.dtype, weight.device),
            device=weight.device,
            window=rolling_window(stack) if rolling else None,
            rolling_layers=[isinstance(pattern, SlidingWindowPattern) for pattern in stack.patterns.all],
        )

    @property
    def length(self) -> int:
        """Positions cached so far (the keys every layer holds before the next forward)."""
        return self.cursor.length

    @length.setter
    def length(self, value: int) -> None:
        self.cursor.length = value

    def key_positions(self, new: int) -> torch.Tensor | None:
        """Where the keys a rolling layer sees in the next forward of ``new`` tokens sit ((Tk,), -1 = an empty
        slot), in the order the slots hand them over; None when no layer rolls. The stack applies them to its
        sliding-window layers, the ones that roll; the others see 0 .. length + new - 1."""
        if self.window is None:
            return None
        device, W, start = self.buffer.device, self.window, self.length
        if new > 1 and start == 0:
            return torch.arange(new, device=device)
        last = start if new == 1 else start - 1  # the newest position in the slots when attention reads them
        slots = torch.arange(W, device=device)
        held = last - (last - slots) % W  # slot s holds the newest position <= last that is s modulo W
        held = held.masked_fill(held < 0, -1)  # (W,)
        if new == 1:
            return held
        return torch.cat([held, torch.arange(start, start + new, device=device)])

    def advance(self, steps: int) -> None:
        """Called by the stack after every layer wrote its ``steps`` new positions."""
        self.cursor.length += steps

    def crop(self, length: int) -> None:
        """Forget every position from ``length`` on (speculative decoding's rejected tokens); the next forward
        overwrites them. Only a cache without rolling layers can (see `for_stack`'s ``rolling``)."""
        if self.window is not None:
            raise ValueError(
                "KVCache.crop: a rolling cache cannot take back positions; build it rolling=False"
            )
        self.length = min(self.length, length)

    def clear(self) -> None:
        """Forget every cached self-attention key and value (the next forward starts at position slot 0);
        cross-attention's encoder keys stay, as the encoder output does."""
        self.length = 0

    def reorder(self, rows: torch.Tensor) -> None:
        """Beam search: row i of the cache becomes old row ``rows[i]`` (B,). Cross-attention keys need no
        reordering: beams only move within their own sentence, whose encoder output they all share."""
        for buffer in self._buffers:
            filled = buffer[:, :, :, :, : self.length]  # (N, 2, B, K, length or W, D)
            filled.copy_(filled.index_select(2, rows))


def rolling_window(stack: Stack) -> int | None:
    """The slots the rolling layers of ``stack`` keep: the largest of its sliding windows, in a causal stack
    whose positions are not a bias over ordered keys; else None (a full cache for every layer)."""
    windows = [p.window for p in stack.patterns.all if isinstance(p, SlidingWindowPattern)]
    if not stack.causal or stack.positions.role == "bias" or stack.position_bias is not None or not windows:
        return None
    return max(windows)
