"""Streaming: tokens arrive step by step, equal to what generate returns, without leaking no-grad or eval."""

from __future__ import annotations

import torch

from zoo.generation import stream


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
