"""BLEU: the built-in whitespace definition against hand-computed values; the default is sacrebleu's."""

from __future__ import annotations

import math

import pytest
import sacrebleu

from zoo.training.bleu import bleu_signature, corpus_bleu


def bleu(hyps: list[str], refs: list[str]) -> float:
    return corpus_bleu(hyps, refs, metric="whitespace")


def test_identical_hypotheses_score_100() -> None:
    refs = ["고양이가 생선을 먹는다", "the big dog chased three cats in the park", "a b"]
    assert bleu(refs, refs) == 100.0


def test_one_wrong_final_word() -> None:
    # p1 = 5/6, p2 = 4/5, p3 = 3/4, p4 = 2/3, equal lengths so BP = 1:
    # BLEU = 100 * (5/6 * 4/5 * 3/4 * 2/3) ** (1/4) = 100 * (1/3) ** (1/4)
    score = bleu(["the cat eats the big dog"], ["the cat eats the big fish"])
    assert score == pytest.approx(100 * 3**-0.25)  # 75.98


def test_counts_are_clipped_and_pooled_over_the_corpus() -> None:
    # Sentence 1 ("a a a a" vs "a b c d"): "a" is credited once; no 2-, 3-, 4-gram matches.
    # Sentence 2 (identical, 4 tokens): 4/4, 3/3, 2/2, 1/1.
    # Pooled: p1 = (1 + 4) / 8, p2 = 3/6, p3 = 2/4, p4 = 1/2; c = r = 8, so BP = 1.
    score = bleu(["a a a a", "w x y z"], ["a b c d", "w x y z"])
    assert score == pytest.approx(100 * (5 / 8 * 1 / 2 * 1 / 2 * 1 / 2) ** 0.25)


def test_brevity_penalty_for_short_hypotheses() -> None:
    # Every n-gram of the hypothesis matches (p_n = 1), but c = 4 < r = 6: BP = exp(1 - 6/4).
    score = bleu(["the cat eats the"], ["the cat eats the big fish"])
    assert score == pytest.approx(100 * math.exp(-0.5))  # 60.65


def test_longer_hypotheses_are_not_penalised_by_length() -> None:
    # p1 = 4/5, p2 = 3/4, p3 = 2/3, p4 = 1/2 and BP = 1 since c = 5 > r = 4.
    score = bleu(["a b c d e"], ["a b c d"])
    assert score == pytest.approx(100 * (4 / 5 * 3 / 4 * 2 / 3 * 1 / 2) ** 0.25)


def test_no_smoothing_a_missing_order_gives_zero() -> None:
    assert bleu(["a b x c d y"], ["a b c d e f"]) == 0.0  # no matching trigram


def test_orders_longer_than_every_hypothesis_are_left_out() -> None:
    # Two-token hypotheses have no 3- or 4-grams: the mean runs over p1 = 3/4 and p2 = 1/2 only; BP = 1.
    assert bleu(["a b", "c d"], ["a b", "c e"]) == pytest.approx(100 * (3 / 4 * 1 / 2) ** 0.5)


def test_empty_input_scores_zero() -> None:
    assert bleu([], []) == 0.0
    assert bleu([""], ["a b c"]) == 0.0
    assert corpus_bleu([], []) == 0.0


def test_length_mismatch_is_an_error() -> None:
    with pytest.raises(ValueError, match="2 hypotheses but 1 references"):
        bleu(["a", "b"], ["a"])


def test_the_default_is_sacrebleu_with_its_signature() -> None:
    hyps = ["the cat eats the big dog.", "a b"]
    refs = ["the cat eats the big fish.", "a c"]
    expected = sacrebleu.corpus_bleu(hyps, [refs]).score
    assert corpus_bleu(hyps, refs) == pytest.approx(expected)
    # Smoothing and 13a tokenization make it differ from the built-in definition on the same text.
    assert corpus_bleu(hyps, refs) != pytest.approx(bleu(hyps, refs))
    signature = bleu_signature()
    assert signature.startswith("nrefs:1|") and "tok:13a" in signature and "smooth:exp" in signature
    assert "whitespace" in bleu_signature("whitespace")


def test_unknown_metric_is_an_error() -> None:
    with pytest.raises(ValueError, match="unknown BLEU metric 'chrf'"):
        corpus_bleu(["a"], ["a"], metric="chrf")  # type: ignore[arg-type]
