"""Batches planned from the lengths array alone: bucketed by length, capped by padded tokens, vectorised.

    batches = plan_batches(lengths, max_tokens=4096, seed=0, epoch=3)     # list of (B,) int index arrays
    mine = shard_for_rank(batches, rank, world_size)

``lengths`` is (N,) or (N, sides) (a seq2seq example's source and target lengths). A batch costs its
example count times the sum over sides of the longest row (padding counted), and holds at most
``max_tokens`` of that (and at most ``max_examples`` examples). Examples are sorted by length and cut
greedily into batches, so each batch holds rows of nearly one length and pads little (the bucketing of
fairseq and tensor2tensor):

    pool_size=None (default)   one global sort; ties in length broken by a permutation drawn from ``seed``.
                               The batches are the same every epoch; only their order changes per epoch.
                               This is how zoo's batching has always worked.
    pool_size=P                the examples are shuffled per (seed, epoch), cut into pools of P, and each
                               pool is sorted and cut on its own (torchtext's BucketIterator, the
                               "sort within large random pools" recipe): batch contents vary by epoch, the
                               batches still near-uniform in length when P is large against a batch.

With ``shuffle`` the batch order is a permutation drawn from (seed, epoch); without it (evaluation) the
batches come in length order and ties keep index order. Either way the plan is a pure function of
(lengths, max_tokens, max_examples, seed, epoch, shuffle, pool_size): resuming at (epoch, position)
rebuilds exactly the batches a straight run saw.

Cost: one argsort of N int64 keys, a few vectorised passes, and a Python loop over *runs* of equal
lengths (at most the number of distinct length tuples per pool), never over examples. The batches are
views of one (N,) index array. `shard_for_rank` gives each torchrun process every ``world_size``-th batch
after dropping the last ``len(batches) % world_size``, so every rank takes the same number of steps.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from zoo.training.data import DataError

# Streams of the random generator, so the ties, the pools and the batch order never share draws.
_TIES, _POOLS, _ORDER = 1, 2, 3


def rng(seed: int, epoch: int, stream: int) -> np.random.Generator:
    """The generator of one random stream at (seed, epoch): numpy's PCG64 seeded by a SeedSequence."""
    return np.random.default_rng([seed & 0xFFFFFFFFFFFFFFFF, epoch, stream])


def plan_batches(
    lengths: np.ndarray | Sequence[int],
    *,
    max_tokens: int,
    max_examples: int | None = None,
    seed: int = 0,
    epoch: int = 0,
    shuffle: bool = True,
    pool_size: int | None = None,
    describe: Callable[[int], str] | None = None,
) -> list[np.ndarray]:
    """Example indices per batch (int32 arrays; int64 past 2**31 examples), every example in exactly one batch.

    ``lengths``: (N,) or (N, sides) non-negative ints. An example whose own cost exceeds ``max_tokens`` is
    a `DataError` naming it through ``describe(index)`` (``"file:line"``, say; default ``"example i"``).
    """
    table = np.asarray(lengths)
    if (
        table.dtype.kind not in "iu"
    ):  # compact integer lengths (uint16, int32) stay compact: memory is N-sized
        table = table.astype(np.int64)
    if table.ndim == 1:
        table = table[:, None]
    if table.ndim != 2 or table.shape[1] == 0:
        raise ValueError(f"lengths must be (N,) or (N, sides), got shape {np.shape(lengths)}")
    if max_tokens < 1:
        raise ValueError(f"max_tokens ({max_tokens}) must be >= 1")
    if max_examples is not None and max_examples < 1:
        raise ValueError(f"max_examples ({max_examples}) must be >= 1")
    if pool_size is not None and pool_size < 1:
        raise ValueError(f"pool_size ({pool_size}) must be >= 1")
    n = len(table)
    if n == 0:
        return []
    if table.min() < 0:
        raise ValueError("lengths must be >= 0")
    cost = table.sum(axis=1, dtype=np.int64 if table.dtype.itemsize > 2 else np.int32)
    over = np.flatnonzero(cost > max_tokens)
    if len(over):
        i = int(over[0])
        name = describe(i) if describe is not None else f"example {i}"
        raise DataError(
            f"{name}: one example has {int(cost[i])} tokens, more than batch.max_tokens ({max_tokens})"
            + (f" ({len(over)} such examples)" if len(over) > 1 else "")
        )
    order = _sorted_order(table, seed=seed, epoch=epoch, shuffle=shuffle, pool_size=pool_size)
    columns = [table[:, j][order] for j in range(table.shape[1])]  # (N,) each: lengths in cut order
    cuts = _cuts(columns, pool_size=pool_size, max_tokens=max_tokens, max_examples=max_examples or n)
    batches = np.split(order, cuts)
    if shuffle:
        permutation = rng(seed, epoch, _ORDER).permutation(len(batches))
        batches = [batches[i] for i in permutation]
    return batches


