"""The next token of every running sequence at once, each with its own temperature, top_p and generator.

Shapes: R rows (the busy slots of a step), V vocab.

Greedy rows (temperature 0) take the argmax. Sampled rows are warped together — logits / temperature, then
nucleus filtering with each row's own p (`zoo.generation.sampling.top_p_filter`, the one ``generate`` uses,
as in transformers) — and then draw by inverse transform: one uniform number per row
from that row's `torch.Generator` (a short loop over the sampled rows only: the draw must come from each
request's own generator, so that a seeded request samples the same text whatever runs beside it), then one
batched ``searchsorted`` over the rows' cumulative probabilities.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from zoo.generation.sampling import top_p_filter


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
    scores = top_p_filter(scores, top_p[rows])
    cdf = scores.softmax(dim=-1).cumsum(dim=-1)  # (S, V)
    uniform = torch.stack([torch.rand((), generator=g, device=g.device) for _, g in drawing])
    drawn = torch.searchsorted(cdf, (uniform.to(cdf.device) * cdf[:, -1])[:, None]).squeeze(1)
    return tokens.index_put((rows,), drawn.clamp(max=logits.shape[-1] - 1))
