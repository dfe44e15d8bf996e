"""Training objectives: label-smoothed cross-entropy over real tokens, and BERT's token masking.

Label smoothing with ``eps`` (Szegedy et al. 2016; Vaswani et al. 2017, section 5.4) trains against
``(1 - eps) * one_hot(target) + eps / V`` -- uniform over the whole vocabulary, the target included, exactly
as ``torch.nn.functional.cross_entropy(label_smoothing=eps)``:

    loss_i = (1 - eps) * -log p(target_i)  +  eps * mean_v -log p(v)

Positions whose target is -100 (padding, unmasked MLM positions) contribute to neither the loss nor the
token count. Sums, not means, come back: the loop divides by the token count of the whole optimizer step
(every micro-batch on every process), so gradient accumulation and data parallelism give the gradient of
one big batch.
"""

from __future__ import annotations

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


def mask_tokens(
    input_ids: torch.Tensor,
    *,
    maskable: torch.Tensor,
    mask_token_id: int,
    replacement_ids: torch.Tensor,
    probability: float = 0.15,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """BERT's masking (Devlin et al. 2019, section 3.1): pick ``probability`` of the maskable tokens;
    replace 80% of those with the mask token, 10% with a random token, keep 10% unchanged.

    input_ids (B, T); maskable (B, T) bool, False on special tokens and padding, which are never picked;
    replacement_ids (R,): the ids a random replacement is drawn from (the non-special vocabulary).
    Returns (masked input_ids (B, T), targets (B, T): the original id where picked, else -100).
    """
    draw = torch.rand(input_ids.shape, generator=generator)  # (B, T), one draw decides both choices
    picked = (draw < probability) & maskable.cpu()
    # Within the picked set, draw / probability is uniform on [0, 1): split it 80 / 10 / 10.
    share = draw / probability
    to_mask = picked & (share < 0.8)
    to_random = picked & (share >= 0.8) & (share < 0.9)
    random_ids = replacement_ids[torch.randint(len(replacement_ids), input_ids.shape, generator=generator)]
    ids = input_ids.cpu()
    masked = torch.where(to_mask, torch.full_like(ids, mask_token_id), ids)
    masked = torch.where(to_random, random_ids, masked)
    targets = torch.where(picked, ids, torch.full_like(ids, IGNORE_INDEX))
    return masked.to(input_ids.device), targets.to(input_ids.device)
