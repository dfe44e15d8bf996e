"""Logits processors and token selection, as pure functions of (B, V) scores; Hugging Face semantics.

The order follows ``transformers``: repetition penalty, no-repeat n-grams, bad words, min-new-tokens,
forced BOS, forced EOS, suppressed tokens (always, and at the first new token), then (when sampling) temperature, top-k, top-p. `LogitsProcessors` composes only
the processors a call enables, so a plain greedy run touches none of them. Removed tokens get -inf, as in
Hugging Face; a forced token gets 0 and every other -inf.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

Scores = torch.Tensor  # (B, V) float


def seen_tokens(ids: torch.Tensor, valid: torch.Tensor | None, vocab_size: int) -> torch.Tensor:
    """(B, V) bool: which tokens occur in ``ids`` (B, T) at positions where ``valid`` (B, T) is true."""
    counts = torch.zeros(ids.shape[0], vocab_size, dtype=torch.int32, device=ids.device)
    ones = torch.ones_like(ids, dtype=torch.int32) if valid is None else valid.to(torch.int32)
    return counts.scatter_add_(1, ids, ones) > 0  # scatter_add: deterministic with repeated ids


def repetition_penalty(scores: Scores, seen: torch.Tensor, penalty: float | torch.Tensor) -> Scores:
    """CTRL's penalty (Keskar et al. 2019) on tokens already in the sequence: a positive score is divided by
    ``penalty``, a negative one multiplied, so a penalty > 1 always makes a repeat less likely. ``penalty``:
    one for every row, or (B, 1) one per row (the server's requests; 1 leaves a row as it is)."""
    penalized = torch.where(scores < 0, scores * penalty, scores / penalty)
    return torch.where(seen, penalized, scores)


def ban_repeated_ngrams(scores: Scores, ids: torch.Tensor, valid: torch.Tensor | None, n: int) -> Scores:
    """Forbid every token that would complete an n-gram already present in ``ids`` (B, L).

    The last n-1 tokens are compared against every earlier (n-1)-token window at once (no Python loop
    over positions); windows that touch padding (``valid`` false) do not count.
    """
    B, L = ids.shape
    if ids.shape[1] < n:
        return scores
    if n == 1:  # every token seen so far is banned
        return scores.masked_fill(seen_tokens(ids, valid, scores.shape[-1]), float("-inf"))
    prefixes = ids.unfold(1, n - 1, 1)[:, : L - n + 1]  # (B, W, n-1), W = L - n + 1 windows
    matches = (prefixes == ids[:, None, L - n + 1 :]).all(-1)  # (B, W): window prefix == last n-1 tokens
    if valid is not None:
        matches &= valid.unfold(1, n, 1).all(-1)
    followers = ids[:, n - 1 :]  # (B, W): the token that completed each window
    banned = torch.zeros(B, scores.shape[-1], dtype=torch.int32, device=ids.device)
    banned.scatter_add_(1, followers, matches.to(torch.int32))
    return scores.masked_fill(banned > 0, float("-inf"))


def block_tokens(scores: Scores, token_ids: torch.Tensor) -> Scores:
    """Make ``token_ids`` (E,) impossible, e.g. end-of-sequence before ``min_new_tokens``."""
    return scores.index_fill(1, token_ids, float("-inf"))


def force_tokens(scores: Scores, token_ids: torch.Tensor) -> Scores:
    """Only ``token_ids`` (E,) stay possible: they score 0, every other token -inf (transformers'
    ForcedBOSTokenLogitsProcessor / ForcedEOSTokenLogitsProcessor)."""
    return torch.full_like(scores, float("-inf")).index_fill_(1, token_ids, 0.0)


class BadWords:
    """transformers' NoBadWordsLogitsProcessor: token sequences that must never be produced.

    A one-token word is banned at every step (one ``index_fill``); a longer word's last token is banned in
    the rows whose sequence ends with the word's other tokens. Words of one length are matched together,
    (B, W) comparisons at once: the loop runs over word lengths, never over rows. A match must lie on real
    tokens (``valid``), not on a prompt's padding. An eos id alone is never banned (as in transformers:
    a row must be able to end).
    """

    def __init__(
        self, words: Sequence[Sequence[int]], *, eos_ids: Sequence[int], device: torch.device
    ) -> None:
        kept = [tuple(word) for word in words if not (len(word) == 1 and word[0] in eos_ids)]
        single = sorted({word[0] for word in kept if len(word) == 1})
        self.single = torch.tensor(single, dtype=torch.long, device=device) if single else None  # (E,)
        by_prefix: dict[int, list[tuple[int, ...]]] = {}
        for word in kept:
            if len(word) > 1:
                by_prefix.setdefault(len(word) - 1, []).append(word)
        self.groups = [  # per prefix length n: prefixes (W, n) and the tokens they ban (W,)
            (
                torch.tensor([word[:-1] for word in group], dtype=torch.long, device=device),
                torch.tensor([word[-1] for word in group], dtype=torch.long, device=device),
            )
            for group in by_prefix.values()
        ]

    def __call__(self, scores: Scores, ids: torch.Tensor, valid: torch.Tensor | None) -> Scores:
        """scores (B, V) for the next token of ``ids`` (B, L), real where ``valid`` (B, L) is true."""
        if self.single is not None:
            scores = scores.index_fill(1, self.single, float("-inf"))
        for prefixes, last in self.groups:
            n = prefixes.shape[1]
            if n > ids.shape[1]:  # longer than the sequence so far: cannot match yet
                continue
            matches = (ids[:, None, -n:] == prefixes).all(dim=-1)  # (B, W)
            if valid is not None:
                matches &= valid[:, -n:].all(dim=-1, keepdim=True)
            banned = torch.zeros(scores.shape, dtype=torch.int32, device=scores.device)  # (B, V)
            banned.index_add_(1, last, matches.to(torch.int32))
            scores = scores.masked_fill(banned > 0, float("-inf"))
        return scores


def top_k_filter(scores: Scores, k: int | torch.Tensor) -> Scores:
    """Keep the k highest scores of each row (ties with the k-th are kept, as in Hugging Face). ``k``: one for
    every row, or (B,) one per row (the server's requests), where 0 keeps the whole row."""
    V = scores.shape[-1]
    if not isinstance(k, torch.Tensor):
        kth = torch.topk(scores, min(k, V), dim=-1).values[:, -1:]  # (B, 1)
        return scores.masked_fill(scores < kth, float("-inf"))
    k = torch.where(k > 0, k.clamp(max=V), V)  # (B,)
    best = torch.topk(scores, int(k.max()), dim=-1).values  # (B, max k), descending
    kth = best.gather(1, (k - 1)[:, None])  # (B, 1)
    return scores.masked_fill(scores < kth, float("-inf"))


def top_p_filter(scores: Scores, p: float | torch.Tensor) -> Scores:
    """Nucleus filtering (Holtzman et al. 2020): keep the smallest set of most likely tokens whose
    probability reaches ``p``; the most likely token always stays. ``p``: one for every row, or (B,) one
    per row (the server's requests, each with its own ``top_p``)."""
    sorted_scores, order = torch.sort(scores, dim=-1)  # ascending
    cumulative = sorted_scores.softmax(dim=-1).cumsum(dim=-1)  # (B, V)
    remove_sorted = cumulative <= (1 - p[:, None] if isinstance(p, torch.Tensor) else 1 - p)
    remove_sorted[:, -1] = False
    remove = remove_sorted.scatter(1, order, remove_sorted)
    return scores.masked_fill(remove, float("-inf"))


def min_p_filter(scores: Scores, min_p: float | torch.Tensor) -> Scores:
    """Min-p filtering (Nguyen et al. 2024; transformers' MinPLogitsWarper): drop the tokens less likely than
    ``min_p`` times the most likely one. ``min_p``: one for every row, or (B,) one per row (0 keeps the row);
    the most likely token always stays (``min_p`` <= 1)."""
    probs = scores.softmax(dim=-1)  # (B, V)
    floor = probs.amax(dim=-1, keepdim=True) * (min_p[:, None] if isinstance(min_p, torch.Tensor) else min_p)
    return scores.masked_fill(probs < floor, float("-inf"))


def sample(scores: Scores, generator: torch.Generator | None) -> torch.Tensor:
    """One token per row (B,) drawn from softmax(scores)."""
    probs = scores.float().softmax(dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(1)


class LogitsProcessors:
    """The processors one generate call enables, composed once; tracks the tokens seen so far per row
    (for the repetition penalty) incrementally instead of rescanning the sequence every step."""

    def __init__(
        self,
        *,
        vocab_size: int,
        repetition_penalty: float = 1.0,
        no_repeat_ngram_size: int = 0,
        bad_words: BadWords | None = None,
        min_new_tokens: int = 0,
        eos_ids: torch.Tensor | None = None,
        forced_bos: torch.Tensor | None = None,
        forced_eos: torch.Tensor | None = None,
        max_new_tokens: int = 0,
        do_sample: bool = False,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        suppress: torch.Tensor | None = None,
        begin_suppress: torch.Tensor | None = None,
    ) -> None:
        """``suppress`` (S,) ids are never produced, ``begin_suppress`` (S',) not as the first new token
        (transformers' SuppressTokens and SuppressTokensAtBegin processors: Whisper's).
        ``forced_bos`` (1,) is forced while the sequence is one token long (an encoder-decoder's start
        token, or a one-token prompt), ``forced_eos`` (E,) at the last of ``max_new_tokens`` steps: both
        exactly when transformers forces them (``cur_len == 1``, ``cur_len == max_length - 1``)."""
        self.vocab_size = vocab_size
        self.penalty = repetition_penalty
        self.ngram = no_repeat_ngram_size
        self.bad_words = bad_words
        self.min_new_tokens = min_new_tokens if eos_ids is not None and eos_ids.numel() else 0
        self.eos_ids = eos_ids
        self.forced_bos, self.forced_eos = forced_bos, forced_eos
        self.last_step = max_new_tokens - 1
        self.seen: torch.Tensor | None = None  # (B, V) bool, only with a repetition penalty
        self.suppress, self.begin_suppress = suppress, begin_suppress
        warpers: list[Callable[[Scores], Scores]] = []
        if do_sample and temperature != 1.0:
            warpers.append(lambda s: s / temperature)
        if do_sample and top_k:
            warpers.append(lambda s: top_k_filter(s, top_k))
        if do_sample and top_p is not None and top_p < 1.0:
            warpers.append(lambda s: top_p_filter(s, top_p))
        self.warpers = warpers

    @property
    def active(self) -> bool:
        """Whether any processor runs (a plain greedy search skips the float32 copy of the logits)."""
        return (
            self.penalty != 1.0
            or self.ngram > 0
            or self.bad_words is not None
            or self.min_new_tokens > 0
            or self.forced_bos is not None
            or self.forced_eos is not None
            or self.suppress is not None
            or self.begin_suppress is not None
            or bool(self.warpers)
        )

    def start(self, ids: torch.Tensor, valid: torch.Tensor | None) -> None:
        """The prompt (B, T) and its padding mask, before the first step."""
        if self.penalty != 1.0:
            self.seen = seen_tokens(ids, valid, self.vocab_size)

    def __call__(self, scores: Scores, ids: torch.Tensor, valid: torch.Tensor | None, num_new: int) -> Scores:
        """scores (B, V) for the next token of ``ids`` (B, L), of which ``num_new`` were generated."""
        if self.seen is not None:
            scores = repetition_penalty(scores, self.seen, self.penalty)
        if self.ngram:
            scores = ban_repeated_ngrams(scores, ids, valid, self.ngram)
        if self.bad_words is not None:
            scores = self.bad_words(scores, ids, valid)
        if num_new < self.min_new_tokens:
            assert self.eos_ids is not None  # min_new_tokens is 0 without eos ids (see __init__)
            scores = block_tokens(scores, self.eos_ids)
        if self.forced_bos is not None and ids.shape[1] == 1:  # shapes are known on the host: no sync
            scores = force_tokens(scores, self.forced_bos)
        if self.forced_eos is not None and num_new == self.last_step:
            scores = force_tokens(scores, self.forced_eos)
        if self.suppress is not None:
            scores = block_tokens(scores, self.suppress)
        if self.begin_suppress is not None and num_new == 0:
            scores = block_tokens(scores, self.begin_suppress)
        for warper in self.warpers:
            scores = warper(scores)
        return scores

    def observe(self, tokens: torch.Tensor) -> None:
        """Record the tokens (B,) just appended."""
        if self.seen is not None:
            self.seen.scatter_(1, tokens[:, None], True)

    def reorder(self, rows: torch.Tensor) -> None:
        """Beam search: row i now continues old row ``rows[i]``."""
        if self.seen is not None:
            self.seen = self.seen.index_select(0, rows)


def check_finite(scores: torch.Tensor, step: int) -> None:
    """Stop on NaN / +inf logits, which argmax would turn into token 0 silently and sampling into a device
    assert. -inf is fine (a banned token). One small reduction; the loop syncs once a step anyway."""
    if not bool((scores < math.inf).all()):
        raise ValueError(
            f"generate: the model produced NaN/inf logits at step {step + 1} "
            "(NaN/inf weights, or a float16 overflow: try float32)"
        )
