"""Position-wise feed-forward network, plain or gated, built from an `FFNSpec`.

    plain:  down(dropout(act(up(x))))                  Vaswani et al. 2017, BERT, GPT-2
    gated:  down(dropout(act(gate(x)) * up(x)))        Shazeer 2020: SwiGLU (silu), GeGLU (gelu)

The gated variant keeps gate and up in one fused ``up_proj`` of width 2 * d_ff (gate rows first), so
one matmul feeds both halves.
"""

from __future__ import annotations

import torch
from torch import nn

from zoo.blocks.dropout import Dropout
from zoo.spec import FFNSpec


class QuickGELU(nn.Module):
    """CLIP's sigmoid approximation of GELU, x * sigmoid(1.702 x) (Hendrycks & Gimpel 2016, 2.): what the
    CLIP checkpoints were trained with, so not interchangeable with the exact GELU."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(1.702 * x)


ACTIVATIONS: dict[str, nn.Module] = {
    "relu": nn.ReLU(),
    "gelu": nn.GELU(),
    "gelu_tanh": nn.GELU(approximate="tanh"),
    "silu": nn.SiLU(),
    "quick_gelu": QuickGELU(),
}


class FeedForward(nn.Module):
    """Shapes: x (B, T, C) -> (B, T, C); the hidden width is ``spec.d_ff``."""

    def __init__(self, spec: FFNSpec, *, d_model: int) -> None:
        super().__init__()
        self.gated = spec.gated
        self.d_ff = spec.d_ff
        self.up_proj = nn.Linear(d_model, spec.d_ff * (2 if spec.gated else 1), bias=spec.bias)
        self.down_proj = nn.Linear(spec.d_ff, d_model, bias=spec.bias)
        self.act = ACTIVATIONS[spec.activation]
        self.dropout = Dropout(spec.dropout)

    @torch.no_grad()
    def init_weights(self, *, residual_std: float | None = None) -> None:
        """This block's part of `zoo.models.init.initialize`: with ``residual_std``, redraw ``down_proj``,
        which writes into the residual stream, from N(0, residual_std) (GPT-2's scaled residual)."""
        if residual_std is not None:
            self.down_proj.weight.normal_(0.0, residual_std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.up_proj(x)  # (B, T, F) or (B, T, 2F)
        if self.gated:
            gate, up = h.split(self.d_ff, dim=-1)  # (B, T, F) each
            h = self.act(gate) * up
        else:
            h = self.act(h)
        return self.down_proj(self.dropout(h))
