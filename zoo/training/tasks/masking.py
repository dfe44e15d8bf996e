"""BERT's input masking for masked language modelling (Devlin et al. 2019, section 3.1)."""

from __future__ import annotations

import torch

from zoo.losses import IGNORE_INDEX


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
