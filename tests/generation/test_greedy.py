"""Greedy search: the argmax of the full forward, padding-invariant, with Hugging Face's eos semantics."""

from __future__ import annotations

import torch

import zoo


def reference_greedy(model: zoo.ZooModel, ids: torch.Tensor, mask: torch.Tensor, steps: int) -> torch.Tensor:
    """The textbook loop: run the whole model on everything so far, take the argmax, append. No cache."""
    with torch.no_grad():
        if model.spec.family == "encoder-decoder":
            out = torch.full((ids.shape[0], 1), model.spec.start_token_id)
            for _ in range(steps):
                logits = model(ids, attention_mask=mask, decoder_input_ids=out).logits
                out = torch.cat([out, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
            return out
        out, out_mask = ids, mask
        for _ in range(steps):
            logits = model(out, attention_mask=out_mask).logits
            out = torch.cat([out, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
            out_mask = torch.cat([out_mask, torch.ones_like(out_mask[:, :1])], dim=1)
        return out


def test_greedy_equals_a_step_by_step_argmax_over_the_full_forward(any_model, prompts):
    ids, mask = prompts(any_model.spec.vocab_size, [6, 3])
    got = any_model.generate(ids, attention_mask=mask, max_new_tokens=10, eos_token_id=[])
    assert torch.equal(got, reference_greedy(any_model, ids, mask, 10))


def test_left_padded_rows_give_exactly_the_tokens_they_give_alone(any_model, prompts):
    ids, mask = prompts(any_model.spec.vocab_size, [8, 3, 5])
    batched = any_model.generate(ids, attention_mask=mask, max_new_tokens=10, eos_token_id=[])
    for row in range(3):
        real = mask[row].bool()
        alone = any_model.generate(ids[row : row + 1, real], max_new_tokens=10, eos_token_id=[])
        if any_model.spec.family == "encoder-decoder":
            assert torch.equal(batched[row], alone[0])
        else:
            padding = int((~real).sum())
            assert torch.equal(batched[row, :padding], ids[row, :padding])  # the padding is returned as given
            assert torch.equal(batched[row, padding:], alone[0])


def test_decoder_output_is_prompt_then_new_tokens(tiny, prompts):
    model = tiny("gpt2-tiny")
    ids, mask = prompts(model.spec.vocab_size, [5, 5])
    out = model.generate(ids, attention_mask=mask, max_new_tokens=7, eos_token_id=[])
    assert out.shape == (2, 12) and torch.equal(out[:, :5], ids)


def test_encoder_decoder_output_starts_with_the_decoder_start_token(tiny, prompts):
    model = tiny("t5-tiny")
    ids, mask = prompts(model.spec.vocab_size, [5, 2])
    out = model.generate(ids, attention_mask=mask, max_new_tokens=7, eos_token_id=[])
    assert out.shape == (2, 8) and (out[:, 0] == model.spec.start_token_id).all()


def test_rows_that_produce_eos_stop_and_are_padded_afterwards(tiny, prompts):
    model = tiny("gpt2-tiny")
    ids, mask = prompts(model.spec.vocab_size, [6, 6, 6], seed=3)
    free = model.generate(ids, attention_mask=mask, max_new_tokens=8, eos_token_id=[])[:, 6:]
    # Row 0's first new token that is not a repeat becomes the end of sequence (tiny random models loop).
    step = next(k for k in range(1, 8) if free[0, k] not in free[0, :k])
    eos = int(free[0, step])
    pad = 7
    out = model.generate(ids, attention_mask=mask, max_new_tokens=8, eos_token_id=eos, pad_token_id=pad)[
        :, 6:
    ]
    for row in range(3):
        hits = (free[row] == eos).nonzero()
        if len(hits) == 0:
            assert torch.equal(out[row], free[row][: out.shape[1]])
            continue
        stop = int(hits[0])
        assert torch.equal(out[row, : stop + 1], free[row, : stop + 1])  # identical up to and including eos
        assert (out[row, stop + 1 :] == pad).all()  # then padding
    assert out[0, step] == eos and (out[0, step + 1 :] == pad).all()


def test_generation_stops_early_once_every_row_is_finished(tiny):
    model = tiny("gpt2-tiny")
    ids = torch.randint(3, 500, (1, 4))
    first = int(model.generate(ids, max_new_tokens=1, eos_token_id=[])[0, -1])
    out = model.generate(ids, max_new_tokens=20, eos_token_id=first)
    assert out.shape == (1, 5) and out[0, -1] == first


def test_eos_may_be_a_list_of_ids(tiny):
    model = tiny("gpt2-tiny")
    ids = torch.randint(3, 500, (1, 4))
    free = model.generate(ids, max_new_tokens=6, eos_token_id=[])[0, 4:]
    out = model.generate(ids, max_new_tokens=6, eos_token_id=[1, int(free[3])])
    assert out.shape[1] <= 4 + 4 and out[0, -1] in (1, int(free[3]))


def test_min_new_tokens_blocks_eos_until_reached(tiny):
    model = tiny("gpt2-tiny")
    ids = torch.randint(3, 500, (2, 4))
    first = model.generate(ids, max_new_tokens=1, eos_token_id=[])[:, -1]
    eos = int(first[0])
    out = model.generate(ids, max_new_tokens=6, min_new_tokens=3, eos_token_id=eos, pad_token_id=0)[:, 4:]
    assert (out[:, :3] != eos).all()
    assert out[0, 0] != first[0]  # the argmax was eos, so the runner-up was taken


def test_default_eos_and_pad_come_from_the_spec(tiny):
    ids = torch.randint(3, 500, (2, 4))
    free = tiny("gpt2-tiny").generate(ids, max_new_tokens=4, eos_token_id=[])[:, 4:]
    assert free[0, 0] != free[1, 0]
    model = tiny("gpt2-tiny", eos_token_id=int(free[0, 0]), pad_token_id=9)  # same weights, other ids
    out = model.generate(ids, max_new_tokens=4)[:, 4:]
    assert out[0, 0] == free[0, 0]
    stop = (free[1] == free[0, 0]).nonzero()
    if len(stop) == 0:  # row 1 runs on: row 0 is padded with the spec's pad id
        assert (out[0, 1:] == 9).all() and torch.equal(out[1], free[1])


def test_generate_runs_in_eval_mode_and_restores_the_training_flag(tiny, prompts):
    model = tiny("bart-tiny")  # dropout 0.1: a training-mode forward would be random
    ids, mask = prompts(model.spec.vocab_size, [5, 4])
    expected = model.generate(ids, attention_mask=mask, max_new_tokens=6)
    model.train()
    assert torch.equal(model.generate(ids, attention_mask=mask, max_new_tokens=6), expected)
    assert model.training


def test_generated_ids_carry_no_autograd_history(tiny):
    model = tiny("gpt2-tiny")
    out = model.generate(torch.randint(3, 500, (1, 3)), max_new_tokens=2)
    assert not out.requires_grad and not torch.is_inference(out)
