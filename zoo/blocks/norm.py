"""LayerNorm and RMSNorm, built from a `NormSpec`.

RMSNorm (Zhang & Sennrich 2019) as in T5 and Llama: no mean subtraction, no bias, and the statistic is
computed in float32 so bfloat16 activations do not lose the small-variance tail. Gemma's variant
(``unit_offset``) scales by (1 + weight), weights starting at zero, and multiplies in float32 before
casting back, as transformers' GemmaRMSNorm does (Llama's casts first).
"""

from __future__ import annotations

import torch
from torch import nn

from zoo.spec import NormSpec


class RMSNorm(nn.Module):
    """y = x / rms(x) * weight (or * (1 + weight) with ``unit_offset``), with rms over the last dimension;
    ``weight=False``: y = x / rms(x), no parameter (Llama 4's q/k L2 norm)."""

    def __init__(self, dim: int, *, eps: float, unit_offset: bool = False, weight: bool = True) -> None:
        super().__init__()
        self.dim, self.eps = dim, eps
        self.unit_offset = unit_offset
        self.weight: nn.Parameter | None = (
            nn.Parameter(torch.zeros(dim) if unit_offset else torch.ones(dim)) if weight else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normed = nn.functional.rms_norm(x.float(), (x.shape[-1],), eps=self.eps)
        if self.weight is None:
            return normed.to(x.dtype)
        if self.unit_offset:
            return (normed * (1.0 + self.weight.float())).to(x.dtype)
        return normed.to(x.dtype) * self.weight

    def reset_parameters(self) -> None:
        """The identity: weights at one, or at zero under ``unit_offset``."""
        if self.weight is not None:
            nn.init.constant_(self.weight, 0.0 if self.unit_offset else 1.0)


def build_norm(spec: NormSpec, *, dim: int) -> nn.Module:
    """The norm ``spec`` describes, over the last ``dim`` features."""
    if spec.kind == "rmsnorm":
        return RMSNorm(dim, eps=spec.eps, unit_offset=spec.unit_offset)
    return nn.LayerNorm(dim, eps=spec.eps, bias=spec.bias)
