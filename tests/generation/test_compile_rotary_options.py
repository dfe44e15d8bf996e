"""The decode step of models with partial rotary, the parallel residual and LongRoPE compiles to one graph
(LongRoPE's choice between its tables is a ``torch.where`` on the step's largest position, no host sync),
and the compiled tokens are the eager ones."""

from __future__ import annotations

import pytest
import torch

import zoo
from zoo.generation.session import Session, decode_step


@pytest.mark.parametrize("preset", ["pythia-tiny", "phi3-tiny"])
def test_a_left_padded_decode_step_compiles_to_one_graph(lively, prompts, preset):
    torch.manual_seed(0)
    model = lively(zoo.build(preset).eval())
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
