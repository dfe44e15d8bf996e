"""An encoder-decoder's running batch: each slot's source, beside its decoder keys (`zoo.serving.slots`).

Shapes: B slots (``max_batch``), S columns (the longest source a live slot holds), C model width,
N decoder layers (each with one cross-attention), K key/value heads, D head dim.

A slot's source is encoded once, when its request joins; what the decoder reads of it every step stays here:

    memory     (B, S, C)            the encoder output
    keys       (N, 2, B, K, S, D)   each decoder layer's cross-attention keys and values, projected once
    mask       (B, S)               True where the slot's source has a token

Sources are left-aligned, columns [0, length) of their row, so a slot's cross-attention is that of its
source alone, padded on the right::

    column      0 1 2 3 4 5 6        width = 7 (the longest live source)
    slot 0      s s s . . . .        a 3-token source
    slot 1      s s s s s s s
    slot 2      . . . . . . .        free: its mask row is empty (`zoo.blocks.masks.padding_mask` lets an
                                     empty row read every stale, finite key rather than none)

A step attends to ``width`` columns, the longest source still running (it shrinks when that request
leaves); the buffers grow, doubling, up to the model's ``max_positions`` as longer sources arrive, so a
server of short sentences does not hold keys for its longest possible one.

A beam group (a request's beams in several slots) shares one source: `place` puts the same encode in each
of its slots (rows repeated), and reordering beams moves only their decoder keys, never these columns.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from zoo.generation.cache import cache_dtype
from zoo.stacks import Stack

FIRST_WIDTH = 64  # the columns held at first (grown by doubling)
LIKE = 0.75  # sources are encoded together while the group's shortest is this part of its longest
SHORT = 16  # sources this short share a group whatever their lengths (their padding costs little)


def like_lengths(lengths: Sequence[int], rows: Sequence[int], *, slots: int, budget: int) -> list[int]:
    """The sources to encode together, as indices into ``lengths`` (the waiting sources, in arrival order):
    the first always, then in order each one that keeps the group's lengths alike (its shortest at least
    `LIKE` times its longest, or all at most `SHORT`), its slots (``rows`` each: a beam request's
    ``best_of``) within ``slots`` and its padded tokens (count * longest) within ``budget``.

    >>> like_lengths([40, 8, 36, 12, 60], [1] * 5, slots=8, budget=512)
    [0, 2]
    """
    chosen, low, high, used = [0], lengths[0], lengths[0], rows[0]
    for i in range(1, len(lengths)):
        lo, hi = min(low, lengths[i]), max(high, lengths[i])
        alike = hi <= SHORT or lo >= LIKE * hi
        if alike and used + rows[i] <= slots and hi * (len(chosen) + 1) <= budget:
            chosen.append(i)
            low, high, used = lo, hi, used + rows[i]
    return chosen


class _Filled:
    """One decoder layer's cross-attention slot over slots [0, rows): already filled, read at the current
    width (`zoo.blocks.attention.KVSlot`: ``filled`` tells attention to reuse, not project)."""

    filled = True

    def __init__(self, sources: SourceSlots, layer: int, rows: int) -> None:
        self._sources, self._layer, self._rows = sources, layer, rows

    def get(self) -> tuple[torch.Tensor, torch.Tensor]:
        keys = self._sources.keys[self._layer, :, : self._rows, :, : self._sources.width]  # (2, R, K, S, D)
        return keys[0], keys[1]

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        raise RuntimeError("a slot's cross-attention keys are placed when its request joins, never projected")


class SourceSlots:
    """Each slot's encoder output, cross-attention keys/values and source mask (see the module docstring)."""

    def __init__(self, stack: Stack, *, slots: int, length: int) -> None:
        """``length``: the longest source."""
        attention: Any = stack.layers[0].cross_attn  # nn.ModuleList types its items as Module
        if attention is None:
            raise ValueError("SourceSlots needs a decoder stack with cross-attention")
        weight = next(stack.parameters())
        self.slots, self.max_length = slots, length
        self.num_layers, self.num_kv_heads, self.head_dim = (
            stack.num_layers,
            attention.num_kv_heads,
            attention.head_dim,
        )
        self.d_model = attention.q_proj.in_features
        self.dtype, self.model_dtype, self.device = (
            cache_dtype(weight.dtype, weight.device),
            weight.dtype,
            weight.device,
        )
        self.lengths = [0] * slots  # each slot's source tokens (0: free)
        self.width = 1
        self.keys, self.memory, self.mask = self._buffers(min(FIRST_WIDTH, length))

    def _buffers(self, columns: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Keys/values (N, 2, B, K, columns, D), memory (B, columns, C) and mask (B, columns), all zeros."""
        B = self.slots
        # zeros, not empty: a free or padded column is still multiplied by a weight of 0, and 0 * NaN is NaN
        keys = torch.zeros(
            self.num_layers,
            2,
            B,
            self.num_kv_heads,
            columns,
            self.head_dim,
            dtype=self.dtype,
            device=self.device,
        )  # (N, 2, B, K, S, D)
        memory = torch.zeros(
            B, columns, self.d_model, dtype=self.model_dtype, device=self.device
        )  # (B, S, C)
        mask = torch.zeros(B, columns, dtype=torch.bool, device=self.device)  # (B, S)
        return keys, memory, mask

    def _allocate(self, columns: int) -> None:
        """Grow to ``columns`` columns, keeping what the buffers hold."""
        keys, memory, mask = self._buffers(columns)
        old = self.columns
        keys[:, :, :, :, :old] = self.keys
        memory[:, :old] = self.memory
        mask[:, :old] = self.mask
        self.keys, self.memory, self.mask = keys, memory, mask

    @property
    def columns(self) -> int:
        """The columns the buffers hold now."""
        return self.keys.shape[4]

    def layer(self, index: int, rows: int) -> _Filled:
        """Layer ``index``'s cross-attention slot over slots [0, rows) (reads the buffers as they stand)."""
        return _Filled(self, index, rows)

    def read(self, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The memory (rows, width, C) and mask (rows, width) of slots [0, rows) for one decoder step."""
        return self.memory[:rows, : self.width], self.mask[:rows, : self.width]

    def place(self, rows: torch.Tensor, memory: torch.Tensor, keys: torch.Tensor, mask: torch.Tensor) -> None:
        """Put encoded sources into slots ``rows`` (k,): memory (k, S, C), cross-attention keys/values
        (N, 2, k, K, S, D) and the sources' mask (k, S), right-padded, into columns [0, S)."""
        n = memory.shape[1]  # S of these sources
        if n > self.max_length:
            raise ValueError(f"a source of {n} columns exceeds the {self.max_length} a slot holds")
        if n > self.columns:
            self._allocate(min(self.max_length, max(n, 2 * self.columns)))
        self.keys[:, :, rows, :, :n] = keys.to(self.dtype)
        self.memory[rows, :n] = memory.to(self.model_dtype)
        self.mask[rows] = False
        self.mask[rows, :n] = mask
        for row, length in zip(rows.tolist(), mask.sum(dim=1).tolist()):
            self.lengths[row] = int(length)
        self._fit()

    def move(self, src: int, dst: int) -> None:
        """Slot ``src``'s source goes to slot ``dst`` (its request changed slots); ``src`` is freed."""
        n = self.lengths[src]
        self.keys[:, :, dst, :, :n] = self.keys[:, :, src, :, :n]
        self.memory[dst, :n] = self.memory[src, :n]
        self.mask[dst] = self.mask[src]
        self.lengths[dst] = n
        self.free(src)

    def free(self, row: int) -> None:
        """Slot ``row`` holds no source any more (its keys stay, stale and masked)."""
        self.lengths[row] = 0
        self.mask[row] = False
        self._fit()

    def clear(self) -> None:
        """Every slot free."""
        self.lengths = [0] * self.slots
        self.mask.zero_()
        self._fit()

    def _fit(self) -> None:
        self.width = max(1, *self.lengths)
