"""The rolling KV cache of a sliding-window decoder: W slots per layer however long the run, and decoding
through it equals decoding without a cache, far past the window, with left-padded prompts."""

from __future__ import annotations

import pytest
import torch

from zoo.generation import KVCache

WINDOW = 4


def _windowed(tiny, name: str = "llama-tiny", **stack):
    return tiny(name, decoder=stack or {"pattern": {"kind": "sliding_window", "window": WINDOW}})


@pytest.fixture
def caches(monkeypatch):
    """Every KVCache that generation builds in the test, in order."""
    built: list[KVCache] = []
    original = KVCache.for_stack.__func__  # type: ignore[attr-defined]

    def spy(cls, *args, **kwargs):
        built.append(original(cls, *args, **kwargs))
        return built[-1]

    monkeypatch.setattr(KVCache, "for_stack", classmethod(spy))
    return built


def test_cached_greedy_equals_uncached_far_past_the_window_in_bounded_memory(tiny, prompts, caches):
    model = _windowed(tiny)
    ids, mask = prompts(model.spec.vocab_size, [7, 4, 6])  # left-padded prompts longer than the window
    cached = model.generate(ids, attention_mask=mask, max_new_tokens=20, eos_token_id=[])
    uncached = model.generate(ids, attention_mask=mask, max_new_tokens=20, eos_token_id=[], use_cache=False)
    assert cached.shape == (3, 27) and torch.equal(cached, uncached)
    [cache] = caches
    assert cache.window == WINDOW and cache.length == 26
    assert cache.buffer.shape[-2] == WINDOW  # (layers, k|v, B, K, W, D): the window, not the 27 positions


@pytest.mark.parametrize("alternating", [False, True], ids=["all-local", "local-global"])
def test_each_cached_step_matches_the_full_forward(tiny, prompts, alternating):
    """Prefill longer than the window, a chunk of 3 after it, then single tokens: logits as without a cache."""
    local = {"kind": "sliding_window", "window": WINDOW}
    model = _windowed(tiny, layer_patterns=[local, {"kind": "causal"}]) if alternating else _windowed(tiny)
    ids, mask = prompts(model.spec.vocab_size, [7, 5])
    more = torch.randint(3, model.spec.vocab_size, (2, 9))
    sequence = torch.cat([ids, more], dim=1)
    full_mask = torch.cat([mask, torch.ones_like(more)], dim=1)
    cache = KVCache.for_stack(model.decoder, batch_size=2, max_length=sequence.shape[1])
    with torch.no_grad():
        full = model(sequence, attention_mask=full_mask).logits  # (2, 16, V)
        steps = [model(ids, attention_mask=mask, cache=cache).logits]
        for start, end in [(7, 10), *((t, t + 1) for t in range(10, 16))]:
            steps.append(model(sequence[:, start:end], attention_mask=full_mask[:, :end], cache=cache).logits)
    real = full_mask.bool()
    torch.testing.assert_close(torch.cat(steps, dim=1)[real], full[real], atol=1e-4, rtol=1e-4)
    assert cache.local_buffer is not None and cache.local_buffer.shape[-2] == WINDOW


def test_a_gemma_stack_of_sliding_layers_decodes_through_the_rolling_buffer(tiny, prompts, caches):
    """Soft-capped attention (the math path), sandwich norms and the local rope base, all layers local."""
    model = tiny(
        "gemma-tiny",
        decoder={"layer_patterns": None, "pattern": {"kind": "sliding_window", "window": WINDOW}},
    )
    assert model.decoder.local_rotary == (True,) * 4
    ids, mask = prompts(model.spec.vocab_size, [7, 4, 6])
    kwargs = dict(attention_mask=mask, max_new_tokens=16, eos_token_id=[])
    assert torch.equal(model.generate(ids, **kwargs), model.generate(ids, **kwargs, use_cache=False))
    assert caches[0].window == WINDOW and caches[0].buffer.shape[-2] == WINDOW


def test_layers_with_different_windows_share_a_buffer_of_the_largest(tiny, prompts, caches):
    local, wider = {"kind": "sliding_window", "window": 2}, {"kind": "sliding_window", "window": WINDOW}
    model = _windowed(tiny, layer_patterns=[local, wider])
    ids, mask = prompts(model.spec.vocab_size, [6, 3])
    cached = model.generate(ids, attention_mask=mask, max_new_tokens=12, eos_token_id=[])
    assert torch.equal(
        cached, model.generate(ids, attention_mask=mask, max_new_tokens=12, eos_token_id=[], use_cache=False)
    )
    assert caches[0].window == WINDOW


@pytest.mark.parametrize("name", ["llama-tiny", "gemma-tiny", "yarn-nope"])
def test_alternating_layers_roll_the_local_ones_and_keep_every_key_for_the_global_ones(
    tiny, prompts, caches, name
):
    """Gemma-style alternation: the sliding layers decode through W slots, the full ones the whole run
    (``yarn-nope``: the sliding layers rotate nothing, as SmolLM3's may)."""
    local = {"kind": "sliding_window", "window": 3}
    nope = {"position.nope_layers": [0, 2]} if name == "yarn-nope" else {}
    model = tiny(name, num_layers=4, decoder={"layer_patterns": [local, {"kind": "causal"}] * 2}, **nope)
    ids, mask = prompts(model.spec.vocab_size, [6, 3, 5])
    kwargs = dict(attention_mask=mask, max_new_tokens=12, eos_token_id=[])
    assert torch.equal(model.generate(ids, **kwargs), model.generate(ids, **kwargs, use_cache=False))
    beams = dict(kwargs, num_beams=3)  # beam search reorders both buffers
    assert torch.equal(model.generate(ids, **beams), model.generate(ids, **beams, use_cache=False))
    cache = caches[0]
    assert cache.rolling_layers == (True, False, True, False)
    assert (
        cache.local_buffer is not None
        and cache.local_buffer.shape[0] == 2
        and cache.local_buffer.shape[-2] == 3
    )
    assert cache.buffer.shape[0] == 2 and cache.buffer.shape[-2] == 18  # prompt 6 + 12 new


