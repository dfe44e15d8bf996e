"""The next token of every running sequence at once, each with its own temperature, top_p and generator.

Shapes: R rows (the busy slots of a step), V vocab.

Greedy rows (temperature 0) take the argmax. Sampled rows are warped together — logits / temperature, then
nucleus filtering with each row's own p — and then draw by inverse transform: one uniform number per row
from that row's `torch.Generator` (a short loop over the sampled rows only: the draw must come from each
request's own generator, so that a seeded request samples the same text whatever runs beside it), then one
batched ``searchsorted`` over the rows' cumulative probabilities.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def nucleus(scores: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Keep, per row, the smallest set of most likely tokens whose probability reaches ``top_p`` (R,);
    the others get -inf (Holtzman et al. 2020; the most likely token always stays)."""
    ordered, order = scores.sort(dim=-1, descending=True)  # (R, V)
    probs = ordered.softmax(dim=-1)
    before = probs.cumsum(dim=-1) - probs  # (R, V) the mass of the more likely tokens
    drop = before >= top_p[:, None]
    return scores.scatter(1, order, ordered.masked_fill(drop, float("-inf")))


def choose(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_p: torch.Tensor,
    generators: Sequence[torch.Generator | None],
) -> torch.Tensor:
    """logits (R, V), temperature (R,) (0 = greedy), top_p (R,), one generator per row -> tokens (R,)."""
    tokens = logits.argmax(dim=-1)  # (R,)
    drawing = [(i, g) for i, g in enumerate(generators) if g is not None]
    sampled = [i for i, _ in drawing]
    if not sampled:
        return tokens
    rows = torch.tensor(sampled, device=logits.device)
    scores = logits[rows].float() / temperature[rows, None]  # (S, V)
    scores = nucleus(scores, top_p[rows])
    cdf = scores.softmax(dim=-1).cumsum(dim=-1)  # (S, V)
    uniform = torch.stack([torch.rand((), generator=g, device=g.device) for _, g in drawing])
    drawn = torch.searchsorted(cdf, (uniform.to(cdf.device) * cdf[:, -1])[:, None]).squeeze(1)
    return tokens.index_put((rows,), drawn.clamp(max=logits.shape[-1] - 1))
