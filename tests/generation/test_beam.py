"""Beam search: one beam is greedy, enough beams are exhaustive, more beams never score below greedy."""

from __future__ import annotations

import itertools

import pytest
import torch

import zoo
from zoo.generation.beam import beam_search
from zoo.generation.config import GenerationConfig
from zoo.generation.sampling import LogitsProcessors
from zoo.generation.session import Session


def sequence_logprob(
    model: zoo.ZooModel, source: torch.Tensor, out: torch.Tensor, prompt_len: int
) -> torch.Tensor:
    """Sum of log p(token | prefix) over the generated tokens of each row (B,), from one full forward."""
    with torch.no_grad():
        if model.spec.family == "encoder-decoder":
            logits = model(source, decoder_input_ids=out[:, :-1]).logits
        else:
            logits = model(out[:, :-1]).logits
    logp = logits.float().log_softmax(-1).gather(2, out[:, 1:, None]).squeeze(2)  # (B, L-1)
    return logp[:, prompt_len - 1 :].sum(-1)


def test_one_beam_is_greedy_search(any_model, prompts):
    ids, mask = prompts(any_model.spec.vocab_size, [6, 4])
    greedy = any_model.generate(ids, attention_mask=mask, max_new_tokens=9, eos_token_id=[])
    config = GenerationConfig(num_beams=1, max_new_tokens=9)
    with torch.no_grad():
        session = Session(any_model, ids, mask, max_new_tokens=9, num_beams=1)
        beamed = beam_search(
            session, LogitsProcessors(vocab_size=any_model.spec.vocab_size), config, eos=None, pad=0
        )
    assert torch.equal(beamed, greedy)