def _sorted_order(
    table: np.ndarray, *, seed: int, epoch: int, shuffle: bool, pool_size: int | None
) -> np.ndarray:
    """The examples in batch-cutting order: by length (first side first), ties in a seeded random order
    (index order without ``shuffle``), and with pools, each run of ``pool_size`` positions of this
    epoch's shuffle sorted on its own."""
    n = len(table)
    index = np.int32 if n < 2**31 else np.int64  # half the memory of int64 indices, for any real corpus
    if shuffle and pool_size is not None:
        order = rng(seed, epoch, _POOLS).permutation(n).astype(index)  # this epoch's shuffle, cut into pools
    elif shuffle:
        order = rng(seed, 0, _TIES).permutation(n).astype(index)  # the same every epoch: the batches too
    else:
        order = np.arange(n, dtype=index)
    if pool_size is None or pool_size >= n:
        return _sort_by_length(table, order)
    for start in range(0, n, pool_size):
        order[start : start + pool_size] = _sort_by_length(table, order[start : start + pool_size])
    return order


def _sort_by_length(table: np.ndarray, order: np.ndarray) -> np.ndarray:
    """``order`` stably sorted by the lengths, last side first (LSD), so the first side decides; each pass
    a radix sort when the lengths fit in 16 bits (numpy's stable sort of small integers): O(N)."""
    for j in reversed(range(table.shape[1])):
        column = table[:, j][order]
        if int(column.max(initial=0)) < 1 << 16:
            column = column.astype(np.uint16)
        order = order[np.argsort(column, kind="stable")]
    return order


def _cuts(
    columns: list[np.ndarray], *, pool_size: int | None, max_tokens: int, max_examples: int
) -> list[int]:
    """Where the greedy cut of the sorted examples ends each batch (positions for ``np.split``).

    The greedy fills a batch while (count + 1) * (sum of the running per-side maxima) fits; within a run
    of identical lengths it is arithmetic, so the loop visits runs, not examples. A pool's end (a multiple
    of ``pool_size``) always ends a batch."""
    n = len(columns[0])
    change = np.zeros(n - 1, dtype=bool)
    for column in columns:
        change |= column[1:] != column[:-1]
    if pool_size is not None:
        change[pool_size - 1 :: pool_size] = True
    starts = np.concatenate([[0], np.flatnonzero(change) + 1])
    counts = np.diff(np.concatenate([starts, [n]])).tolist()
    values = [list(row) for row in zip(*(column[starts].tolist() for column in columns))]
    new_pools = [pool_size is not None and start % pool_size == 0 for start in starts.tolist()]
    cuts: list[int] = []
    filled = 0  # examples in the open batch
    longest: list[int] = []  # its per-side maxima
    for start, count, value, new_pool in zip(starts.tolist(), counts, values, new_pools):
        if new_pool and filled:
            cuts.append(start)
            filled = 0
        widest = [max(a, b) for a, b in zip(longest, value)] if filled else value
        capacity = min(max_tokens // max(sum(widest), 1), max_examples)
        if filled and filled >= capacity:  # this run's rows would not fit beside the open batch
            cuts.append(start)
            filled, widest = 0, value
            capacity = min(max_tokens // max(sum(value), 1), max_examples)
        room = capacity - filled
        if count <= room:
            filled, longest = filled + count, widest
            continue
        position = start + room  # the open batch takes `room` rows; fresh batches take the rest
        cuts.append(position)
        size = min(max_tokens // max(sum(value), 1), max_examples)
        full, filled = divmod(count - room, size)
        cuts.extend(range(position + size, position + full * size + 1, size))
        longest = value  # when filled is 0, the last cut closed a full batch at the end of the run
    if cuts and cuts[-1] == n:
        cuts.pop()
    return cuts


def shard_for_rank(batches: Sequence[np.ndarray], rank: int, world_size: int) -> list[np.ndarray]:
    """This process's batches: every ``world_size``-th from ``rank``, after dropping the last
    ``len(batches) % world_size`` so that every rank gets the same count (the dropped batches differ
    from epoch to epoch when the order is shuffled)."""
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not within world_size {world_size}")
    usable = len(batches) - len(batches) % world_size
    return list(batches[rank:usable:world_size])
