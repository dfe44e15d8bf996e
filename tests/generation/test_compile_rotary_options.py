"""The decode step of models with partial rotary, the parallel residual, LongRoPE, YaRN with no-rope layers
and dynamic NTK compiles to one graph (LongRoPE's choice between its tables and dynamic NTK's between its
table and the rates of the step's length are a ``torch.where`` on the step's largest position, no host
sync), and the compiled tokens are the eager ones."""

from __future__ import annotations

import pytest
import torch

import zoo
from zoo.generation.session import Session, decode_step

YARN = {"type": "yarn", "factor": 4.0, "original_max_positions": 8}
DYNAMIC = {"type": "dynamic", "factor": 4.0, "original_max_positions": 8}
SPECS = {
    "pythia-tiny": lambda: zoo.preset("pythia-tiny"),
    "phi3-tiny": lambda: zoo.preset("phi3-tiny"),
    "yarn-nope": lambda: zoo.preset("llama-tiny").override(
        **{"position.scaling": YARN, "position.nope_layers": [0]}
    ),
    "dynamic": lambda: zoo.preset("llama-tiny").override(**{"position.scaling": DYNAMIC}),
}


@pytest.mark.parametrize("preset", list(SPECS))
def test_a_left_padded_decode_step_compiles_to_one_graph(lively, prompts, preset):
    torch.manual_seed(0)
    model = lively(zoo.build(SPECS[preset]()).eval())
    ids, mask = prompts(model.spec.vocab_size, [3, 6])
    reports = []
    with torch.no_grad():
        session = Session(model, ids, mask, max_new_tokens=4)
        assert session.mask is not None  # padding reaches the step
        session.append(session.logits().argmax(dim=-1))  # the prefill, eagerly
        session.step = lambda *args: reports.append(torch._dynamo.explain(decode_step)(*args))
        session.logits()  # one decode step, traced
    assert (reports[0].graph_count, reports[0].graph_break_count) == (1, 0), reports[0].break_reasons


@pytest.mark.slow  # a cold compile, ~30-40 s
def test_compiled_longrope_decoding_across_the_switch_gives_the_eager_tokens(lively, prompts):
    torch.manual_seed(0)
    model = lively(zoo.build("phi3-tiny").eval())  # original context 32: the prompt of 28 + 10 crosses it
    ids, mask = prompts(model.spec.vocab_size, [28, 20])
    kwargs = dict(attention_mask=mask, max_new_tokens=10, eos_token_id=[])
    assert torch.equal(model.generate(ids, compile=True, **kwargs), model.generate(ids, **kwargs))


@pytest.mark.slow  # a cold compile, ~30-40 s
def test_compiled_dynamic_ntk_decoding_past_the_original_context_gives_the_eager_tokens(lively, prompts):
    torch.manual_seed(0)
    model = lively(zoo.build(SPECS["dynamic"]()).eval())  # original context 8: the rates change every step
    ids, mask = prompts(model.spec.vocab_size, [6, 3])
    kwargs = dict(attention_mask=mask, max_new_tokens=10, eos_token_id=[])
    assert torch.equal(model.generate(ids, compile=True, **kwargs), model.generate(ids, **kwargs))
