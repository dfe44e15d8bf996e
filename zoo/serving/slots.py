"""The running batch's KV cache: B slots x L columns, one shared cursor, each slot a contiguous span.

Shapes: B slots (``max_batch``), L columns (the longest sequence a slot may hold), N attention applications,
K key/value heads, D head dim.

Every slot's keys end at the shared cursor ``c``, so one decode step writes column ``c`` of every slot and
attends to columns ``[0, c]``; a slot's earlier columns are masked exactly like a left-padded prompt's::

    column      0 1 2 3 4 5 6 7 8 9            c = 9 (the next step writes column 9)
    slot 0      . . . p p p g g g [next]       a request that joined 6 steps ago (3 prompt + 3 new)
    slot 1      p p p p p p p p g [next]       a longer prompt that joined 1 step ago
    slot 2      . . . . . . . . . [idle]       free: only its own column is unmasked, so no row is empty

    join     a prefilled prompt of T columns is copied into columns [c - T, c) of a free slot. When T > c,
             every live column first moves right by T - c (`shift`), so that the prompt fits before c.
    leave    the slot's mask row is cleared; nothing moves.
    compact  when c reaches L, every live column moves left by the earliest live start (`shift`), which
             frees at least one column: a slot leaves before its span reaches L (`Engine`'s length limit).

A move is one strided copy per buffer for all slots and layers at once (and one for the mask), and happens
only when a long prompt joins a young batch or the cursor hits L; decode steps themselves copy nothing.

An encoder-decoder's slots also read their sources (`zoo.serving.sources.SourceSlots`: the encoder output and
its cross-attention keys/values per slot); a view hands each layer its cross-attention slot beside its own.

A sliding-window layer keeps the full L columns here (no rolling slots): a window is measured in columns,
and a slot's columns are contiguous in positions, so the window's mask stays right through every move.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from zoo.generation.cache import Cursor, LayerSlots, SelfAttentionSlot, cache_dtype
from zoo.serving.sources import SourceSlots
from zoo.stacks import Stack


@dataclass
class _View:
    """The first ``rows`` slots as a `zoo.stacks.StackCache`: a decode step runs only up to the last busy slot."""

    cursor: Cursor
    layers: list[LayerSlots]

    @property
    def length(self) -> int:
        return self.cursor.length

    def advance(self, steps: int) -> None:
        self.cursor.length += steps

    def key_positions(self, new: int) -> torch.Tensor | None:
        return None  # keys are in column order in every layer (no rolling slots)


class SlotCache:
    """Keys/values (N, 2, B, K, L, D), a (B, L) attention mask and the cursor every slot shares."""

    def __init__(self, stack: Stack, *, slots: int, length: int, sources: SourceSlots | None = None) -> None:
        """``sources``: an encoder-decoder's sources, whose cross-attention slots the views hand out."""
        attention: Any = stack.layers[0].self_attn  # nn.ModuleList types its items as Module
        weight = next(stack.parameters())
        self.slots, self.max_length = slots, length
        self.cursor = Cursor()
        # zeros, not empty: masked columns are still multiplied by a weight of 0, and 0 * NaN is NaN
        self.buffer = torch.zeros(
            stack.num_layers,
            2,
            slots,
            attention.cache_heads,
            length,
            attention.cache_dim,
            dtype=cache_dtype(weight.dtype, weight.device),
            device=weight.device,
        )  # (N, 2, B, K, L, D)
        self.mask = torch.zeros(slots, length, dtype=torch.bool, device=weight.device)  # (B, L)
        self.sources = sources
        self._views: dict[int, _View] = {}

    @property
    def length(self) -> int:
        """The cursor: the column the next decode step writes."""
        return self.cursor.length

    def view(self, rows: int) -> _View:
        """The cache of slots [0, rows) for one forward (views of the shared buffer, made once per size)."""
        if rows not in self._views:
            self._views[rows] = _View(
                self.cursor,
                [
                    LayerSlots(
                        SelfAttentionSlot(self.cursor, layer[0, :rows], layer[1, :rows]),
                        self.sources.layer(i, rows) if self.sources is not None else None,  # type: ignore[arg-type]
                    )
                    for i, layer in enumerate(self.buffer)
                ],
            )
        return self._views[rows]

    def shift(self, start: int, by: int) -> None:
        """Move the live columns [start, cursor) by ``by`` (negative: left), for every slot at once."""
        end = self.cursor.length
        if by == 0 or end == start:
            self.cursor.length = end + by
            return
        if end + by > self.max_length or start + by < 0:
            raise ValueError(f"cannot move columns [{start}, {end}) by {by} within {self.max_length}")
        for tensor, dim in ((self.buffer, 4), (self.mask, 1)):
            src = tensor.narrow(dim, start, end - start).clone()  # the spans may overlap
            tensor.narrow(dim, start + by, end - start).copy_(src)
        # the columns the move uncovered are nobody's: mask them (their stale keys stay finite)
        if by > 0:
            self.mask[:, start : start + by] = False
        else:
            self.mask[:, end + by : end] = False
        self.cursor.length = end + by

    def place(self, rows: torch.Tensor, keys: torch.Tensor, mask: torch.Tensor) -> None:
        """Put prefilled prompts into slots ``rows`` (k,): keys (N, 2, k, K, T, D) and their padding mask
        (k, T) go to columns [cursor - T, cursor); the cursor must be >= T (`shift` first)."""
        T, end = keys.shape[4], self.cursor.length
        self.buffer[:, :, rows, :, end - T : end] = keys.to(self.buffer.dtype)
        self.mask[rows] = False
        self.mask[rows, end - T : end] = mask
