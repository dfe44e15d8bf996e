"""Token vectors -> one vector a text, as sentence-transformers' ``Pooling`` module computes it.

    mean                  sum of the real tokens' vectors / their count
    mean_sqrt_len_tokens  sum / sqrt(count)                       (Reimers & Gurevych 2019, §3)
    weightedmean          sum of position-weighted vectors (1, 2, ..., T) / sum of the weights
    max                   the largest value of each channel over the real tokens
    cls                   the first real token (BERT's [CLS])
    lasttoken             the last real token (a decoder's summary of the whole text)

Several modes concatenate their vectors, in the order given. Shapes: ``B`` texts, ``T`` positions, ``C``
channels; the mask is (B, T), 1 = a real token, with padding on either side.
"""

from __future__ import annotations

import torch

from zoo.embeddings.folder import PoolingMode


def pool(
    hidden: torch.Tensor, mask: torch.Tensor, modes: tuple[PoolingMode, ...] | tuple[str, ...]
) -> torch.Tensor:
    """(B, T, C) token vectors, (B, T) mask -> (B, len(modes) * C) text vectors."""
    return torch.cat([_pool_one(hidden, mask, mode) for mode in modes], dim=-1)


def _pool_one(hidden: torch.Tensor, mask: torch.Tensor, mode: str) -> torch.Tensor:
    B, T = hidden.shape[:2]
    keep = mask.to(hidden.dtype).unsqueeze(-1)  # (B, T, 1)
    if mode in ("mean", "mean_sqrt_len_tokens"):
        total = (hidden * keep).sum(dim=1)  # (B, C)
        count = keep.sum(dim=1).clamp(min=1e-9)  # (B, 1); an empty row gives zeros, not NaN
        return total / (count if mode == "mean" else count.sqrt())
    if mode == "weightedmean":
        weights = keep * torch.arange(1, T + 1, device=hidden.device, dtype=hidden.dtype).view(1, T, 1)
        return (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)  # (B, C)
    if mode == "max":
        return hidden.masked_fill(keep == 0, float("-inf")).max(dim=1).values  # (B, C)
    if mode == "cls":
        first = mask.to(torch.int32).argmax(dim=1)  # (B,) the first real position, either padding side
        return hidden[torch.arange(B, device=hidden.device), first]  # (B, C)
    if mode == "lasttoken":
        seen, from_end = mask.flip(1).max(dim=1)  # (B,) the last real position, counted from the end
        last = torch.where(seen == 0, T - 1, T - 1 - from_end)  # (B,); an empty row: its last position
        rows = torch.arange(B, device=hidden.device)
        # Times the mask, as sentence-transformers does: an empty row's vector is zeros.
        return hidden[rows, last] * keep[rows, last]  # (B, C)
    raise ValueError(f"unknown pooling mode {mode!r}")