@pytest.mark.parametrize(
    ("name", "stack"),
    [
        # ALiBi is a bias over keys in order: the full buffer
        ("alibi", {"pattern": {"kind": "sliding_window", "window": 3}}),
    ],
)
def test_stacks_a_rolling_buffer_cannot_serve_keep_the_full_one(tiny, prompts, caches, name, stack):
    model = _windowed(tiny, name, **stack)
    ids, mask = prompts(model.spec.vocab_size, [6, 3])
    cached = model.generate(ids, attention_mask=mask, max_new_tokens=10, eos_token_id=[])
    assert torch.equal(
        cached, model.generate(ids, attention_mask=mask, max_new_tokens=10, eos_token_id=[], use_cache=False)
    )
    assert caches[0].window is None and caches[0].buffer.shape[-2] == 16


def test_beam_search_reorders_the_rolling_buffer(tiny, prompts):
    model = _windowed(tiny)
    ids, mask = prompts(model.spec.vocab_size, [6, 3])
    kwargs = dict(attention_mask=mask, max_new_tokens=10, eos_token_id=[], num_beams=3)
    assert torch.equal(model.generate(ids, **kwargs), model.generate(ids, **kwargs, use_cache=False))


def test_key_positions_follow_the_slots():
    cache = KVCache(
        num_layers=1, batch_size=1, num_kv_heads=1, head_dim=2, max_length=10, cross_attention=False,
        dtype=torch.float32, device="cpu", window=3,
    )  # fmt: skip
    assert cache.key_positions(5).tolist() == [0, 1, 2, 3, 4]  # the prompt sees itself
    cache.length = 1
    assert cache.key_positions(1).tolist() == [0, 1, -1]  # position 1 in slot 1; slot 2 still empty
    cache.length = 7
    assert cache.key_positions(1).tolist() == [6, 7, 5]  # 7 overwrote 4 in slot 1
    assert cache.key_positions(2).tolist() == [6, 4, 5, 7, 8]  # a chunk: the slots before it, then itself
    assert KVCache(
        num_layers=1, batch_size=1, num_kv_heads=1, head_dim=2, max_length=3, cross_attention=False,
        dtype=torch.float32, device="cpu", window=3,
    ).window is None  # fmt: skip  # a window as long as the run: an ordinary cache


def test_the_rolling_slots_start_at_zero_not_uninitialised_memory(monkeypatch):
    """An empty slot is masked, but attention still multiplies its value by a weight of 0, and 0 x NaN is NaN:
    the rolling buffer must not start as whatever memory held (a NaN there poisoned a whole row once)."""
    real_empty = torch.empty

    def poisoned_empty(*args, **kwargs):  # what uninitialised memory may hold
        return real_empty(*args, **kwargs).fill_(float("nan"))

    monkeypatch.setattr(torch, "empty", poisoned_empty)
    cache = KVCache(
        num_layers=2, batch_size=1, num_kv_heads=1, head_dim=2, max_length=10, cross_attention=False,
        dtype=torch.float32, device="cpu", window=3,
    )  # fmt: skip
    assert cache.local_buffer is not None and bool(torch.isfinite(cache.local_buffer).all())


@pytest.mark.slow  # torch.compile of the decode step: tens of seconds on a small CPU
def test_compiled_decoding_with_a_rolling_cache_equals_eager(tiny, prompts):
    model = _windowed(tiny)
    ids, mask = prompts(model.spec.vocab_size, [7, 4, 6])
    kwargs = dict(attention_mask=mask, max_new_tokens=12, eos_token_id=[])
    assert torch.equal(model.generate(ids, **kwargs, compile=True), model.generate(ids, **kwargs))


@pytest.mark.slow  # a dynamo trace of the decode step: ~8 s on a small CPU
def test_a_decode_step_with_local_and_global_caches_compiles_to_one_graph(tiny, prompts):
    """The rolling slots' key positions and the full layers' plain mask, both traced in one graph."""
    from zoo.generation.session import Session, decode_step

    local = {"kind": "sliding_window", "window": 3}
    model = tiny("gemma-tiny", decoder={"layer_patterns": [local, {"kind": "causal"}] * 2})
    ids, mask = prompts(model.spec.vocab_size, [3, 6])
    reports = []
    with torch.no_grad():
        session = Session(model, ids, mask, max_new_tokens=4)
        assert session.cache is not None and session.cache.rolling_layers == (True, False, True, False)
        session.append(session.logits().argmax(dim=-1))  # the prefill, eagerly
        session.step = lambda *args: reports.append(torch._dynamo.explain(decode_step)(*args))
        session.logits()  # one decode step, traced
    assert (reports[0].graph_count, reports[0].graph_break_count) == (1, 0), reports[0].break_reasons
