"""Losses, shared by the models (their ``labels=`` loss) and the trainer: one place for ``IGNORE_INDEX``.

Positions whose label is -100 (padding, unscored MLM positions) count in neither the loss nor the token
count. The models' loss is the mean over real tokens (`token_cross_entropy`, as Hugging Face's); the
trainer's is a sum (`label_smoothed_cross_entropy`) it divides by the token count of the whole optimizer step
(every micro-batch on every process), so gradient accumulation and data parallelism give the gradient of
one big batch.

Label smoothing with ``eps`` (Szegedy et al. 2016; Vaswani et al. 2017, section 5.4) trains against
``(1 - eps) * one_hot(target) + eps / V`` -- uniform over the whole vocabulary, the target included, exactly
as ``torch.nn.functional.cross_entropy(label_smoothing=eps)``:

    loss_i = (1 - eps) * -log p(target_i)  +  eps * mean_v -log p(v)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch.nn import functional as F

IGNORE_INDEX = -100


@dataclass
class LossSums:
    loss: torch.Tensor  # scalar: the objective summed over real target tokens
    nll: torch.Tensor  # scalar: the plain negative log-likelihood summed over the same tokens (no smoothing)
    tokens: torch.Tensor  # scalar int: how many target tokens counted


def label_smoothed_cross_entropy(
    logits: torch.Tensor, targets: torch.Tensor, *, label_smoothing: float = 0.0
) -> LossSums:
    """logits (..., V) and targets (...) aligned position by position, -100 = ignore: (B, T, V) with (B, T), or
    (N, V) with (N,) from a model run with ``logits_mask``."""
    lprobs = F.log_softmax(logits.reshape(-1, logits.shape[-1]).float(), dim=-1)  # (B*T, V), fp32 for range
    targets = targets.reshape(-1)  # (B*T,)
    real = targets != IGNORE_INDEX
    lprobs, targets = lprobs[real], targets[real]  # (N, V), (N,)
    nll = -lprobs.gather(1, targets[:, None]).squeeze(1)  # (N,)
    loss = nll
    if label_smoothing > 0:
        uniform = -lprobs.mean(dim=-1)  # (N,): cross-entropy against the uniform distribution
        loss = (1.0 - label_smoothing) * nll + label_smoothing * uniform
    return LossSums(loss=loss.sum(), nll=nll.sum(), tokens=real.sum())


def token_cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over the positions whose label is not -100: logits (..., V), labels (...).

    Padding is excluded from both the sum and the count (dividing by every position, padding included, a
    common slip, would shrink the loss of short sentences).
    """
    return F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1), ignore_index=IGNORE_INDEX
    )


def select_labels(labels: torch.Tensor, logits_mask: torch.Tensor | None) -> torch.Tensor:
    """labels (B, T) -> (N,) at the positions `select_positions` keeps (or unchanged without a mask)."""
    if logits_mask is None:
        return labels
    return labels[logits_mask.to(labels.device)]


def shift_labels_left(labels: torch.Tensor) -> torch.Tensor:
    """(B, T) -> (B, T): position t is scored against token t + 1; the last position against nothing.

    Shifting the labels rather than slicing ``logits[:, :-1]`` avoids copying the whole (B, T, V) logits.
    """
    return F.pad(labels[:, 1:], (0, 1), value=IGNORE_INDEX)


def load_balancing_loss(
    routers: Sequence[tuple[torch.Tensor, torch.Tensor]], mask: torch.Tensor | None = None
) -> torch.Tensor | None:
    """Switch Transformer's auxiliary load-balancing loss (Fedus et al. 2021, eqs. 4-6), as transformers'
    Mixtral / Qwen-MoE ``load_balancing_loss_func``: ``E * sum_e f_e * P_e``, where ``f_e`` is the share of
    top-k assignments that went to expert ``e`` and ``P_e`` its mean router probability, both averaged over
    the real tokens of every sparse layer together (1 when routing is perfectly balanced, ``top_k`` scaled).

    routers: per sparse layer ``(probs (N, E), experts (N, k))``, tokens in (B, T) order; mask: (B, T)
    1 = real token (padding does not count), or None. None when there is no sparse layer.
    """
    if not routers:
        return None
    probs0 = routers[0][0]
    E, device = probs0.shape[-1], probs0.device
    weight = (
        mask.reshape(-1).to(device=device, dtype=torch.float32)
        if mask is not None
        else torch.ones(probs0.shape[0], device=device)
    )  # (N,)
    counts = torch.zeros(E, device=device)
    prob_sums = torch.zeros(E, device=device)
    for probs, experts in routers:
        k = experts.shape[-1]
        # scatter_add, not bincount: no host sync, and padded rows add 0
        counts = counts + torch.zeros(E, device=device).scatter_add(
            0, experts.reshape(-1), weight.repeat_interleave(k)
        )
        prob_sums = prob_sums + (probs.float() * weight.unsqueeze(-1)).sum(dim=0)
    rows = weight.sum() * len(routers)
    return E * torch.sum((counts / rows) * (prob_sums / rows))
