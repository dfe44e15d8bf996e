"""The KV cache: cached decoding equals full recomputation for every position scheme, without reallocation."""

from __future__ import annotations

import pytest
import torch

import zoo
from zoo.generation import KVCache
from zoo.generation.cache import cache_dtype


def _source_and_prompt(model: zoo.ZooModel, prompts) -> tuple[torch.Tensor, torch.Tensor]:
    return prompts(model.spec.vocab_size, [7, 4, 6])  # left-padded rows of different lengths


def test_cached_and_uncached_greedy_give_identical_tokens(any_model, prompts):
    ids, mask = _source_and_prompt(any_model, prompts)
    cached = any_model.generate(ids, attention_mask=mask, max_new_tokens=12, eos_token_id=[])
    uncached = any_model.generate(
        ids, attention_mask=mask, max_new_tokens=12, eos_token_id=[], use_cache=False
    )
    assert (
        cached.shape == uncached.shape == (3, (1 if any_model.spec.family == "encoder-decoder" else 7) + 12)
    )
    assert torch.equal(cached, uncached)


def test_cached_step_logits_match_the_full_forward_at_every_position(any_model, prompts):
    """Feed a sequence one token at a time through the cache; each step's logits equal the full forward's."""
    ids, mask = _source_and_prompt(any_model, prompts)
    B, T = ids.shape
    encoder_decoder = any_model.spec.family == "encoder-decoder"
    tokens = torch.randint(3, any_model.spec.vocab_size, (B, 6))
    cache = KVCache.for_stack(any_model.decoder, batch_size=B, max_length=6 if encoder_decoder else T + 6)
    with torch.no_grad():
        if encoder_decoder:
            memory = any_model.encode(ids, mask).hidden
            full = any_model.decode(tokens, memory=memory, memory_mask=mask)[1]
            steps = [
                any_model.decode(tokens[:, t : t + 1], memory=memory, memory_mask=mask, cache=cache)[1]
                for t in range(6)
            ]
        else:
            sequence, seq_mask = (
                torch.cat([ids, tokens], dim=1),
                torch.cat([mask, torch.ones_like(tokens)], 1),
            )
            full = any_model(sequence, attention_mask=seq_mask).logits[:, T:]
            prefill = any_model(ids, attention_mask=mask, cache=cache).logits
            torch.testing.assert_close(
                prefill, any_model(ids, attention_mask=mask).logits, atol=2e-4, rtol=1e-4
            )
            steps = [
                any_model(tokens[:, t : t + 1], attention_mask=seq_mask[:, : T + t + 1], cache=cache).logits
                for t in range(6)
            ]
    assert cache.length == (6 if encoder_decoder else T + 6)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=2e-4, rtol=1e-4)


def test_cache_buffer_is_allocated_once_and_filled_in_place(tiny):
    model = tiny("gpt2-tiny")
    cache = KVCache.for_stack(model.decoder, batch_size=2, max_length=10)
    buffer, address = cache.buffer, cache.buffer.data_ptr()
    assert buffer.shape == (2, 2, 2, 4, 10, 16)  # (layers, k|v, B, K, L, D)
    ids = torch.randint(3, 500, (2, 4))
    with torch.no_grad():
        model(ids, cache=cache)
        for _ in range(3):
            model(ids[:, :1], cache=cache)
    assert cache.buffer is buffer and cache.buffer.data_ptr() == address
    assert cache.length == 7
    layer0_keys = buffer[0, 0, :, :, :7]
    assert layer0_keys.abs().sum(dim=(0, 1, 3)).gt(0).all()  # every written position holds keys


def test_cache_overflow_is_a_clear_error(tiny):
    model = tiny("gpt2-tiny")
    cache = KVCache.for_stack(model.decoder, batch_size=1, max_length=4)
    with (
        torch.no_grad(),
        pytest.raises(ValueError, match=r"KV cache overflow: 0 cached \+ 5 new.*max_length \(4\)"),
    ):
        model(torch.randint(3, 500, (1, 5)), cache=cache)


def test_shared_layers_get_one_cache_slot_per_application(tiny):
    model = tiny("shared-layers")
    assert len(model.decoder.layers) == 1
    cache = KVCache.for_stack(model.decoder, batch_size=1, max_length=8)
    assert len(cache.layers) == 3
    with torch.no_grad():
        model(torch.randint(3, 500, (1, 5)), cache=cache)
    written = cache.buffer[:, 0, 0, :, :5]  # (applications, K, 5, D)
    assert not torch.allclose(written[0], written[1]) and not torch.allclose(written[1], written[2])


def test_encoder_runs_once_and_cross_attention_projects_memory_once(tiny):
    model = tiny("bart-tiny")
    calls = {"encoder": 0, "kv_proj": 0}
    model.encoder.register_forward_hook(lambda *_: calls.__setitem__("encoder", calls["encoder"] + 1))
    for layer in model.decoder.layers:
        layer.cross_attn.kv_proj.register_forward_hook(
            lambda *_: calls.__setitem__("kv_proj", calls["kv_proj"] + 1)
        )
    out = model.generate(torch.randint(3, 500, (2, 9)), max_new_tokens=8, eos_token_id=[])
    assert out.shape == (2, 9)
    assert calls == {"encoder": 1, "kv_proj": len(model.decoder.layers)}


def test_half_precision_models_keep_a_float32_cache_on_cpu():
    assert cache_dtype(torch.bfloat16, torch.device("cpu")) == torch.float32
    assert cache_dtype(torch.float32, torch.device("cpu")) == torch.float32
    assert cache_dtype(torch.bfloat16, torch.device("cuda")) == torch.bfloat16


def test_bfloat16_model_generates_with_its_float32_cache(tiny, prompts):
    model = tiny("llama-tiny").to(torch.bfloat16)
    ids, mask = prompts(model.spec.vocab_size, [5, 3])
    out = model.generate(ids, attention_mask=mask, max_new_tokens=6, eos_token_id=[])
    assert out.shape == (2, 11) and out.dtype == torch.long
    assert torch.equal(out[:, :5], ids)


@pytest.mark.parametrize("encoder_decoder", [False, True])
def test_a_finished_runs_cache_is_freed_without_the_garbage_collector(tiny, prompts, encoder_decoder):
    """No reference cycle holds the keys/values: they go when the run does, not when the cyclic collector
    next runs (which would keep the previous call's cache alive while the next call allocates its own)."""
    import gc
    import weakref

    model = tiny("t5-tiny" if encoder_decoder else "gpt2-tiny")
    ids, mask = prompts(model.spec.vocab_size, [4, 6])
    gc.disable()  # only reference counting frees from here (a gc.collect first: ~1 s late in the suite, for nothing)
    try:
        cache = KVCache.for_stack(model.decoder, batch_size=2, max_length=16)
        buffer = weakref.ref(cache.buffer)
        with torch.no_grad():
            if encoder_decoder:
                memory = model.encode(ids, mask).hidden
                model.decode(ids[:, :1], memory=memory, memory_mask=mask, cache=cache)
            else:
                model(ids, attention_mask=mask, cache=cache)
        del cache
        assert buffer() is None
    finally:
        gc.enable()
