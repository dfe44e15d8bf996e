"""Batch planning from lengths: every example once per epoch, padded cost within max_tokens, deterministic."""

from __future__ import annotations

import numpy as np
import pytest

from zoo.training.data import DataError
from zoo.training.data.planning import plan_batches, shard_for_rank


def lengths(n: int = 2_000, sides: int = 2, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(1, 60, size=(n, sides))


def greedy(table: np.ndarray, order: np.ndarray, max_tokens: int, max_examples: int) -> list[list[int]]:
    """The plain loop the vectorised cut must equal: add examples while the padded batch fits."""
    batches: list[list[int]] = []
    batch: list[int] = []
    widest = np.zeros(table.shape[1], dtype=np.int64)
    for i in order:
        grown = np.maximum(widest, table[i]) if batch else table[i]
        if batch and ((len(batch) + 1) * max(int(grown.sum()), 1) > max_tokens or len(batch) == max_examples):
            batches.append(batch)
            batch, grown = [], table[i]
        batch.append(int(i))
        widest = grown
    return [*batches, batch]


@pytest.mark.parametrize("pool_size", [None, 300])
@pytest.mark.parametrize("max_examples", [None, 16])
def test_every_example_is_in_exactly_one_batch_within_max_tokens(
    pool_size: int | None, max_examples: int | None
) -> None:
    table = lengths()
    batches = plan_batches(
        table, max_tokens=512, max_examples=max_examples, seed=1, epoch=2, pool_size=pool_size
    )
    assert np.array_equal(np.sort(np.concatenate(batches)), np.arange(len(table)))
    for batch in batches:
        assert len(batch) * int(table[batch].max(axis=0).sum()) <= 512  # padding counted, every side
        assert max_examples is None or len(batch) <= max_examples


def test_the_cut_equals_the_plain_greedy_loop_over_length_sorted_examples() -> None:
    rng = np.random.default_rng(3)
    for trial in range(40):
        n, sides = int(rng.integers(1, 200)), int(rng.integers(1, 3))
        table = rng.integers(0, int(rng.integers(1, 40)), size=(n, sides))
        max_tokens = int(rng.integers(max(int(table.sum(axis=1).max()), 1), 200))
        max_examples = int(rng.integers(1, 20)) if trial % 2 else None
        batches = plan_batches(table, max_tokens=max_tokens, max_examples=max_examples, shuffle=False)
        order = np.lexsort([table[:, j] for j in reversed(range(sides))])  # by length, ties by index
        assert [b.tolist() for b in batches] == greedy(table, order, max_tokens, max_examples or n)


def test_batches_hold_nearly_one_length() -> None:
    table = lengths(sides=1)
    batches = plan_batches(table, max_tokens=1024, seed=0)
    padding = sum(len(b) * int(table[b].max()) - int(table[b].sum()) for b in batches)
    assert padding < 0.05 * int(table.sum())  # random batches of this size pad ~45%


def test_the_plan_is_a_function_of_seed_and_epoch() -> None:
    table = lengths()
    plan = plan_batches(table, max_tokens=512, seed=5, epoch=1)
    assert all(
        np.array_equal(a, b) for a, b in zip(plan, plan_batches(table, max_tokens=512, seed=5, epoch=1))
    )
    other_epoch = plan_batches(table, max_tokens=512, seed=5, epoch=2)
    other_seed = plan_batches(table, max_tokens=512, seed=6, epoch=1)
    assert [b.tolist() for b in plan] != [b.tolist() for b in other_epoch]
    assert [b.tolist() for b in plan] != [b.tolist() for b in other_seed]
    # without pools, an epoch reorders the same batches
    assert sorted(map(tuple, plan)) == sorted(map(tuple, other_epoch))  # type: ignore[arg-type]


def test_pools_change_the_batches_from_epoch_to_epoch() -> None:
    table = lengths()
    one = plan_batches(table, max_tokens=512, seed=5, epoch=1, pool_size=400)
    two = plan_batches(table, max_tokens=512, seed=5, epoch=2, pool_size=400)
    assert sorted(map(tuple, one)) != sorted(map(tuple, two))  # type: ignore[arg-type]


def test_without_shuffle_batches_come_in_length_order() -> None:
    table = lengths(sides=1)
    batches = plan_batches(table, max_tokens=512, shuffle=False)
    longest = [int(table[b].max()) for b in batches]
    assert longest == sorted(longest)


def test_an_example_over_max_tokens_is_named() -> None:
    table = np.array([[3, 4], [90, 20], [1, 1]])
    with pytest.raises(
        DataError, match=r"a.tsv:2: one example has 110 tokens, more than batch.max_tokens \(100\)"
    ):
        plan_batches(table, max_tokens=100, describe=lambda i: f"a.tsv:{i + 1}")


def test_rank_shards_are_disjoint_equal_and_drop_only_the_tail() -> None:
    batches = plan_batches(lengths(), max_tokens=512, seed=0)
    world = 3
    shards = [shard_for_rank(batches, rank, world) for rank in range(world)]
    assert len({len(shard) for shard in shards}) == 1
    taken = np.concatenate([b for shard in shards for b in shard])
    assert len(np.unique(taken)) == len(taken)
    assert len(batches) - sum(map(len, shards)) == len(batches) % world < world
    with pytest.raises(ValueError, match="rank 3 is not within world_size 3"):
        shard_for_rank(batches, 3, world)


@pytest.mark.slow
def test_planning_five_million_examples_takes_under_two_seconds() -> None:
    import time

    table = np.random.default_rng(0).integers(7, 70, size=(5_000_000, 2))
    seconds = []
    for epoch in range(2):  # the better of two: the CPUs may be shared
        start = time.perf_counter()
        batches = plan_batches(table, max_tokens=4096, seed=0, epoch=epoch)
        seconds.append(time.perf_counter() - start)
    assert min(seconds) < 2.0 and sum(map(len, batches)) == 5_000_000
