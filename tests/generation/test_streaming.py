"""Streaming: tokens arrive step by step, equal to what generate returns, without leaking no-grad or eval."""

from __future__ import annotations

import pytest
import torch

from zoo.demo import toy_corpus
from zoo.generation import stream, stream_text
from zoo.io.tokenizer import Tokenizer, train_tokenizer


def test_stream_yields_each_steps_tokens_equal_to_generate(any_model, prompts):
    ids, mask = prompts(any_model.spec.vocab_size, [6, 4])
    expected = any_model.generate(ids, attention_mask=mask, max_new_tokens=9, eos_token_id=[])
    steps = list(stream(any_model, ids, attention_mask=mask, max_new_tokens=9, eos_token_id=[]))
    assert len(steps) == 9 and all(step.shape == (2,) for step in steps)
    assert torch.equal(torch.stack(steps, dim=1), expected[:, -9:])


def test_streamer_callback_sees_the_tokens_as_they_are_produced(tiny):
    model = tiny("llama-tiny")
    ids = torch.randint(3, 500, (2, 5))
    seen: list[torch.Tensor] = []
    out = model.generate(
        ids, max_new_tokens=7, eos_token_id=[], streamer=lambda tokens: seen.append(tokens.clone())
    )
    assert torch.equal(torch.stack(seen, dim=1), out[:, 5:])


def test_stream_stops_once_every_row_has_ended(tiny):
    model = tiny("llama-tiny")
    ids = torch.randint(3, 500, (1, 5))
    free = model.generate(ids, max_new_tokens=8, eos_token_id=[])[0, 5:]
    eos = int(free[2]) if free[2] not in free[:2] else int(free[0])
    steps = list(stream(model, ids, max_new_tokens=8, eos_token_id=eos))
    assert int(steps[-1]) == eos and len(steps) == free.tolist().index(eos) + 1


def test_stream_does_not_leak_no_grad_and_restores_train_mode(tiny):
    model = tiny("gpt2-tiny").train()
    tokens = stream(model, torch.randint(3, 500, (1, 4)), max_new_tokens=3, eos_token_id=[])
    for _ in tokens:
        assert torch.is_grad_enabled()  # the caller's grad mode, between steps
    assert model.training


@pytest.fixture(scope="module")
def bpe() -> Tokenizer:
    corpus = toy_corpus(seed=0, train_size=300, valid_size=10)
    return train_tokenizer(iter([t for pair in corpus.train for t in pair]), kind="bpe", vocab_size=400)


def test_stream_text_gives_each_rows_text_after_its_prompt(tiny, bpe):
    model = tiny("gpt2-tiny", vocab_size=bpe.vocab_size)
    prompts = ["the big dog", "a cat eats the"]
    batch = bpe(prompts, padding=True, padding_side="left", add_special_tokens=False, return_tensors="pt")
    T = batch["input_ids"].shape[1]
    out = model.generate(
        batch["input_ids"], attention_mask=batch["attention_mask"], max_new_tokens=12, eos_token_id=[]
    )
    steps = list(
        stream_text(
            model, bpe, batch["input_ids"], batch["attention_mask"], max_new_tokens=12, eos_token_id=[]
        )
    )
    assert len(steps) in (12, 13) and all(len(pieces) == 2 for pieces in steps)  # + 1 when a flush had text
    for row, prompt in enumerate(prompts):
        prompt_ids = bpe.encode(prompt, add_eos=False)
        expected = bpe.decode(prompt_ids + out[row, T:].tolist())[len(prompt) :]
        assert "".join(pieces[row] for pieces in steps) == expected


def test_stream_text_stops_a_row_at_its_eos(tiny, bpe):
    model = tiny("gpt2-tiny", vocab_size=bpe.vocab_size)
    ids = torch.tensor([bpe.encode("the big dog", add_eos=False)])
    free = model.generate(ids, max_new_tokens=8, eos_token_id=[])[0, ids.shape[1] :].tolist()
    eos = free[3] if free[3] not in free[:3] else free[0]
    end = free.index(eos) + 1
    steps = list(stream_text(model, bpe, ids, max_new_tokens=8, eos_token_id=eos))
    assert len(steps) == end  # the eos step flushes the row: no extra item
    text = "".join(pieces[0] for pieces in steps)
    assert text == bpe.decode(ids[0].tolist() + free[:end])[len("the big dog") :]


def test_stream_text_for_an_encoder_decoder_has_no_prompt_context(tiny, bpe):
    model = tiny("transformer-tiny", vocab_size=bpe.vocab_size)
    source = torch.tensor([bpe.encode("the big dog")])
    out = model.generate(source, max_new_tokens=6, eos_token_id=[])
    steps = list(stream_text(model, bpe, source, max_new_tokens=6, eos_token_id=[]))
    assert "".join(pieces[0] for pieces in steps) == bpe.decode(out[0, 1:].tolist())


def test_stream_text_checks_its_arguments_when_called(tiny, bpe):
    model = tiny("gpt2-tiny", vocab_size=bpe.vocab_size)
    with pytest.raises(ValueError, match="max_new_tokens must be an int >= 1"):
        stream_text(model, bpe, torch.tensor([[5, 6]]), max_new_tokens=0)  # not iterated
