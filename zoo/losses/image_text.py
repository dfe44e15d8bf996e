"""Image-text losses of a dual encoder, over a (N, N) batch of scores where pair i (text i, image i) matches.

    contrastive (CLIP, Radford et al. 2021):  mean of cross-entropy over each text's row and each image's row
    sigmoid (SigLIP, Zhai et al. 2023):      -sum_j log sigmoid(z_ij * logit_ij) per text, averaged over texts,
                                             z_ij = 1 on the diagonal and -1 elsewhere

Both as transformers' CLIPModel and SiglipModel compute them with ``return_loss=True``.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F


def contrastive_image_text_loss(logits_per_text: torch.Tensor) -> torch.Tensor:
    """logits_per_text (N, N) -> scalar: (CE over texts + CE over images) / 2, the diagonal the targets."""
    targets = torch.arange(logits_per_text.shape[0], device=logits_per_text.device)  # (N,)
    caption_loss = F.cross_entropy(logits_per_text, targets)
    image_loss = F.cross_entropy(logits_per_text.t(), targets)
    return (caption_loss + image_loss) / 2.0


def sigmoid_image_text_loss(logits_per_text: torch.Tensor) -> torch.Tensor:
    """logits_per_text (N, N), scale and bias applied -> scalar: every pair a binary decision."""
    N = logits_per_text.shape[0]
    signs = 2 * torch.eye(N, device=logits_per_text.device, dtype=logits_per_text.dtype) - 1  # (N, N) +1 / -1
    return -F.logsigmoid(signs * logits_per_text).sum(dim=-1).mean()
