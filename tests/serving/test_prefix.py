"""The prefix cache: prompts that share blocks with earlier ones read their keys/values and prefill the rest,
and greedy outputs stay token-equal to `model.generate` of each prompt alone — under concurrency, with the
cache shifted and compacted, for every decoder shape generation tests (learned, rotary + GQA, ALiBi,
sinusoidal, shared layers, Gemma's local/global windows, experts); hits counted; the store bounded in bytes;
echo requests (which need every prompt position's logits) read nothing; a cancelled or failed prefill leaves
nothing wrong behind."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

import zoo
import zoo.serving.server
from tests.generation.conftest import DECODERS, build_tiny
from tests.serving.conftest import tiny_decoder
from tests.serving.test_engine import Collect, Digits, _alone, _prompts, moves  # noqa: F401
from zoo.serving import Engine
from zoo.serving.prefix import BLOCK, PrefixCache, block_keys

V = 120


def _shared_prompts(vocab: int) -> list[list[int]]:
    """Prompts over two system prefixes (2.5 and 1.25 blocks), diverging after them, inside a block, or
    exactly at a block's end (a prompt of whole blocks still prefills its last token)."""
    system, other = _prompts(vocab, [40, 20], seed=5)
    tails = _prompts(vocab, [3, 9, 1, 14, 6, 2, 11, 5], seed=6)
    return [
        system + tails[0],
        system + tails[1],
        other + tails[2],
        system[:35] + tails[3],  # shares 2 blocks, then differs inside the third
        system[:32],  # exactly 2 blocks: reads 1, prefills the second
        other + tails[4],
        system + tails[5],
        tails[6] + system,  # the same tokens at other positions: no hit
        system + tails[7],
        other + tails[2],  # a prompt seen before, whole
    ]


def _run_shared(model: zoo.ZooModel, *, prefill_tokens: int, max_length: int = 80) -> Engine:
    """Waves of requests over shared prefixes joining a running batch (a short prompt first, so later
    long ones shift the cursor; more requests than slots; the cursor reaching max_length compacts)."""
    prompts = _shared_prompts(model.spec.vocab_size)
    news = [30, 12, 25, 7, 20, 18, 9, 14, 22, 6]
    engine = Engine(model, Digits(), max_batch=3, max_length=max_length, prefill_tokens=prefill_tokens)
    engine.start()
    got = Collect()
    try:
        engine.submit([got.request(10, [7, 8, 9], 30)])  # a young cursor: the long prompts shift it
        got.wait(0, started=10)
        engine.submit([got.request(0, prompts[0], news[0])])
        got.wait(0, started=0)
        engine.submit([got.request(i, prompts[i], news[i]) for i in range(1, 6)])  # more than the slots
        got.wait(3)
        engine.submit([got.request(i, prompts[i], news[i]) for i in range(6, 10)])
        got.wait(11)
    finally:
        engine.close()
    for i, (prompt, new) in enumerate(zip(prompts, news)):
        assert list(got.done[i].token_ids) == _alone(model, prompt, new), f"request {i}"
    return engine


@pytest.mark.parametrize("prefill_tokens", [16, 64])
def test_greedy_with_shared_prefixes_under_concurrency_equals_generate_alone(
    moves: list[int],  # noqa: F811
    prefill_tokens: int,
) -> None:
    engine = _run_shared(tiny_decoder(V), prefill_tokens=prefill_tokens)
    stats = engine.prefix_stats()
    assert stats is not None and stats.hit_tokens >= 6 * BLOCK, stats  # most prompts read their prefix
    total = sum(len(p) for p in _shared_prompts(V)) + 3
    assert stats.miss_tokens + stats.hit_tokens == total
    assert any(by > 0 for by in moves) and any(by < 0 for by in moves), moves


@pytest.mark.parametrize("name", list(DECODERS))
def test_every_decoder_shape_reuses_prefixes_exactly(name: str, moves: list[int]) -> None:  # noqa: F811
    model = build_tiny(name, eos_token_id=None)
    engine = _run_shared(model, prefill_tokens=16)
    stats = engine.prefix_stats()
    assert stats is not None and stats.hit_tokens > 0


def test_the_same_tokens_at_other_positions_are_not_reused() -> None:
    """A block's key names its whole prefix: a block seen at positions 16-31 is no hit at 0-15."""
    model = tiny_decoder(V)
    lead, system, tail = _prompts(V, [BLOCK, 2 * BLOCK, 5], seed=7)
    engine = Engine(model, Digits(), max_batch=2, max_length=80).start()
    try:
        _run_one(engine, lead + system, 3)
        done = _run_one(engine, system + tail, 6)
    finally:
        engine.close()
    assert engine.prefix is not None and engine.prefix.hit_tokens == 0 and len(engine.prefix) == 3 + 2
    assert list(done.token_ids) == _alone(model, system + tail, 6)


