"""``compile="cuda-graphs"`` on the CPU: nothing is captured there, but the same static-shape step runs (all
L cache slots under a mask, the position written from a device-side index), so the arithmetic the CUDA
graph replays is checked here against eager decoding. The capture itself is tested in tests/cuda."""

from __future__ import annotations

import pytest
import torch

from zoo.generation.graphs import CudaGraphStep


# gemma-tiny: its sliding windows (16) span the 15 positions, so no layer rolls; soft-capped attention
@pytest.mark.parametrize(
    "name", ["gpt2-tiny", "llama-tiny", "moe-tiny", "gemma-tiny", "bart-tiny", "transformer-tiny"]
)
def test_the_static_step_gives_the_eager_greedy_tokens_on_left_padded_prompts(tiny, prompts, name):
    model = tiny(name)
    ids, mask = prompts(model.spec.vocab_size, [7, 4, 2])
    kwargs = dict(attention_mask=mask, max_new_tokens=8, eos_token_id=[])
    assert torch.equal(model.generate(ids, compile="cuda-graphs", **kwargs), model.generate(ids, **kwargs))


def test_the_static_step_serves_beams_sampling_and_unpadded_rows(tiny, prompts):
    model = tiny("llama-tiny")
    ids, mask = prompts(model.spec.vocab_size, [6, 3])
    beams = dict(attention_mask=mask, max_new_tokens=6, num_beams=3, eos_token_id=[])
    assert torch.equal(model.generate(ids, compile="cuda-graphs", **beams), model.generate(ids, **beams))
    sampled = dict(attention_mask=mask, max_new_tokens=6, do_sample=True, seed=3, eos_token_id=[])
    assert torch.equal(model.generate(ids, compile="cuda-graphs", **sampled), model.generate(ids, **sampled))
    one = dict(max_new_tokens=6, eos_token_id=[])  # no mask at all: a (1, 1) position row
    assert torch.equal(model.generate(ids[:1], compile="cuda-graphs", **one), model.generate(ids[:1], **one))


def test_the_static_step_advances_the_runs_cache_once_per_token(tiny, prompts):
    model = tiny("gpt2-tiny")
    ids, mask = prompts(model.spec.vocab_size, [5, 3])
    step = CudaGraphStep()
    calls = []

    def counted(*args):
        calls.append(args[4].length)  # the run's cache length before each per-token step
        return step(*args)

    from zoo.generation.session import Session

    with torch.no_grad():
        session = Session(model, ids, mask, max_new_tokens=4, step=counted)
        for _ in range(4):
            session.append(session.logits().argmax(-1))
    assert calls == [5, 6, 7]  # the prefill (5 columns) ran eagerly; then one step per fed-back token
    assert session.cache is not None and session.cache.length == 8


@pytest.mark.parametrize(
    ("name", "why"),
    [("t5-tiny", "position bias"), ("gemma-tiny", "rolling KV cache"), ("alibi", "position bias")],
)
def test_models_a_static_step_cannot_serve_are_refused_in_one_line(tiny, prompts, name, why):
    model = tiny(name)
    ids, mask = prompts(model.spec.vocab_size, [12, 12])  # 20 positions: past gemma-tiny's window of 16
    with pytest.raises(ValueError, match=f"compile='cuda-graphs' cannot decode this model: .*{why}"):
        model.generate(ids, attention_mask=mask, max_new_tokens=8, compile="cuda-graphs")


def test_a_bad_compile_value_or_no_cache_is_refused(tiny, prompts):
    model = tiny("gpt2-tiny")
    ids, mask = prompts(model.spec.vocab_size, [4])
    with pytest.raises(ValueError, match="compile must be True, False or 'cuda-graphs', got 'graphs'"):
        model.generate(ids, attention_mask=mask, max_new_tokens=2, compile="graphs")
    with pytest.raises(ValueError, match=r"needs the KV cache \(use_cache=True\)"):
        model.generate(ids, attention_mask=mask, max_new_tokens=3, compile="cuda-graphs", use_cache=False)
