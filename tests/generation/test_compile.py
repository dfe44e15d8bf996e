"""The decode step runs under torch.compile and gives the eager tokens (each compile takes ~30-40 s cold)."""

from __future__ import annotations

import pytest
import torch

from zoo.generation.compiled import _FROZEN
from zoo.generation.session import Session, decode_step


# Slow, each (5 s): by default float32 batches compile unfrozen and give eager's tokens in
# test_an_unfrozen_float32_step_reads_every_weight_through_the_library_gemm, and llama-tiny's blocks compile
# (frozen) in test_a_left_padded_bf16_batch_compiles_frozen_and_gives_the_eager_tokens.
@pytest.mark.parametrize(
    "name",
    [
        pytest.param("llama-tiny", marks=pytest.mark.slow),
        pytest.param("t5-tiny", marks=pytest.mark.slow),
        pytest.param("gemma-tiny", marks=pytest.mark.slow),
        pytest.param("moe-tiny", marks=pytest.mark.slow),
        pytest.param("deepseek-tiny", marks=pytest.mark.slow),
        pytest.param("olmo2-tiny", marks=pytest.mark.slow),
        pytest.param("cohere2-tiny", marks=pytest.mark.slow),
        pytest.param("gpt-oss-tiny", marks=pytest.mark.slow),
    ],
)
def test_compiled_decode_step_gives_the_eager_tokens(tiny, prompts, name):
    model = tiny(name)
    ids, mask = prompts(model.spec.vocab_size, [6, 6])
    eager = model.generate(ids, attention_mask=mask, max_new_tokens=6, eos_token_id=[])
    compiled = model.generate(ids, attention_mask=mask, max_new_tokens=6, eos_token_id=[], compile=True)
    assert torch.equal(compiled, eager)


@pytest.mark.parametrize("name", ["gpt2-tiny", pytest.param("t5-tiny", marks=pytest.mark.slow)])
def test_a_compiled_run_compiles_the_decode_step_alone(tiny, prompts, name):
    """The prompt's prefill (an encoder-decoder's first step, which fills the cross-attention cache) runs
    eagerly: a graph for it would be a second compile, and, frozen, a second copy of the weights."""
    from torch._dynamo.utils import counters

    model = tiny(name)
    ids, mask = prompts(model.spec.vocab_size, [6, 6])
    torch._dynamo.reset()  # an earlier test may have compiled the shared step for these shapes already
    counters.clear()
    model.generate(ids, attention_mask=mask, max_new_tokens=4, eos_token_id=[], compile=True)
    assert counters["stats"]["unique_graphs"] == 1


def test_frozen_bf16_compile_follows_weight_updates(tiny, prompts):
    """bf16 compiles with Inductor's weight freezing; an in-place weight update must not leave stale constants."""
    model = tiny("gpt2-tiny").to(torch.bfloat16)
    ids, mask = prompts(model.spec.vocab_size, [5, 5])
    kwargs = dict(attention_mask=mask, max_new_tokens=5, eos_token_id=[])
    assert torch.equal(model.generate(ids, compile=True, **kwargs), model.generate(ids, **kwargs))
    with torch.no_grad():
        model.embed.tokens.weight.mul_(-1.0)  # a different model, same parameter objects
    assert torch.equal(model.generate(ids, compile=True, **kwargs), model.generate(ids, **kwargs))


@pytest.mark.parametrize(
    "name",
    [
        "gpt2-tiny",
        "llama-tiny",
        "t5-tiny",
        "transformer-tiny",
        "gemma-tiny",
        "moe-tiny",
        "olmo2-tiny",
        "cohere2-tiny",
        "gpt-oss-tiny",
        "deepseek-tiny",
    ],
)
def test_a_left_padded_decode_step_compiles_to_one_graph(tiny, prompts, name):
    """The step never asks the mask whether it pads (a host sync, and a graph break per stack)."""
    model = tiny(name)
    ids, mask = prompts(model.spec.vocab_size, [3, 6])
    reports = []
    with torch.no_grad():
        session = Session(model, ids, mask, max_new_tokens=4)
        assert session.mask is not None or session.state.memory_mask is not None  # padding reaches the step
        session.append(session.logits().argmax(dim=-1))  # the prefill, eagerly
        session.step = lambda *args: reports.append(torch._dynamo.explain(decode_step)(*args))
        session.logits()  # one decode step, traced
    assert (reports[0].graph_count, reports[0].graph_break_count) == (1, 0), reports[0].break_reasons


def test_a_left_padded_bf16_batch_compiles_frozen_and_gives_the_eager_tokens(tiny, prompts):
    model = tiny("llama-tiny").to(torch.bfloat16)
    ids, mask = prompts(model.spec.vocab_size, [3, 6])
    kwargs = dict(attention_mask=mask, max_new_tokens=5, eos_token_id=[])
    compiled = model.generate(ids, compile=True, **kwargs)  # frozen: fullgraph=True, a break would raise
    assert model in _FROZEN
    assert torch.equal(compiled, model.generate(ids, **kwargs))


def test_single_row_float32_compiles_without_a_frozen_copy_of_the_weights(tiny, prompts):
    # float32, one row: the wide matrices column-major (zoo.generation.weight_layout), no freezing
    model = tiny("gpt2-tiny")
    ids, _ = prompts(model.spec.vocab_size, [5])
    kwargs = dict(max_new_tokens=5, eos_token_id=[])
    compiled = model.generate(ids, compile=True, **kwargs)
    assert model not in _FROZEN
    assert torch.equal(compiled, model.generate(ids, **kwargs))


@pytest.mark.parametrize(
    ("rows", "mode"),
    [
        (8, torch.inference_mode),  # the weights row-major
        pytest.param(1, torch.no_grad, marks=pytest.mark.slow),  # the wide ones column-major (layout)
    ],
)
def test_an_unfrozen_float32_step_reads_every_weight_through_the_library_gemm(tiny, prompts, rows, mode):
    """Unfrozen, the weights are graph inputs: each of the step's matrices must reach the BLAS (Inductor's
    ``extern_kernels.mm/addmm``), never a loop Inductor generates, which runs far below it. Under
    ``inference_mode`` (as pipelines and servers call models) as under ``no_grad``; the tokens are eager's."""
    import re

    from torch._inductor.utils import run_and_get_code

    model = tiny("gpt2-tiny")
    ids, mask = prompts(model.spec.vocab_size, [5] * rows)
    kwargs = dict(attention_mask=mask, max_new_tokens=4, eos_token_id=[])
    with mode():
        compiled, codes = run_and_get_code(lambda: model.generate(ids, compile=True, **kwargs))
        eager = model.generate(ids, **kwargs)
    assert torch.equal(compiled, eager)
    gemms = [name for code in codes for name in re.findall(r"extern_kernels\.(\w*mm)\b", code)]
    matrices = 4 * model.spec.num_layers + 1  # q/k/v (fused), out, up, down per layer; the tied head
    assert len(gemms) == matrices, gemms


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiled_decoding_under_inference_mode_then_no_grad_gives_the_eager_tokens(tiny, prompts, dtype):
    model = tiny("gpt2-tiny").to(dtype)
    ids, mask = prompts(model.spec.vocab_size, [5, 3, 6, 4, 5, 6, 2, 5])
    kwargs = dict(attention_mask=mask, max_new_tokens=5, eos_token_id=[])
    with torch.no_grad():
        eager = model.generate(ids, **kwargs)
    for mode in (torch.inference_mode, torch.no_grad, torch.inference_mode):
        with mode():
            assert torch.equal(model.generate(ids, compile=True, **kwargs), eager)
