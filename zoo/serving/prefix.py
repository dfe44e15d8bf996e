"""The prefix cache: the keys/values of prompt blocks already prefilled, reused by later prompts that begin
with the same tokens (a chat's long system prompt, a few-shot preamble), so only the rest is prefilled.

Shapes: N attention applications, K key/value heads, D head dim, BLOCK tokens a block, h tokens reused.

A prompt is cut into blocks of ``BLOCK`` tokens. Block i's key is a hash of block i - 1's key and block i's
tokens, so one key names the whole prefix up to the end of its block (vLLM's automatic prefix caching)::

    prompt     [ t0 .. t15 ][ t16 .. t31 ][ t32 .. t47 ][ t48 t49 ]      the last partial block is never kept
    key        k0 = H(t0..)  k1 = H(k0, ..) k2 = H(k1, ..)
    store      k -> a slot of a `BlockPool` holding keys/values (N, 2, K, BLOCK, D), a copy in the slot
               cache's dtype and device

Why reuse is exact: every request's positions start at 0 (a left-padded row skips its pads), and keys are
cached after their rotation, so a block's keys/values depend only on the tokens up to its end, which its
key names. A window (sliding-window layers) is measured in positions, so it holds too; a position bias
(ALiBi, T5) is added at attention time, not stored. At least one prompt token is always prefilled: the
first new token needs its logits.

The store is least-recently-used and bounded in bytes (``--prefix-cache-bytes``): a hit or an insert
touches its chain from the deepest block to the first, so a block is never older than the blocks after it
and eviction takes the ends of chains first (a chain with its first block gone could never match again).
The blocks live in a pool of preallocated slots (`zoo.serving.blockpool`): an evicted block's slot takes
the next one, so the process holds the bound, not a heap fragmented by one small tensor a block.
Only the engine's thread reads and writes it; the counters are plain ints, read by ``/metrics``.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from zoo.serving.blockpool import CHUNK_BYTES, BlockPool

BLOCK = 16  # tokens a block: fine enough for a prompt to share most of a system prompt, few entries
DEFAULT_BYTES = 1 << 30  # 1 GiB: ~8k tokens of an 8B Llama's keys/values in bfloat16


@dataclass(frozen=True)
class PrefixStats:
    """What the cache did: prompt tokens read from it / prefilled while it was on, bytes held now."""

    hit_tokens: int
    miss_tokens: int
    bytes: int
    max_bytes: int


def block_keys(prompt: Sequence[int], block: int = BLOCK) -> list[bytes]:
    """The chained keys of ``prompt``'s full blocks (a digest of the previous key and the block's tokens)."""
    keys, previous = [], b""
    for start in range(0, len(prompt) - block + 1, block):
        digest = hashlib.blake2b(previous, digest_size=16)
        digest.update(array("q", prompt[start : start + block]).tobytes())
        previous = digest.digest()
        keys.append(previous)
    return keys


class PrefixCache:
    """Block key -> keys/values (N, 2, K, BLOCK, D), least-recently-used, at most ``max_bytes`` held (in
    slots of a pool allocated ``chunk_bytes`` at a time, up to ``max_bytes``).

    >>> cache = PrefixCache(1 << 30)
    >>> cache.insert(block_keys(prompt), kv)          # kv (N, 2, K, >= blocks * BLOCK, D) of the prompt
    >>> h = cache.match(block_keys(other), most=len(other) - 1); cache.read(block_keys(other), h)
    """

    def __init__(self, max_bytes: int, *, block: int = BLOCK, chunk_bytes: int = CHUNK_BYTES) -> None:
        if max_bytes < 0 or block < 1:
            raise ValueError(f"prefix cache: max_bytes must be >= 0 and block >= 1, got {max_bytes}, {block}")
        self.max_bytes, self.block = max_bytes, block
        self.pool = BlockPool(max_bytes, chunk_bytes=chunk_bytes)
        self._blocks: OrderedDict[bytes, int] = OrderedDict()  # key -> its pool slot, oldest first
        self.bytes = 0
        self.hit_tokens = 0  # prompt tokens whose keys/values came from here
        self.miss_tokens = 0  # prompt tokens prefilled while the cache was on

    def __len__(self) -> int:
        return len(self._blocks)

    def stats(self) -> PrefixStats:
        return PrefixStats(self.hit_tokens, self.miss_tokens, self.bytes, self.max_bytes)

    def match(self, keys: Sequence[bytes], *, most: int) -> int:
        """How many leading tokens (whole blocks, at most ``most``) of the prompt with these keys are held."""
        found = 0
        for key in keys[: most // self.block]:
            if key not in self._blocks:
                break
            found += 1
        return found * self.block

    def read(self, keys: Sequence[bytes], tokens: int) -> torch.Tensor:
        """The keys/values (N, 2, K, tokens, D) of the first ``tokens`` prompt tokens (held: see `match`);
        their blocks become the most recently used."""
        count = -(-tokens // self.block)  # the blocks that cover them
        chain = list(keys[:count])
        self._touch(chain)
        pieces = [self.pool.get(self._blocks[key]) for key in chain]  # each (N, 2, K, BLOCK, D)
        return torch.cat(pieces, dim=3)[:, :, :, :tokens]  # a copy: the slots may be reused after

    def insert(self, keys: Sequence[bytes], kv: torch.Tensor) -> None:
        """Keep the blocks of one prompt: ``kv`` (N, 2, K, >= len(keys) * BLOCK, D), its keys/values from
        position 0. Blocks already held are only touched; the least recently used go until it fits."""
        if not keys:
            return
        capacity = self.pool.capacity(kv[:, :, :, : self.block])  # blocks the bound holds
        if capacity == 0:
            return  # one block is over the bound: nothing of this prompt (or later ones) fits
        chain = list(keys[:capacity])  # a chain longer than the whole store keeps its beginning
        for key in keys[capacity:]:
            if key in self._blocks:
                self.pool.release(self._blocks.pop(key))
        self._touch(chain)  # its held blocks newest: room is made from the oldest of the others
        new = [i for i, key in enumerate(chain) if key not in self._blocks]
        while len(self._blocks) + len(new) > capacity:
            _, slot = self._blocks.popitem(last=False)
            self.pool.release(slot)
        for i in new:
            self._blocks[chain[i]] = self.pool.put(kv[:, :, :, i * self.block : (i + 1) * self.block])
        self._touch(chain)
        self.bytes = len(self._blocks) * self.pool.slot_bytes

    def _touch(self, chain: list[bytes]) -> None:
        """Most recent: the first block of the chain; then the second, ... (a parent outlives its children)."""
        for key in reversed(chain):
            if key in self._blocks:
                self._blocks.move_to_end(key)

    def clear(self) -> None:
        """Forget every block and give back the pool's storage (the counters stay)."""
        self._blocks.clear()
        self.pool.clear()
        self.bytes = 0
