"""Fixed-size slots for the prefix cache's blocks, preallocated in chunks and reused, never freed one by one.

Shapes: S slots a chunk; a block is any fixed shape (the prefix cache's (N, 2, K, BLOCK, D)).

One small tensor a block, freed when evicted and allocated again for the next block, fragments the host
allocator's heap (glibc): a `zoo serve` with a 128 MB prefix cache held ~2.5x that. A pool instead takes
its storage in chunks of a few MB (torch.empty: a page is only resident once written), grows them up to the
slots its byte bound allows, and hands an evicted block's slot to the next one; its storage is only given
back by `clear`. The first block fixes the pool's block shape, dtype and device.
"""

from __future__ import annotations

import torch

CHUNK_BYTES = 4 << 20  # 4 MiB a chunk: few allocations, and at most one chunk's worth more than held


class BlockPool:
    """At most ``max_bytes // block bytes`` slots of one block shape, in chunks of ``chunk_bytes`` (S slots).

    >>> pool = BlockPool(1 << 27)
    >>> slot = pool.put(block)          # a copy of ``block`` in a free slot (`capacity` must leave room)
    >>> pool.get(slot)                  # a view of it: valid until the slot is released
    >>> pool.release(slot)              # its slot goes to the next `put`
    """

    def __init__(self, max_bytes: int, *, chunk_bytes: int = CHUNK_BYTES) -> None:
        if max_bytes < 0 or chunk_bytes < 1:
            raise ValueError(
                f"block pool: max_bytes must be >= 0 and chunk_bytes >= 1, got {max_bytes}, {chunk_bytes}"
            )
        self.max_bytes, self.chunk_bytes = max_bytes, chunk_bytes
        self.clear()

    def clear(self) -> None:
        """Give back every chunk and forget the block shape (the next `put` may bring another)."""
        self.chunks: list[torch.Tensor] = []  # each (S, *shape); all S = per_chunk but the last
        self.free: list[int] = []  # released or never used slots of the chunks, the next `put` takes the last
        self.shape: tuple[int, ...] | None = None
        self.dtype: torch.dtype | None = None
        self.device: torch.device | None = None
        self.slot_bytes = 0
        self.slots = 0  # slots allocated (in chunks)
        self.per_chunk = 0
        self.used = 0  # slots holding a block

    @property
    def allocated_bytes(self) -> int:
        """The bytes of every chunk (at most ``max_bytes``)."""
        return self.slots * self.slot_bytes

    def capacity(self, block: torch.Tensor) -> int:
        """How many blocks like ``block`` the bound holds (0: one is over it); fixes the pool's block shape,
        dtype and device on the first call, and refuses another one after that."""
        found = (tuple(block.shape), block.dtype, block.device)
        if self.shape is None:
            self.shape, self.dtype, self.device = found
            self.slot_bytes = block.numel() * block.element_size()
            count = self.max_bytes // self.slot_bytes if self.slot_bytes else 0
            self.per_chunk = max(1, min(count, self.chunk_bytes // max(1, self.slot_bytes)))
        elif found != (self.shape, self.dtype, self.device):
            raise ValueError(
                f"block pool: a block {found[0]} {found[1]} on {found[2]}, but it holds blocks "
                f"{self.shape} {self.dtype} on {self.device} (clear it first)"
            )
        return self.max_bytes // self.slot_bytes if self.slot_bytes else 0

    def put(self, block: torch.Tensor) -> int:
        """Copy ``block`` (its shape: see `capacity`) into a free slot, allocating a chunk if none is free."""
        if not self.free:
            self._grow(block)
        slot = self.free.pop()
        try:
            self.get(slot).copy_(block.detach())
        except RuntimeError:  # not a block of the pool's shape: the slot stays free
            self.free.append(slot)
            raise
        self.used += 1
        return slot

    def get(self, slot: int) -> torch.Tensor:
        """The block in ``slot``: a view of the pool's storage, overwritten once the slot is released."""
        return self.chunks[slot // self.per_chunk][slot % self.per_chunk]

    def release(self, slot: int) -> None:
        """The block in ``slot`` is no longer needed: the next `put` reuses its slot."""
        self.free.append(slot)
        self.used -= 1

    def _grow(self, block: torch.Tensor) -> None:
        limit = self.capacity(block)
        if self.slots >= limit:
            raise ValueError(f"block pool: all {limit} slots hold blocks (release one first)")
        assert self.shape is not None
        size = min(self.per_chunk, limit - self.slots)  # the last chunk only what the bound has left
        with torch.inference_mode(False):  # a normal tensor: writable in and out of inference mode
            self.chunks.append(torch.empty((size, *self.shape), dtype=self.dtype, device=self.device))
        self.free.extend(reversed(range(self.slots, self.slots + size)))  # lowest first
        self.slots += size
