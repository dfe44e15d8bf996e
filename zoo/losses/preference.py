"""Preference losses beyond DPO's sigmoid (`zoo.losses.dpo_loss`), per pair, from sequence log-probabilities
(P,) of the chosen (y_w) and rejected (y_l) responses, as TRL computes each (its ``DPOTrainer``'s
``loss_type``, its ``CPOTrainer``'s SimPO and its ``ORPOTrainer``); and KTO's, per unpaired example.

    ipo      Azar et al. 2023 (arXiv:2310.12036, eq. 17)   (h - 1 / (2 beta))^2, h from mean token log-probs
    hinge    Zhao et al. 2023 (SLiC, arXiv:2305.10425)      relu(1 - beta h), h from summed log-probs
    simpo    Meng et al. 2024 (arXiv:2405.14734, eq. 6)     -log sigmoid(beta (a_w - a_l) - gamma), no reference
    orpo     Hong et al. 2024 (arXiv:2403.07691, eq. 6-7)   NLL(y_w) - lambda log sigmoid(log odds(a_w) - log odds(a_l)),
                                                            no reference
    kto      Ethayarajh et al. 2024 (arXiv:2402.01306)      1 - sigmoid(beta (r - z0)) desirable,
                                                            1 - sigmoid(beta (z0 - r)) undesirable

``h`` is DPO's (log pi(y_w) - log pi_ref(y_w)) - (log pi(y_l) - log pi_ref(y_l)); ``a`` a response's mean
token log-probability under the policy (the length-normalised log-probability). The callers pass summed
or mean log-probabilities as each loss reads them (TRL averages them for ipo, simpo and orpo).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.nn import functional as F

from zoo.losses import PreferenceLosses


def ipo_loss(
    policy_chosen: torch.Tensor,
    policy_rejected: torch.Tensor,
    reference_chosen: torch.Tensor,
    reference_rejected: torch.Tensor,
    *,
    beta: float,
) -> PreferenceLosses:
    """IPO's squared loss per pair, ``(h - 1 / (2 beta))^2`` (beta is the paper's tau), from MEAN token
    log-probabilities (P,), as TRL's ``loss_type="ipo"``; its rewards are beta x the mean log-ratios."""
    h = (policy_chosen - policy_rejected) - (reference_chosen - reference_rejected)  # (P,)
    return PreferenceLosses(
        losses=(h - 1 / (2 * beta)) ** 2,
        chosen_rewards=(beta * (policy_chosen - reference_chosen)).detach(),
        rejected_rewards=(beta * (policy_rejected - reference_rejected)).detach(),
    )


def hinge_loss(
    policy_chosen: torch.Tensor,
    policy_rejected: torch.Tensor,
    reference_chosen: torch.Tensor,
    reference_rejected: torch.Tensor,
    *,
    beta: float,
) -> PreferenceLosses:
    """The hinge loss per pair, ``relu(1 - beta h)``, from summed log-probabilities (P,), as TRL's
    ``loss_type="hinge"``."""
    h = (policy_chosen - policy_rejected) - (reference_chosen - reference_rejected)  # (P,)
    return PreferenceLosses(
        losses=F.relu(1 - beta * h),
        chosen_rewards=(beta * (policy_chosen - reference_chosen)).detach(),
        rejected_rewards=(beta * (policy_rejected - reference_rejected)).detach(),
    )


def simpo_loss(
    policy_chosen: torch.Tensor,
    policy_rejected: torch.Tensor,
    *,
    beta: float,
    gamma: float,
    label_smoothing: float = 0.0,
) -> PreferenceLosses:
    """SimPO's loss per pair from MEAN token log-probabilities (P,) under the policy alone (no reference):
    ``-(1 - eps) log sigmoid(beta (a_w - a_l) - gamma) - eps log sigmoid(-(beta (a_w - a_l) - gamma))``,
    as TRL's ``CPOTrainer(loss_type="simpo", cpo_alpha=0)`` (its ``simpo_gamma`` is ``gamma``, the target
    reward margin); rewards are ``beta a``."""
    z = beta * (policy_chosen - policy_rejected) - gamma  # (P,)
    losses = -F.logsigmoid(z) * (1.0 - label_smoothing)
    if label_smoothing > 0:
        losses = losses - F.logsigmoid(-z) * label_smoothing
    return PreferenceLosses(
        losses=losses,
        chosen_rewards=(beta * policy_chosen).detach(),
        rejected_rewards=(beta * policy_rejected).detach(),
    )


@dataclass
class OddsRatioLosses(PreferenceLosses):
    log_odds_ratio: torch.Tensor  # (P,) log sigmoid(log odds(y_w) - log odds(y_l)), detached


def orpo_loss(policy_chosen: torch.Tensor, policy_rejected: torch.Tensor, *, lam: float) -> OddsRatioLosses:
    """ORPO's odds-ratio term per pair, ``-lam log sigmoid(log odds(a_w) - log odds(a_l))`` with
    ``log odds(a) = a - log(1 - exp(a))``, from MEAN token log-probabilities (P,) under the policy alone;
    the caller adds the chosen response's NLL (the paper's L_SFT). As TRL's ``ORPOTrainer`` (``beta`` is
    lam); rewards are ``lam a``."""
    log_odds = (policy_chosen - policy_rejected) - (
        torch.log1p(-torch.exp(policy_chosen)) - torch.log1p(-torch.exp(policy_rejected))
    )  # (P,)
    ratio = F.logsigmoid(log_odds)  # (P,)
    return OddsRatioLosses(
        losses=-lam * ratio,
        chosen_rewards=(lam * policy_chosen).detach(),
        rejected_rewards=(lam * policy_rejected).detach(),
        log_odds_ratio=ratio.detach(),
    )


@dataclass
class KTOLosses:
    losses: torch.Tensor  # (B,) one weighted loss per example
    rewards: torch.Tensor  # (B,) beta * (log pi(y|x) - log pi_ref(y|x)), detached
    kl: torch.Tensor  # scalar: the reference point z0 (detached)


def kto_loss(
    policy: torch.Tensor,
    reference: torch.Tensor,
    desirable: torch.Tensor,
    kl: torch.Tensor,
    *,
    beta: float,
    desirable_weight: float = 1.0,
    undesirable_weight: float = 1.0,
) -> KTOLosses:
    """KTO's loss per example from summed log-probabilities (B,) of each completion under the policy and
    the reference, ``desirable`` (B,) bool, and the reference point ``kl`` (scalar, z0: the clamped mean
    log-ratio of mismatched completions, no gradient), as TRL's ``KTOTrainer`` (``loss_type="kto"``):

        r = log pi(y|x) - log pi_ref(y|x)
        desirable:    w_d (1 - sigmoid(beta (r - z0)))        undesirable:   w_u (1 - sigmoid(beta (z0 - r)))
    """
    kl = kl.detach().clamp(min=0)
    ratio = policy - reference  # (B,)
    losses = torch.where(
        desirable,
        desirable_weight * (1 - torch.sigmoid(beta * (ratio - kl))),
        undesirable_weight * (1 - torch.sigmoid(beta * (kl - ratio))),
    )
    return KTOLosses(losses=losses, rewards=(beta * ratio).detach(), kl=kl)