def test_the_prefix_cache_off_changes_nothing_and_counts_nothing() -> None:
    model = tiny_decoder(V)
    prompt = _shared_prompts(V)[0]
    engine = Engine(model, Digits(), max_batch=2, max_length=80, prefix_cache_bytes=0).start()
    got = Collect()
    try:
        engine.submit([got.request(0, prompt, 8)])
        got.wait(1)
        engine.submit([got.request(1, prompt, 8)])
        got.wait(2)
    finally:
        engine.close()
    assert engine.prefix is None and engine.prefix_stats() is None
    assert list(got.done[1].token_ids) == list(got.done[0].token_ids) == _alone(model, prompt, 8)


def test_the_store_stays_within_its_bytes_evicting_the_least_recently_used() -> None:
    model = tiny_decoder(V)
    probe = Engine(model, Digits(), max_batch=1, max_length=80)
    N, _, _, K, _, D = probe.cache.buffer.shape
    block_bytes = N * 2 * K * BLOCK * D * probe.cache.buffer.element_size()
    engine = Engine(model, Digits(), max_batch=2, max_length=80, prefix_cache_bytes=5 * block_bytes).start()
    prompts = _prompts(V, [50, 45, 40], seed=8)  # 3 + 2 + 2 blocks: more than 5
    got = Collect()
    held = []
    try:
        for i, prompt in enumerate([*prompts, prompts[2]]):
            engine.submit([got.request(i, prompt, 5)])
            got.wait(i + 1)
            assert engine.prefix is not None
            held.append(engine.prefix.bytes)
    finally:
        engine.close()
    assert max(held) <= 5 * block_bytes and held[-1] == 5 * block_bytes, held
    stats = engine.prefix_stats()
    assert stats is not None and stats.hit_tokens == 2 * BLOCK  # the newest prompt's 2 blocks are kept
    for i, prompt in enumerate([*prompts, prompts[2]]):
        assert list(got.done[i].token_ids) == _alone(model, prompt, 5)


def test_lru_evicts_the_ends_of_chains_first() -> None:
    kv = torch.randn(2, 2, 1, 4 * BLOCK, 3)  # (N, 2, K, 4 blocks, D)
    one = PrefixCache(5 * kv[:, :, :, :BLOCK].numel() * 4)  # 5 blocks of float32
    a, b = list(range(4 * BLOCK)), list(range(2 * BLOCK)) + [7] * (2 * BLOCK)
    one.insert(block_keys(a), kv)
    one.insert(block_keys(b), kv)  # shares a's first 2 blocks, adds 2: a's last block goes
    assert len(one) == 5 and one.bytes == one.max_bytes
    assert one.match(block_keys(b), most=10**6) == 4 * BLOCK
    assert one.match(block_keys(a), most=10**6) == 3 * BLOCK  # a's end went, its start stays
    one.insert(block_keys(a[: 3 * BLOCK] + [9] * BLOCK), kv)  # b's end is now the oldest
    assert one.match(block_keys(b), most=10**6) == 3 * BLOCK
    assert one.match(block_keys(a), most=BLOCK) == BLOCK  # never more than asked
    read = one.read(block_keys(b), 2 * BLOCK + 5)
    assert read.shape == (2, 2, 1, 2 * BLOCK + 5, 3) and torch.equal(read, kv[:, :, :, : 2 * BLOCK + 5])
    assert block_keys([5, *a[1:]])[1] != block_keys(a)[1]  # a block's key names its whole prefix
    assert PrefixCache(10).match(block_keys(a), most=10**6) == 0
    small = PrefixCache(10)  # one block is over the bound: nothing is kept
    small.insert(block_keys(a), kv)
    assert len(small) == 0 and small.bytes == 0


def _run_one(engine: Engine, prompt: Sequence[int], new: int, **kw: Any) -> Any:
    got = Collect()
    engine.submit([got.request(0, prompt, new, **kw)])
    got.wait(1)
    return got.done[0]