def test_enough_beams_find_the_exhaustive_best_sequence(tiny):
    model = tiny("llama-tiny", vocab_size=6, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    V, steps = 6, 3
    prompt = torch.tensor([[3, 4, 5]])
    out = model.generate(prompt, max_new_tokens=steps, num_beams=V ** (steps - 1), eos_token_id=[])
    candidates = torch.tensor(list(itertools.product(range(V), repeat=steps)))  # every continuation
    full = torch.cat([prompt.expand(len(candidates), -1), candidates], dim=1)
    scores = sequence_logprob(model, None, full, prompt_len=3)
    assert torch.equal(out[0], full[scores.argmax()])


def reference_beam_search(
    model: zoo.ZooModel, source: torch.Tensor, start: torch.Tensor, beams: int, steps: int
):
    """Textbook beam search for one row, without eos: keep the `beams` best prefixes by summed log-prob,
    rescoring every prefix with a full forward (no cache). Returns the best sequence (1, len(start) + steps)."""
    V = model.spec.vocab_size
    prefixes, scores = start[None], torch.zeros(1)
    with torch.no_grad():
        for _ in range(steps):
            if model.spec.family == "encoder-decoder":
                logits = model(source.expand(len(prefixes), -1), decoder_input_ids=prefixes).logits
            else:
                logits = model(prefixes).logits
            totals = (scores[:, None] + logits[:, -1].float().log_softmax(-1)).flatten()  # (n * V,)
            scores, picked = totals.topk(min(beams, len(totals)))
            prefixes = torch.cat([prefixes[picked // V], (picked % V)[:, None]], dim=1)
    return prefixes[:1]


@pytest.mark.parametrize("num_beams", [2, 4])
def test_beam_search_equals_the_textbook_algorithm(any_model, prompts, num_beams):
    ids, _ = prompts(any_model.spec.vocab_size, [5, 5], seed=5)
    out = any_model.generate(ids, max_new_tokens=6, num_beams=num_beams, eos_token_id=[])
    for row in range(2):
        start = (
            torch.tensor([any_model.spec.start_token_id])
            if any_model.spec.family == "encoder-decoder"
            else ids[row]
        )
        expected = reference_beam_search(any_model, ids[row : row + 1], start, num_beams, 6)
        assert torch.equal(out[row], expected[0])


@pytest.mark.parametrize("name", ["llama-tiny", "t5-tiny", "gpt2-tiny"])
def test_beams_score_at_least_as_well_as_greedy(tiny, prompts, name):
    # Beam search is not monotone in the beam width for every input, so this is checked on the whole of a
    # fixed batch: the summed score over eight prompts.
    model = tiny(name)
    ids, _ = prompts(model.spec.vocab_size, [5] * 8, seed=5)
    settings = dict(max_new_tokens=8, eos_token_id=[])
    greedy = model.generate(ids, **settings)
    beamed = model.generate(ids, num_beams=4, **settings)
    assert beamed.shape == greedy.shape and not torch.equal(beamed, greedy)
    prompt_len = 1 if model.spec.family == "encoder-decoder" else 5
    beam_score = sequence_logprob(model, ids, beamed, prompt_len).sum()
    assert beam_score > sequence_logprob(model, ids, greedy, prompt_len).sum()


def test_cached_and_uncached_beam_search_agree(any_model, prompts):
    ids, mask = prompts(any_model.spec.vocab_size, [6, 3])
    settings = dict(attention_mask=mask, max_new_tokens=8, num_beams=3)
    assert torch.equal(
        any_model.generate(ids, **settings), any_model.generate(ids, use_cache=False, **settings)
    )


def test_beam_search_rows_match_each_row_alone(tiny, prompts):
    model = tiny("llama-tiny")
    ids, mask = prompts(model.spec.vocab_size, [7, 3], seed=2)
    batched = model.generate(ids, attention_mask=mask, max_new_tokens=8, num_beams=3, eos_token_id=[])
    alone = model.generate(ids[1:, 4:], max_new_tokens=8, num_beams=3, eos_token_id=[])
    assert torch.equal(batched[1, 4:], alone[0])


def test_finished_hypotheses_end_with_eos_and_are_padded_to_the_longest(tiny):
    model = tiny("t5-tiny")
    source = torch.randint(3, 500, (3, 6), generator=torch.Generator().manual_seed(6))
    greedy = model.generate(source, max_new_tokens=10, eos_token_id=[])
    eos = int(greedy[0, 1])  # sentence 0's most likely first token: ending right there scores best
    out = model.generate(
        source, max_new_tokens=10, num_beams=3, eos_token_id=eos, pad_token_id=9, length_penalty=0.0
    )
    assert out[0, :2].tolist() == [model.spec.start_token_id, eos] and (out[0, 2:] == 9).all()
    for row in out.tolist():
        if eos in row[1:]:
            end = row.index(eos, 1)
            assert all(token == 9 for token in row[end + 1 :])
        else:
            assert len(row) == out.shape[1] == 11  # a hypothesis without eos ran to max_new_tokens


def test_length_penalty_favours_longer_hypotheses(tiny):
    model = tiny("t5-tiny")
    source = torch.randint(3, 500, (6, 6), generator=torch.Generator().manual_seed(7))
    free = model.generate(source, max_new_tokens=10, num_beams=4, eos_token_id=[])
    eos = int(free[:, 1:4].flatten().mode().values)  # a common early token: hypotheses may end early
    lengths = {}
    for penalty in (-2.0, 2.0):
        out = model.generate(
            source, max_new_tokens=10, num_beams=4, eos_token_id=eos, pad_token_id=9, length_penalty=penalty
        )
        lengths[penalty] = (out != 9).sum().item()
    assert lengths[2.0] >= lengths[-2.0]


def test_early_stopping_never_returns_longer_output(tiny):
    model = tiny("bart-tiny")
    source = torch.randint(3, 500, (2, 6), generator=torch.Generator().manual_seed(8))
    early = model.generate(source, max_new_tokens=12, num_beams=3, early_stopping=True)
    late = model.generate(source, max_new_tokens=12, num_beams=3, early_stopping="never")
    assert early.shape[1] <= late.shape[1]


def test_beam_sampling_is_reproducible(tiny):
    model = tiny("gpt2-tiny")
    ids = torch.randint(3, 500, (2, 4))
    settings = dict(max_new_tokens=6, num_beams=3, do_sample=True, eos_token_id=[])
    assert torch.equal(model.generate(ids, seed=3, **settings), model.generate(ids, seed=3, **settings))
