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


def sequence_log_probs(
    logits: torch.Tensor, targets: torch.Tensor, rows: torch.Tensor, num_rows: int
) -> torch.Tensor:
    """Each sequence's log-probability of its scored tokens, summed: logits (N, V) and targets (N,) at the
    scored positions of a batch (a model run with ``logits_mask``), ``rows`` (N,) the row of each -> (num_rows,)
    float32 (float64 for float64 logits). A row with no scored position gets 0."""
    wide = logits.to(torch.promote_types(logits.dtype, torch.float32))  # at least fp32, for range
    token = -F.cross_entropy(wide, targets, reduction="none")  # (N,) log p(target)
    return token.new_zeros(num_rows).index_add(0, rows, token)  # (num_rows,)


@dataclass
class PreferenceLosses:
    losses: torch.Tensor  # (P,) one loss per preference pair
    chosen_rewards: torch.Tensor  # (P,) beta * (log pi(y_w|x) - log pi_ref(y_w|x)), detached
    rejected_rewards: torch.Tensor  # (P,) the same for y_l, detached


def dpo_loss(
    policy_chosen: torch.Tensor,
    policy_rejected: torch.Tensor,
    reference_chosen: torch.Tensor,
    reference_rejected: torch.Tensor,
    *,
    beta: float,
    label_smoothing: float = 0.0,
) -> PreferenceLosses:
    """Direct Preference Optimization's sigmoid loss (Rafailov et al. 2023, arXiv:2305.18290, eq. 7), per pair,
    from sequence log-probabilities (P,) of the chosen (y_w) and rejected (y_l) responses under the policy and
    the reference model:

        h      = (log pi(y_w|x) - log pi_ref(y_w|x)) - (log pi(y_l|x) - log pi_ref(y_l|x))
        loss   = -(1 - eps) log sigmoid(beta h) - eps log sigmoid(-beta h)

    ``label_smoothing`` eps > 0 is conservative DPO (cDPO: each label flipped with probability eps), as TRL's
    ``loss_type="sigmoid"`` computes it; eps = 0 is the paper's loss.
    """
    h = (policy_chosen - policy_rejected) - (reference_chosen - reference_rejected)  # (P,)
    losses = -F.logsigmoid(beta * h) * (1.0 - label_smoothing)
    if label_smoothing > 0:
        losses = losses - F.logsigmoid(-beta * h) * label_smoothing
    return PreferenceLosses(
        losses=losses,
        chosen_rewards=(beta * (policy_chosen - reference_chosen)).detach(),
        rejected_rewards=(beta * (policy_rejected - reference_rejected)).detach(),
    )