def test_echo_reads_no_prefix_and_scores_every_prompt_token() -> None:
    """A request that scores its prompt needs every position's logits: it prefills all of it, and its
    log-probabilities equal those of an engine without a prefix cache."""
    model = tiny_decoder(V)
    prompt = _shared_prompts(V)[1]
    scores: list[list[float | None]] = []
    for size in (0, 1 << 20):
        engine = Engine(
            model, Digits(), max_batch=2, max_length=80, prefill_tokens=16, prefix_cache_bytes=size
        )
        engine.start()
        try:
            _run_one(engine, prompt, 4)  # its blocks are kept (when on)
            hits = engine.prefix.hit_tokens if engine.prefix is not None else 0
            done = _run_one(engine, prompt, 0, echo=True, logprobs=1)
            assert engine.prefix is None or engine.prefix.hit_tokens == hits  # nothing read
        finally:
            engine.close()
        assert len(done.prompt_logprobs) == len(prompt)
        scores.append([entry.logprob for entry in done.prompt_logprobs])
    assert scores[0] == pytest.approx(scores[1], abs=1e-5)


def _until_idle(engine: Engine) -> None:
    deadline = time.monotonic() + 60
    while engine.load()[:2] != (0, 0) or engine.prefill is not None:
        assert time.monotonic() < deadline, "the engine did not finish"
        time.sleep(0.01)


def test_a_cancelled_prefill_keeps_true_keys_and_a_failed_one_keeps_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model = tiny_decoder(V)
    prompt, other = _prompts(V, [60, 60], seed=9)  # 8 chunks of 8 tokens each
    engine = Engine(model, Digits(), max_batch=2, max_length=80, prefill_tokens=8)
    chunk = engine._prefill_chunk
    first = Collect()
    cancelled = first.request(0, prompt, 5)
    plan = {"cancel": True, "fail": False}

    def spy() -> None:  # cancel the first request after its first chunk; fail a later prefill midway
        chunk()
        if engine.prefill is not None and plan["cancel"]:
            plan["cancel"] = False
            cancelled.cancel()
        elif engine.prefill is not None and plan["fail"]:
            raise RuntimeError("a failing forward")

    monkeypatch.setattr(engine, "_prefill_chunk", spy)
    engine.start()
    try:
        engine.submit([cancelled])
        _until_idle(engine)  # its prefill ran to the end; the request is gone
        assert engine.prefix is not None and 0 not in first.done
        kept = len(engine.prefix)
        assert kept == 60 // BLOCK  # every full block of its prompt
        assert list(_run_one(engine, prompt, 5).token_ids) == _alone(model, prompt, 5)
        assert engine.prefix.hit_tokens == (60 - 1) // BLOCK * BLOCK
        failed = Collect()
        plan["fail"] = True
        engine.submit([failed.request(0, other, 5)])
        _until_idle(engine)
        assert failed.failed and "a failing forward" in failed.failed[0].message
        assert len(engine.prefix) == kept  # nothing of the failed prefill was kept
        plan["fail"] = False
        assert list(_run_one(engine, other, 5).token_ids) == _alone(model, other, 5)
    finally:
        engine.close()


@pytest.mark.parametrize(
    ("text", "expected"), [("512K", 512 * 1024), ("1G", 2**30), ("0", None), ("3000", 3000)]
)
def test_zoo_serve_prefix_cache_bytes_reaches_the_engine(
    saved: Path, monkeypatch: pytest.MonkeyPatch, text: str, expected: int | None
) -> None:
    from zoo.cli import main

    seen: list[Engine] = []
    monkeypatch.setattr(zoo.serving.server, "serve", lambda engine, *a, **k: seen.append(engine))
    monkeypatch.delenv("ZOO_API_KEY", raising=False)
    assert main(["serve", str(saved), "--port", "0", "--prefix-cache-bytes", text]) == 0
    stats = seen[0].prefix_stats()
    assert (stats.max_bytes if stats is not None else None) == expected


@pytest.mark.parametrize("text", ["-1", "lots", "1X", ""])
def test_a_bad_prefix_cache_size_is_a_usage_error(
    saved: Path, capsys: pytest.CaptureFixture[str], text: str
) -> None:
    from zoo.cli import main

    with pytest.raises(SystemExit) as stopped:
        main(["serve", str(saved), "--port", "0", "--prefix-cache-bytes", text])
    assert (
        stopped.value.code == 2 and f"invalid size {text!r} (expected bytes >= 0" in capsys.readouterr().err
    )


