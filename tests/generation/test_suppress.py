"""suppress_tokens, begin_suppress_tokens and decoder_prompt_ids: transformers' SuppressTokens processors and
Whisper's init tokens as plain generation options, on any model (tests/io/test_hf_whisper.py holds the
parity with transformers' Whisper)."""

from __future__ import annotations

import pytest
import torch

import zoo


@pytest.fixture(scope="module")
def gpt() -> zoo.ZooModel:
    torch.manual_seed(0)
    return zoo.build(zoo.preset("gpt2-tiny").override(dropout=0.0)).eval()


def test_suppressed_tokens_never_come_and_begin_suppressed_ones_not_first(gpt: zoo.ZooModel) -> None:
    prompt = torch.tensor([[5, 6, 7]])
    plain = gpt.generate(prompt, max_new_tokens=6, eos_token_id=[])[0, 3:].tolist()
    first = plain[0]
    begun = gpt.generate(prompt, max_new_tokens=6, eos_token_id=[], begin_suppress_tokens=[first])[0, 3:]
    assert begun[0] != first  # only the first new token is held back
    banned = sorted(set(plain))
    never = gpt.generate(prompt, max_new_tokens=6, eos_token_id=[], suppress_tokens=banned)[0, 3:]
    assert not set(never.tolist()) & set(banned)


def test_a_decoder_prompt_is_the_start_token_and_the_ids(gpt: zoo.ZooModel) -> None:
    model = zoo.build("t5-tiny").eval()
    source = torch.tensor([[4, 5, 6, 1]])
    start = model.decoder_start_token_id
    fixed = model.generate(source, max_new_tokens=3, decoder_prompt_ids=[7, 8], eos_token_id=[])
    given = model.generate(
        source, max_new_tokens=3, decoder_input_ids=torch.tensor([[start, 7, 8]]), eos_token_id=[]
    )
    assert fixed.tolist() == given.tolist() and fixed[0, :3].tolist() == [start, 7, 8]
    with pytest.raises(ValueError, match="give decoder_prompt_ids or decoder_input_ids, not both"):
        model.generate(source, decoder_prompt_ids=[7], decoder_input_ids=torch.tensor([[start]]))
    with pytest.raises(ValueError, match="decoder_prompt_ids is for an encoder-decoder's decoder"):
        gpt.generate(torch.tensor([[5]]), decoder_prompt_ids=[7])
    with pytest.raises(ValueError, match=r"suppress_tokens \(\(99999,\)\) must be token ids in \[0, 512\)"):
        gpt.generate(torch.tensor([[5]]), suppress_tokens=[99999])
