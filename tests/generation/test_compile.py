"""The decode step runs under torch.compile and gives the eager tokens (each compile takes ~30-40 s cold)."""

from __future__ import annotations

import pytest
import torch


@pytest.mark.parametrize("name", ["llama-tiny", pytest.param("t5-tiny", marks=pytest.mark.slow)])
def test_compiled_decode_step_gives_the_eager_tokens(tiny, prompts, name):
    model = tiny(name)
    ids, mask = prompts(model.spec.vocab_size, [6, 6])
    eager = model.generate(ids, attention_mask=mask, max_new_tokens=6, eos_token_id=[])
    compiled = model.generate(ids, attention_mask=mask, max_new_tokens=6, eos_token_id=[], compile=True)
    assert torch.equal(compiled, eager)


def test_frozen_bf16_compile_follows_weight_updates(tiny, prompts):
    """bf16 compiles with Inductor's weight freezing; an in-place weight update must not leave stale constants."""
    model = tiny("gpt2-tiny").to(torch.bfloat16)
    ids, mask = prompts(model.spec.vocab_size, [5, 5])
    kwargs = dict(attention_mask=mask, max_new_tokens=5, eos_token_id=[])
    assert torch.equal(model.generate(ids, compile=True, **kwargs), model.generate(ids, **kwargs))
    with torch.no_grad():
        model.embed.tokens.weight.mul_(-1.0)  # a different model, same parameter objects
    assert torch.equal(model.generate(ids, compile=True, **kwargs), model.generate(ids, **kwargs))
