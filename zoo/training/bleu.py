"""Corpus BLEU (Papineni et al., 2002, "BLEU: a Method for Automatic Evaluation of Machine Translation").

The reported metric is ``sacrebleu``'s (Post, 2018, "A Call for Clarity in Reporting BLEU Scores"): its
13a tokenizer, exponential smoothing, one reference per hypothesis. :func:`bleu_signature` gives the
signature that identifies the exact definition, so a score can be compared with others.

A second, built-in definition exists only when asked for by name, ``metric="whitespace"``, for text that
is already tokenized and for checking scores by hand:

    BLEU = 100 * BP * exp(mean_n log p_n),   n = 1..4
    p_n  = sum over sentences of clipped n-gram matches / sum over sentences of hypothesis n-grams
    BP   = 1 if c > r else exp(1 - r / c)    (c, r: total hypothesis / reference length in tokens)

Counts are pooled over the corpus before dividing, as in the paper (not an average of sentence scores).
It differs from sacrebleu's defaults on purpose:

* tokenization is ``str.split()``: the text is assumed already tokenized (sacrebleu applies its ``13a``
  tokenizer, which splits off punctuation);
* no smoothing: any order with zero matches gives 0.0 (sacrebleu's default ``exp`` smoothing does not);
* an order with no hypothesis n-grams at all (every hypothesis shorter than n) is left out of the mean
  instead of zeroing the score (sacrebleu's ``effective_order``), so identical non-empty hypotheses and
  references always score 100.0;
* no hypotheses, or only empty ones, score 0.0.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import Literal

BleuMetric = Literal["sacrebleu", "whitespace"]

MAX_ORDER = 4


def _ngrams(tokens: list[str], n: int) -> Counter[tuple[str, ...]]:
    return Counter(tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1))


def _whitespace_bleu(hypotheses: Sequence[str], references: Sequence[str]) -> float:
    matches = [0] * MAX_ORDER
    totals = [0] * MAX_ORDER
    hyp_len = ref_len = 0
    for hyp, ref in zip(hypotheses, references, strict=True):
        hyp_tokens, ref_tokens = hyp.split(), ref.split()
        hyp_len += len(hyp_tokens)
        ref_len += len(ref_tokens)
        for n in range(1, MAX_ORDER + 1):
            hyp_counts, ref_counts = _ngrams(hyp_tokens, n), _ngrams(ref_tokens, n)
            # Clipping: an n-gram is credited at most as often as it occurs in the reference.
            matches[n - 1] += sum(min(count, ref_counts[gram]) for gram, count in hyp_counts.items())
            totals[n - 1] += sum(hyp_counts.values())
    if hyp_len == 0:
        return 0.0
    orders = [(m, t) for m, t in zip(matches, totals, strict=True) if t > 0]
    if any(m == 0 for m, _ in orders):
        return 0.0
    log_precision = sum(math.log(m / t) for m, t in orders) / len(orders)
    brevity = 1.0 if hyp_len > ref_len else math.exp(1.0 - ref_len / hyp_len)
    return 100.0 * brevity * math.exp(log_precision)


def corpus_bleu(
    hypotheses: Sequence[str], references: Sequence[str], *, metric: BleuMetric = "sacrebleu"
) -> float:
    """Corpus BLEU in [0, 100] of ``hypotheses`` against one reference each.

    ``metric="sacrebleu"`` (the default, and what zoo reports) is ``sacrebleu.corpus_bleu`` with its
    defaults; ``metric="whitespace"`` is the built-in definition in the module docstring.
    """
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references; need one each")
    if not hypotheses:
        return 0.0
    if metric == "sacrebleu":
        import sacrebleu  # a runtime dependency; imported here to keep `import zoo` light

        return float(sacrebleu.corpus_bleu(list(hypotheses), [list(references)]).score)
    if metric == "whitespace":
        return _whitespace_bleu(hypotheses, references)
    raise ValueError(f"unknown BLEU metric {metric!r}; expected 'sacrebleu' or 'whitespace'")


def bleu_signature(metric: BleuMetric = "sacrebleu") -> str:
    """What a reported score means: sacrebleu's signature, or the name of the built-in definition."""
    if metric == "sacrebleu":
        from sacrebleu.metrics import BLEU

        # sacrebleu fills in the reference count on first use; zoo always scores against one reference.
        metric_ = BLEU()
        metric_.corpus_score(["a"], [["a"]])
        return str(metric_.get_signature())
    if metric == "whitespace":
        return "whitespace BLEU (zoo built-in: str.split tokens, no smoothing)"
    raise ValueError(f"unknown BLEU metric {metric!r}; expected 'sacrebleu' or 'whitespace'")
