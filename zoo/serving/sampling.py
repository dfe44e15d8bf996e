"""The next token of every running sequence at once, each with its own settings, penalties and generator.

Shapes: B rows held (the engine's slots), R rows of a step (some of the B), V vocab.

`RowSampling` keeps each slot's settings as (B,) tensors, and the state its penalties read as (B, V)
tensors made the first time a request needs them: the tokens seen (prompt and generated, for the
repetition penalty), the generated tokens' counts (presence and frequency penalties), the logit biases. A
step runs, on all R rows at once, the processors any of its requests enables, in transformers' order where
`zoo.generation.sampling` has them (the same functions ``generate`` uses):

    repetition penalty -> presence / frequency penalties -> logit_bias -> grammar mask (every row, greedy too)
    -> argmax for greedy rows; for sampled rows: / temperature -> top-k -> top-p -> min-p -> draw

A neutral setting (penalty 1 or 0, bias 0, top_k 0, top_p 1, min_p 0) leaves its row unchanged, so rows
with different settings share one call; a step whose requests enable nothing touches no processor.

Sampled rows draw by inverse transform: one uniform number per row from that row's `torch.Generator` (a
short loop over the sampled rows only: the draw must come from each request's own generator, so that a
seeded request samples the same text whatever runs beside it), then one batched ``searchsorted`` over the
rows' cumulative probabilities.

A row held to a grammar (structured output) has its `TokenConstraint`: its mask, filled on the CPU for the
rows that have one (`zoo.generation.constrain`), sets -inf where the grammar forbids a token, and the token
chosen advances it. Rows without one are untouched.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from zoo.generation.constrain import GrammarError, TokenConstraint, constrain
from zoo.generation.sampling import min_p_filter, repetition_penalty, top_k_filter, top_p_filter
from zoo.serving.requests import Completion


class RowSampling:
    """The sampling settings and penalty state of ``rows`` slots over a ``vocab``-sized output."""

    def __init__(self, rows: int, vocab: int, device: torch.device) -> None:
        self.rows, self.vocab, self.device = rows, vocab, device
        self.temperature = torch.ones(rows, device=device)  # (B,)
        self.top_p = torch.ones(rows, device=device)  # (B,)
        self.top_k = torch.zeros(rows, dtype=torch.long, device=device)  # (B,) 0: off
        self.min_p = torch.zeros(rows, device=device)  # (B,)
        self.repetition = torch.ones(rows, device=device)  # (B,)
        self.presence = torch.zeros(rows, device=device)  # (B,)
        self.frequency = torch.zeros(rows, device=device)  # (B,)
        self.seen: torch.Tensor | None = None  # (B, V) bool: prompt and generated tokens
        self.counts: torch.Tensor | None = None  # (B, V) float: generated tokens
        self.bias: torch.Tensor | None = None  # (B, V) float
        self.constraints: list[TokenConstraint | None] = [None] * rows  # each row's grammar, if any
        # The last `choose`'s rows (0..R-1) whose grammar failed, with why: their requests fail alone.
        self.failures: dict[int, str] = {}

    def set(
        self,
        row: int,
        request: Completion,
        constraint: TokenConstraint | None = None,
        *,
        prompt: Sequence[int] | None = None,
    ) -> None:
        """Row ``row`` now samples for ``request``: its settings, and its state started from its prompt;
        ``constraint``: the grammar its tokens must follow (None: free); ``prompt``: the tokens its
        sequence starts from when they are not the request's prompt (an encoder-decoder's decoder start
        token: its source is not part of the output, as in ``generate``)."""
        r = request
        self.constraints[row] = constraint
        for tensor, value in (
            (self.temperature, max(r.temperature, 1e-6)),
            (self.top_p, r.top_p),
            (self.top_k, r.top_k),
            (self.min_p, r.min_p),
            (self.repetition, r.repetition_penalty),
            (self.presence, r.presence_penalty),
            (self.frequency, r.frequency_penalty),
        ):
            tensor[row] = value
        if r.repetition_penalty != 1.0:
            if self.seen is None:
                self.seen = torch.zeros(self.rows, self.vocab, dtype=torch.bool, device=self.device)
            self.seen[row] = False
            seen = torch.tensor(list(r.prompt if prompt is None else prompt), device=self.device)
            self.seen[row, seen[seen < self.vocab]] = True
        if r.presence_penalty or r.frequency_penalty:
            if self.counts is None:
                self.counts = torch.zeros(self.rows, self.vocab, device=self.device)
            self.counts[row] = 0
        if self.bias is not None or r.logit_bias:
            if self.bias is None:
                self.bias = torch.zeros(self.rows, self.vocab, device=self.device)
            self.bias[row] = 0  # another request's biases may be left in the row
            if r.logit_bias:
                ids = torch.tensor(list(r.logit_bias), device=self.device)
                self.bias[row, ids] = torch.tensor(list(r.logit_bias.values()), device=self.device)

    def move(self, src: int, dst: int) -> None:
        """Row ``src``'s settings, penalty state and grammar go to row ``dst`` (its request changed slots)."""
        settings = (self.temperature, self.top_p, self.top_k, self.min_p)
        for tensor in (
            *settings,
            self.repetition,
            self.presence,
            self.frequency,
            self.seen,
            self.counts,
            self.bias,
        ):
            if tensor is not None:
                tensor[dst] = tensor[src]
        self.constraints[dst], self.constraints[src] = self.constraints[src], None

    def choose(
        self,
        logits: torch.Tensor,
        rows: torch.Tensor,
        requests: Sequence[Completion | None],
        generators: Sequence[torch.Generator | None],
    ) -> torch.Tensor:
        """logits (R, V) of ``rows`` (R,), the request of each (None: an idle row) and its generator (None:
        greedy or idle) -> tokens (R,). The tokens are recorded for the penalties (`observe`); a row whose
        grammar failed is in `failures` (its token is meaningless)."""
        self.failures = {}
        scores = self.penalize(logits, rows, requests)  # (R, V)
        tokens = scores.argmax(dim=-1)  # (R,)
        drawing = [(i, g) for i, g in enumerate(generators) if g is not None]
        if drawing:
            picked = torch.tensor([i for i, _ in drawing], device=scores.device)  # (S,)
            warped = self.warp(scores[picked], rows[picked], [requests[i] for i, _ in drawing])  # (S, V)
            cdf = warped.softmax(dim=-1).cumsum(dim=-1)  # (S, V)
            uniform = torch.stack([torch.rand((), generator=g, device=g.device) for _, g in drawing])
            drawn = torch.searchsorted(cdf, (uniform.to(cdf.device) * cdf[:, -1])[:, None]).squeeze(1)
            tokens = tokens.index_put((picked,), drawn.clamp(max=scores.shape[-1] - 1))
        self.observe(rows, tokens, [r for r in requests if r is not None])
        held = self._held(rows, requests)
        if any(c is not None for c in held):
            for i, (constraint, token) in enumerate(zip(held, tokens.tolist())):
                if constraint is not None and i not in self.failures:
                    try:
                        constraint.advance(token)
                    except GrammarError as error:
                        self.failures[i] = str(error)
        return tokens

    def penalize(
        self, logits: torch.Tensor, rows: torch.Tensor, requests: Sequence[Completion | None]
    ) -> torch.Tensor:
        """logits (R, V) of ``rows`` (R,) with the penalties and biases of their requests (None: idle)."""
        live = [r for r in requests if r is not None]
        scores = logits
        if any(r.repetition_penalty != 1.0 for r in live):
            assert self.seen is not None
            scores = repetition_penalty(scores.float(), self.seen[rows], self.repetition[rows, None])
        if any(r.presence_penalty or r.frequency_penalty for r in live):
            assert self.counts is not None
            counts = self.counts[rows]  # (R, V)
            scores = scores - counts * self.frequency[rows, None] - (counts > 0) * self.presence[rows, None]
        if any(r.logit_bias for r in live):
            assert self.bias is not None
            scores = scores + self.bias[rows]
        held = self._held(rows, requests)
        if any(c is not None for c in held):
            scores = constrain(scores, held, self.failures)
        return scores

    def _held(
        self, rows: torch.Tensor, requests: Sequence[Completion | None]
    ) -> list[TokenConstraint | None]:
        """The constraint of each of the R ``rows`` whose request is live (None: free, or idle)."""
        if not any(c is not None for c in self.constraints):
            return [None] * len(requests)
        return [
            self.constraints[row] if request is not None else None
            for row, request in zip(rows.tolist(), requests)
        ]

    def warp(
        self, scores: torch.Tensor, rows: torch.Tensor, requests: Sequence[Completion | None]
    ) -> torch.Tensor:
        """scores (S, V) of sampled ``rows`` (S,) -> their warped scores (S, V), float32: temperature,
        top-k, top-p, min-p."""
        warped = scores.float() / self.temperature[rows, None]  # (S, V)
        if any(r is not None and r.top_k for r in requests):
            warped = top_k_filter(warped, self.top_k[rows])
        if any(r is not None and r.top_p < 1.0 for r in requests):
            warped = top_p_filter(warped, self.top_p[rows])
        if any(r is not None and r.min_p for r in requests):
            warped = min_p_filter(warped, self.min_p[rows])
        return warped

    def observe(self, rows: torch.Tensor, tokens: torch.Tensor, live: Sequence[Completion]) -> None:
        """Record ``tokens`` (R,), just generated in ``rows`` (R,), for the penalties that count them (an idle
        row's token lands in its own row, reset when a request takes it)."""
        if self.seen is not None and any(r.repetition_penalty != 1.0 for r in live):
            self.seen.index_put_((rows, tokens), torch.ones((), dtype=torch.bool, device=self.device))
        if self.counts is not None and any(r.presence_penalty or r.frequency_penalty for r in live):
            self.counts.index_put_((rows, tokens), torch.ones((), device=self.device), accumulate=True)
