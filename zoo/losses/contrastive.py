"""Contrastive losses for embedding models, as sentence-transformers defines them.

`ranking_losses` is MultipleNegativesRankingLoss (Henderson et al. 2017, arXiv:1705.00652; InfoNCE with
in-batch negatives): anchor ``i`` is scored against every candidate of the batch, its own positive, the
other anchors' positives and every hard negative (the extra columns), and the loss is the cross-entropy
of picking its own positive:

    scores   = scale * sim(anchors (B, C), [positives; negatives_1; ...] (B * (1 + n), C))   # (B, B (1 + n))
    loss_i   = -log softmax(scores_i)[i]

``sim`` is cosine (the default; so the vectors need not be unit length) or the dot product. `matryoshka`
is MatryoshkaLoss (Kusupati et al. 2022, arXiv:2205.13147): the same loss on the first ``d`` channels of
every vector for each ``d`` of a list, weighted and summed, so a vector cut to ``d`` channels still works
(with cosine the cut vectors are renormalised by the similarity itself). Both return per-anchor losses
(B,), whose mean is sentence-transformers' loss.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
from torch.nn import functional as F

Similarity = Literal["cos", "dot"]


def similarity(a: torch.Tensor, b: torch.Tensor, kind: Similarity) -> torch.Tensor:
    """(N, C) and (M, C) -> (N, M): cosine (as sentence-transformers' ``cos_sim``) or dot product."""
    if kind == "cos":
        a, b = F.normalize(a, p=2, dim=1), F.normalize(b, p=2, dim=1)
    return a @ b.T


def ranking_losses(
    anchors: torch.Tensor,
    candidates: Sequence[torch.Tensor],
    *,
    scale: float = 20.0,
    similarity_kind: Similarity = "cos",
) -> torch.Tensor:
    """MultipleNegativesRankingLoss per anchor: anchors (B, C), candidates [positives (B, C), negatives
    (B, C) ...] -> (B,), the cross-entropy of each anchor's own positive among all candidates."""
    if not candidates:
        raise ValueError("ranking_losses needs the positives (and any negatives) as candidates")
    docs = torch.cat(list(candidates), dim=0)  # (B (1 + n), C): positives first, then each negative column
    scores = similarity(anchors.float(), docs.float(), similarity_kind) * scale  # (B, B (1 + n))
    own = torch.arange(anchors.shape[0], device=anchors.device)  # anchor i's positive is candidate i
    return F.cross_entropy(scores, own, reduction="none")  # (B,)


def matryoshka(
    anchors: torch.Tensor,
    candidates: Sequence[torch.Tensor],
    *,
    dims: Sequence[int],
    weights: Sequence[float] | None = None,
    scale: float = 20.0,
    similarity_kind: Similarity = "cos",
) -> torch.Tensor:
    """MatryoshkaLoss over `ranking_losses`: sum over ``dims`` of weight x the loss on the vectors' first
    ``d`` channels -> (B,). ``weights`` default to 1 each."""
    weights = list(weights) if weights is not None else [1.0] * len(dims)
    if len(weights) != len(dims):
        raise ValueError(f"matryoshka: {len(weights)} weights for {len(dims)} dims")
    total = anchors.new_zeros(anchors.shape[0], dtype=torch.float32)  # (B,)
    for d, w in zip(dims, weights):
        cut = [c[:, :d] for c in candidates]
        total = total + w * ranking_losses(anchors[:, :d], cut, scale=scale, similarity_kind=similarity_kind)
    return total