class _Unpooled:
    """The store's rule without a pool: one tensor a block, insert all, touch the chain, evict the oldest."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes, self.blocks = max_bytes, OrderedDict[bytes, torch.Tensor]()

    def insert(self, keys: list[bytes], kv: torch.Tensor) -> None:
        for i, key in enumerate(keys):
            if key not in self.blocks:
                self.blocks[key] = kv[:, :, :, i * BLOCK : (i + 1) * BLOCK].clone()
        for key in reversed(keys):
            self.blocks.move_to_end(key)
        while sum(b.numel() * 4 for b in self.blocks.values()) > self.max_bytes:
            self.blocks.popitem(last=False)


def test_the_pool_reuses_evicted_slots_within_its_bound_and_reads_what_was_inserted() -> None:
    """Many prompts through a store of 10 blocks in chunks of 3 slots: storage is 3 + 3 + 3 + 1 slots,
    allocated once (the same chunks at the end as after the first 10 blocks); the held blocks, their LRU
    order and every read equal a store of one tensor a block, though slots were reused many times."""
    shape = (2, 2, 1, BLOCK, 3)  # (N, 2, K, BLOCK, D) float32
    block_bytes = torch.zeros(shape).numel() * 4
    cache = PrefixCache(10 * block_bytes + block_bytes // 2, chunk_bytes=3 * block_bytes + 1)
    reference = _Unpooled(cache.max_bytes)
    pick = torch.Generator().manual_seed(0)
    bases = [torch.randint(0, V, (6 * BLOCK,), generator=pick).tolist() for _ in range(4)]
    first_chunks: list[int] = []
    for step in range(300):
        base = bases[step % 4]
        cut = int(torch.randint(1, 13, (1,), generator=pick))  # 1-12 blocks: over the bound at times
        tail = torch.randint(0, V, (cut * BLOCK,), generator=pick).tolist()
        prompt = (base + tail)[: cut * BLOCK + 5]  # shares up to 6 blocks with earlier prompts
        keys = block_keys(prompt)
        kv = torch.randn(2, 2, 1, len(prompt), 3, generator=pick)
        # a held block's values are those first inserted under its key: read them back for the new kv
        held = cache.match(keys, most=len(prompt))
        if held:
            kv[:, :, :, :held] = cache.read(keys, held)
        cache.insert(keys, kv)
        reference.insert(keys, kv)
        assert list(cache._blocks) == list(reference.blocks), step  # the same blocks, the same order
        assert cache.bytes == len(cache) * block_bytes <= cache.max_bytes
        assert cache.pool.allocated_bytes <= cache.max_bytes and len(cache.pool.chunks) <= 4
        if len(cache) == 10 and not first_chunks:
            first_chunks = [chunk.data_ptr() for chunk in cache.pool.chunks]
        for key, block in reference.blocks.items():
            assert torch.equal(cache.pool.get(cache._blocks[key]), block), step
        whole = cache.match(keys, most=len(prompt))
        if whole:
            assert torch.equal(cache.read(keys, whole - 3), reference_read(reference, keys, whole - 3))
    assert [len(chunk) for chunk in cache.pool.chunks] == [3, 3, 3, 1]
    assert [chunk.data_ptr() for chunk in cache.pool.chunks] == first_chunks  # never reallocated
    assert cache.pool.used == len(cache) == 10 and sorted(cache._blocks.values()) == list(range(10))
    cache.clear()
    assert (
        len(cache) == 0 and cache.bytes == 0 and cache.pool.chunks == [] and cache.pool.allocated_bytes == 0
    )
    cache.insert(block_keys(list(range(2 * BLOCK))), torch.ones(2, 2, 1, 2 * BLOCK, 3, dtype=torch.float64))
    assert len(cache) == 2 and cache.bytes == 4 * block_bytes  # float64 blocks after clear: twice the bytes


def reference_read(reference: _Unpooled, keys: list[bytes], tokens: int) -> torch.Tensor:
    count = -(-tokens // BLOCK)
    return torch.cat([reference.blocks[key] for key in keys[:count]], dim=3)[:, :, :, :tokens]


def test_the_pool_takes_storage_in_chunks_up_to_its_bound() -> None:
    """1,000 distinct prompts through a 64-block store: 8 chunks of 8 slots (the bound, no more), and a
    block of another shape is refused in one line."""
    shape = (2, 2, 1, BLOCK, 8)
    block_bytes = torch.zeros(shape).numel() * 4
    cache = PrefixCache(64 * block_bytes, chunk_bytes=8 * block_bytes)
    pick = torch.Generator().manual_seed(1)
    for _ in range(1000):
        prompt = torch.randint(0, V, (3 * BLOCK + 7,), generator=pick).tolist()
        cache.insert(block_keys(prompt), torch.randn(2, 2, 1, len(prompt), 8, generator=pick))
    assert len(cache) == 64 and cache.bytes == cache.max_bytes
    assert len(cache.pool.chunks) == 8 and cache.pool.allocated_bytes == cache.max_bytes
    with pytest.raises(ValueError, match=r"block pool: a block \(2, 2, 1, 16, 4\) torch.float32 on cpu, but"):
        cache.insert(block_keys(list(range(BLOCK))), torch.randn(2, 2, 1, BLOCK, 4))
