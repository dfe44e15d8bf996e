"""LayerNorm and RMSNorm, built from a `NormSpec`.

RMSNorm (Zhang & Sennrich 2019) as in T5 and Llama: no mean subtraction, no bias, and the statistic is
computed in float32 so bfloat16 activations do not lose the small-variance tail.
"""

from __future__ import annotations

import torch
from torch import nn

from zoo.spec import NormSpec


class RMSNorm(nn.Module):
    """y = x / rms(x) * weight, with rms over the last dimension."""

    def __init__(self, dim: int, *, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.rms_norm(x.float(), (x.shape[-1],), eps=self.eps).to(x.dtype) * self.weight


def build_norm(spec: NormSpec, *, dim: int) -> nn.Module:
    """The norm ``spec`` describes, over the last ``dim`` features."""
    if spec.kind == "rmsnorm":
        return RMSNorm(dim, eps=spec.eps)
    return nn.LayerNorm(dim, eps=spec.eps, bias=spec.bias)
