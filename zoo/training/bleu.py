"""Corpus BLEU (Papineni et al., 2002, "BLEU: a Method for Automatic Evaluation of Machine Translation").

    BLEU = 100 * BP * exp(mean_n log p_n),   n = 1..4
    p_n  = sum over sentences of clipped n-gram matches / sum over sentences of hypothesis n-grams
    BP   = 1 if c > r else exp(1 - r / c)    (c, r: total hypothesis / reference length in tokens)

Counts are pooled over the corpus before dividing, as in the paper (not an average of sentence scores).
One reference per hypothesis.

The built-in version deliberately differs from ``sacrebleu``'s defaults, which :func:`corpus_bleu` uses
instead when it is installed (``prefer_sacrebleu=True``):

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

MAX_ORDER = 4


def _ngrams(tokens: list[str], n: int) -> Counter[tuple[str, ...]]:
    return Counter(tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1))


def _builtin_bleu(hypotheses: Sequence[str], references: Sequence[str]) -> float:
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
    hypotheses: Sequence[str], references: Sequence[str], *, prefer_sacrebleu: bool = True
) -> float:
    """Corpus BLEU in [0, 100] of ``hypotheses`` against one reference each.

    Uses ``sacrebleu.corpus_bleu(hypotheses, [references]).score`` when ``prefer_sacrebleu`` and sacrebleu
    is installed, otherwise the built-in implementation described in the module docstring.
    """
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references; need one each")
    if not hypotheses:
        return 0.0
    if prefer_sacrebleu:
        try:
            import sacrebleu  # optional dependency
        except ImportError:
            pass
        else:
            return float(sacrebleu.corpus_bleu(list(hypotheses), [list(references)]).score)
    return _builtin_bleu(hypotheses, references)
