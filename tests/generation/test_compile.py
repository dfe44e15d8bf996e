"""The decode step runs under torch.compile and gives the eager tokens."""

from __future__ import annotations

import pytest
import torch


@pytest.mark.slow
@pytest.mark.parametrize("name", ["llama-tiny", "t5-tiny"])
def test_compiled_decode_step_gives_the_eager_tokens(tiny, prompts, name):
    model = tiny(name)
    ids, mask = prompts(model.spec.vocab_size, [6, 6])
    eager = model.generate(ids, attention_mask=mask, max_new_tokens=6, eos_token_id=[])
    compiled = model.generate(ids, attention_mask=mask, max_new_tokens=6, eos_token_id=[], compile=True)
    assert torch.equal(compiled, eager)
