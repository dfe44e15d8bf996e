"""Group Relative Policy Optimization's pieces (Shao et al. 2024, arXiv:2402.03300), as TRL's ``GRPOTrainer``
computes them: group-normalised advantages, and the clipped surrogate with a k3 KL penalty per token.

Shapes: G completions per prompt (the group), R = P x G completions in a batch, N their scored tokens.

    advantage_i   = (r_i - mean(r of i's group)) / (std(r of i's group) + 1e-4)     std: unbiased (torch's)
    ratio_t       = exp(log pi(y_t) - log pi_old(y_t))
    loss_t        = -min(ratio_t A_i, clip(ratio_t, 1 - eps_low, 1 + eps_high) A_i) + beta k3_t
    k3_t          = exp(log pi_ref(y_t) - log pi(y_t)) - (log pi_ref(y_t) - log pi(y_t)) - 1

(Schulman's k3 estimator of KL(pi || pi_ref), unbiased and never negative.) ``scale`` "group" divides by the
group's std as above (TRL's ``scale_rewards`` default, as the paper); "batch" by the std of every reward in
the batch; "none" (Dr. GRPO, arXiv:2503.20783) not at all. How the per-token losses are summed into one
number (TRL's ``loss_type``) is the trainer's business: `zoo.training.tasks.grpo`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

Scale = Literal["group", "batch", "none"]
STD_EPS = 1e-4  # TRL's: a group whose rewards all agree gets advantage 0, not 0 / 0


def group_advantages(rewards: torch.Tensor, group_size: int, *, scale: Scale = "group") -> torch.Tensor:
    """(R,) rewards, ``group_size`` consecutive completions per prompt -> (R,) advantages: each reward less
    its group's mean, divided by the group's (or the batch's) unbiased std + 1e-4 unless ``scale`` is none."""
    grouped = rewards.view(-1, group_size)  # (P, G)
    mean = grouped.mean(dim=1).repeat_interleave(group_size)  # (R,)
    advantages = rewards - mean
    if scale == "group":
        advantages = advantages / (grouped.std(dim=1).repeat_interleave(group_size) + STD_EPS)
    elif scale == "batch":
        advantages = advantages / (rewards.std() + STD_EPS)
    return advantages


@dataclass
class GRPOTerms:
    losses: torch.Tensor  # (N,) each scored token's loss: the clipped surrogate, plus beta x k3
    kl: torch.Tensor | None  # (N,) k3 per token, detached (None: no reference)
    clipped: torch.Tensor  # (N,) bool: the token's ratio lies outside the clip range on its advantage's side


def grpo_token_losses(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    *,
    epsilon_low: float = 0.2,
    epsilon_high: float = 0.2,
    reference_log_probs: torch.Tensor | None = None,
    beta: float = 0.0,
) -> GRPOTerms:
    """Per-token GRPO losses: ``log_probs`` (N,) the policy's (with gradient), ``old_log_probs`` (N,) those
    the completions were sampled under (the same values, detached, when each rollout is trained on once),
    ``advantages`` (N,) each token's completion's, ``reference_log_probs`` (N,) the frozen reference's (read
    when ``beta`` > 0)."""
    ratio = torch.exp(log_probs - old_log_probs)  # (N,)
    bounded = torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high)
    losses = -torch.min(ratio * advantages, bounded * advantages)  # (N,)
    kl = None
    if beta != 0.0:
        assert reference_log_probs is not None, "a KL penalty needs the reference's log-probabilities"
        delta = reference_log_probs - log_probs  # (N,)
        k3 = torch.exp(delta) - delta - 1
        losses = losses + beta * k3
        kl = k3.detach()
    clipped = ((ratio < 1 - epsilon_low) & (advantages < 0)) | ((ratio > 1 + epsilon_high) & (advantages > 0))
    return GRPOTerms(losses=losses, kl=kl, clipped=clipped.detach())
