"""Logits processors (checked against transformers' own) and sampling: reproducible, warps as documented."""

from __future__ import annotations

import itertools

import pytest
import torch
from transformers.generation import logits_process as hf

from zoo.generation import sampling


@pytest.fixture
def scores() -> torch.Tensor:
    return torch.randn(4, 50, generator=torch.Generator().manual_seed(0)) * 3  # (B, V)


@pytest.fixture
def history() -> torch.Tensor:
    # (B, L) token histories over a small alphabet, so n-grams repeat
    return torch.randint(0, 6, (4, 12), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("k", [1, 5, 49])
def test_top_k_matches_transformers(scores, k):
    expected = hf.TopKLogitsWarper(top_k=k)(None, scores.clone())
    assert torch.equal(sampling.top_k_filter(scores, k), expected)
    assert (sampling.top_k_filter(scores, k) > float("-inf")).sum(-1).eq(k).all()


@pytest.mark.parametrize("p", [0.05, 0.5, 0.9, 1.0])
def test_top_p_matches_transformers(scores, p):
    expected = hf.TopPLogitsWarper(top_p=p)(None, scores.clone())
    assert torch.equal(sampling.top_p_filter(scores, p), expected)


def test_top_p_per_row_filters_each_row_with_its_own_p_as_transformers_does(scores):
    """The server's rows each carry their own top_p (`zoo.serving.sampling.choose`): one call, each row as
    transformers filters it alone (p exact in float32, so both compare against the same threshold)."""
    p = torch.tensor([0.25, 0.5, 0.75, 1.0])
    filtered = sampling.top_p_filter(scores, p)
    for row, value in enumerate(p.tolist()):
        expected = hf.TopPLogitsWarper(top_p=value)(None, scores[row : row + 1].clone())
        assert torch.equal(filtered[row : row + 1], expected), row
    assert not torch.equal(filtered, sampling.top_p_filter(scores, 0.5))


def test_top_p_keeps_the_smallest_set_reaching_p_and_always_the_best_token(scores):
    kept = sampling.top_p_filter(scores, 0.5) > float("-inf")
    probs = scores.softmax(-1)
    for row in range(4):
        mass = probs[row][kept[row]].sum()
        assert mass >= 0.5 and kept[row, scores[row].argmax()]
        smallest_kept = probs[row][kept[row]].min()
        assert mass - smallest_kept < 0.5  # dropping any kept token falls below p
    assert sampling.top_p_filter(scores, 1e-9).gt(float("-inf")).sum(-1).eq(1).all()


@pytest.mark.parametrize("penalty", [0.5, 1.3, 4.0])
def test_repetition_penalty_matches_transformers(scores, history, penalty):
    expected = hf.RepetitionPenaltyLogitsProcessor(penalty)(history, scores.clone())
    seen = sampling.seen_tokens(history, None, scores.shape[-1])
    assert torch.allclose(sampling.repetition_penalty(scores, seen, penalty), expected)


def test_repetition_penalty_lowers_seen_tokens_whatever_their_sign():
    scores = torch.tensor([[2.0, -2.0, 1.0]])
    seen = torch.tensor([[True, True, False]])
    assert sampling.repetition_penalty(scores, seen, 2.0).tolist() == [[1.0, -4.0, 1.0]]


def test_seen_tokens_ignore_padding():
    ids = torch.tensor([[0, 0, 5, 6]])
    seen = sampling.seen_tokens(ids, torch.tensor([[False, False, True, True]]), 8)
    assert seen[0].nonzero().flatten().tolist() == [5, 6]


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_no_repeat_ngram_matches_transformers(scores, history, n):
    expected = hf.NoRepeatNGramLogitsProcessor(n)(history, scores.clone())
    assert torch.equal(sampling.ban_repeated_ngrams(scores, history, None, n), expected)


def test_no_repeat_ngram_ignores_windows_that_touch_padding():
    ids = torch.tensor([[7, 3, 7]])  # "7 3" would ban 3 after the final 7 ...
    scores = torch.zeros(1, 8)
    assert sampling.ban_repeated_ngrams(scores, ids, None, 2)[0, 3] == float("-inf")
    valid = torch.tensor([[False, True, True]])  # ... unless the first 7 is padding
    assert sampling.ban_repeated_ngrams(scores, ids, valid, 2)[0, 3] == 0


def test_block_tokens_makes_them_impossible(scores):
    out = sampling.block_tokens(scores, torch.tensor([3, 7]))
    assert (out[:, [3, 7]] == float("-inf")).all() and torch.equal(out[:, :3], scores[:, :3])


def test_processors_are_skipped_when_disabled():
    assert not sampling.LogitsProcessors(vocab_size=10).active
    assert not sampling.LogitsProcessors(vocab_size=10, temperature=0.5, top_k=3).active  # greedy: no warping
    assert sampling.LogitsProcessors(vocab_size=10, do_sample=True, temperature=0.5).active


def test_sampling_with_a_seed_is_reproducible(tiny, prompts):
    model = tiny("llama-tiny")
    ids, mask = prompts(model.spec.vocab_size, [5, 3])
    kwargs = dict(attention_mask=mask, max_new_tokens=12, do_sample=True, eos_token_id=[])
    first = model.generate(ids, seed=7, **kwargs)
    assert torch.equal(model.generate(ids, seed=7, **kwargs), first)
    assert not torch.equal(model.generate(ids, seed=8, **kwargs), first)
    generator = torch.Generator().manual_seed(7)
    assert torch.equal(model.generate(ids, generator=generator, **kwargs), first)


def test_sampling_does_not_touch_the_global_random_state(tiny):
    model, ids = tiny("gpt2-tiny"), torch.randint(3, 500, (1, 4))
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    model.generate(ids, max_new_tokens=5, do_sample=True, seed=1)
    assert torch.equal(torch.rand(1), before)


def test_top_k_of_one_equals_greedy(any_model, prompts):
    ids, mask = prompts(any_model.spec.vocab_size, [6, 4])
    greedy = any_model.generate(ids, attention_mask=mask, max_new_tokens=10, eos_token_id=[])
    sampled = any_model.generate(
        ids, attention_mask=mask, max_new_tokens=10, eos_token_id=[], do_sample=True, top_k=1, seed=0
    )
    assert torch.equal(sampled, greedy)


def test_low_temperature_sampling_approaches_greedy_and_high_temperature_diverges(tiny):
    model = tiny("llama-tiny")
    ids = torch.randint(3, 500, (4, 5), generator=torch.Generator().manual_seed(2))
    greedy = model.generate(ids, max_new_tokens=10, eos_token_id=[])
    cold = model.generate(ids, max_new_tokens=10, eos_token_id=[], do_sample=True, temperature=1e-4, seed=0)
    hot = model.generate(ids, max_new_tokens=10, eos_token_id=[], do_sample=True, temperature=50.0, seed=0)
    assert torch.equal(cold, greedy)
    assert (hot[:, 5:] != greedy[:, 5:]).float().mean() > 0.5


def test_sampled_tokens_stay_inside_the_top_p_nucleus(tiny):
    model = tiny("llama-tiny")
    ids = torch.randint(3, 500, (8, 5), generator=torch.Generator().manual_seed(2))
    out = model.generate(ids, max_new_tokens=1, do_sample=True, top_p=0.3, seed=0, eos_token_id=[])
    with torch.no_grad():
        logits = model(ids).logits[:, -1]
    allowed = sampling.top_p_filter(logits.float(), 0.3) > float("-inf")
    assert allowed.gather(1, out[:, -1:]).all()


def test_repetition_penalty_reduces_repeats(tiny):
    model = tiny("gpt2-tiny")
    ids = torch.randint(3, 500, (4, 4), generator=torch.Generator().manual_seed(4))
    plain = model.generate(ids, max_new_tokens=24, eos_token_id=[])
    penalized = model.generate(ids, max_new_tokens=24, eos_token_id=[], repetition_penalty=20.0)

    def repeats(seq: torch.Tensor) -> int:
        return sum(len(row) - len(set(row)) for row in seq.tolist())

    assert repeats(penalized) < repeats(plain)


def test_no_repeat_ngram_size_forbids_any_repeated_ngram(tiny):
    model = tiny("gpt2-tiny")
    ids = torch.randint(3, 500, (4, 4), generator=torch.Generator().manual_seed(4))
    plain = model.generate(ids, max_new_tokens=30, eos_token_id=[])
    out = model.generate(ids, max_new_tokens=30, eos_token_id=[], no_repeat_ngram_size=2)

    def repeated_bigrams(seq: torch.Tensor) -> int:
        return sum(
            len(pairs) - len(set(pairs)) for row in seq.tolist() for pairs in [list(itertools.pairwise(row))]
        )

    assert repeated_bigrams(plain) > 0  # the unconstrained model does repeat itself ...
    assert repeated_bigrams(out) == 0  # ... the constrained one never does
