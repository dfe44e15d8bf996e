"""`LoraLinear`: a frozen linear projection plus a low-rank adapter (LoRA), optionally weight-decomposed (DoRA).

Shapes: N any leading dims, I in features, O out features, r rank, s = alpha / r.

    LoRA (Hu et al. 2021, arXiv:2106.09685):

        y = W x + b + s * B (A dropout(x))          A (r, I) Kaiming-uniform, B (O, r) zero: y starts as W x + b

    DoRA (Liu et al. 2024, arXiv:2402.09353), as PEFT computes it (peft/tuners/lora/dora.py):

        n = ||W + s B A||_row, detached (section 4.3: no gradient through the norm)      (O,)
        y = W x + b + (m / n - 1) * W x' + (m / n) * s * B (A x')                        x' = dropout(x)
          = m / n * (W + s B A) x + b                                                    when x' = x

      with the magnitude m (O,) initialised to ||W||_row, so y also starts as W x + b.

The wrapper takes over the base `nn.Linear`'s own ``weight`` and ``bias`` parameters (the same tensors, so
their state-dict names stay ``...qkv_proj.weight``) and adds ``lora_A``, ``lora_B`` (and ``lora_magnitude``).
One adapter per projection: a fused qkv projection gets one A (r, C) and one B ((H + 2K) D, r), one matmul
pair for all three. ``merged``: the adapter is folded into ``weight`` (`merge_`) and forward is the plain
linear; `unmerge_` takes it out again.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F


class LoraLinear(nn.Module):
    """A frozen ``nn.Linear`` (its parameters, taken over) plus trainable ``lora_A``, ``lora_B`` [, magnitude]."""

    def __init__(
        self, base: nn.Linear, *, r: int, alpha: float, dropout: float = 0.0, dora: bool = False
    ) -> None:
        super().__init__()
        self.in_features, self.out_features = base.in_features, base.out_features
        self.r, self.alpha, self.scaling = r, alpha, alpha / r
        self.weight = base.weight  # (O, I), frozen by `zoo.lora.apply`
        self.bias: nn.Parameter | None
        self.register_parameter("bias", base.bias)  # (O,) or None
        device, dtype = base.weight.device, base.weight.dtype
        self.lora_A = nn.Parameter(torch.empty(r, self.in_features, device=device, dtype=dtype))  # (r, I)
        self.lora_B = nn.Parameter(torch.zeros(self.out_features, r, device=device, dtype=dtype))  # (O, r)
        # As in the LoRA reference code and PEFT: A ~ Kaiming-uniform(a=sqrt(5)), B = 0.
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
        self.lora_magnitude: nn.Parameter | None = None
        if dora:
            with torch.no_grad():
                self.lora_magnitude = nn.Parameter(self._row_norm(self.weight))  # (O,)
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.merged = False
        self.disabled = False  # `zoo.lora.disabled`: forward is the base linear's alone
        self._original: torch.Tensor | None = (
            None  # the weight before `merge_`, when kept for an exact unmerge
        )
        self._merge_norm: torch.Tensor | None = None  # DoRA: the row norm the merge divided by

    def extra_repr(self) -> str:
        dora = ", dora" if self.lora_magnitude is not None else ""
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
            f"r={self.r}, alpha={self.alpha:g}{dora}, merged={self.merged}"
        )

    def delta_weight(self) -> torch.Tensor:
        """s * B @ A, (O, I): what LoRA adds to the weight."""
        return (self.lora_B @ self.lora_A) * self.scaling

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (N, I) -> (N, O)."""
        result = F.linear(x, self.weight, self.bias)  # (N, O)
        if self.merged or self.disabled:
            return result
        h = self.dropout(x)  # the adapter's input only
        lora = F.linear(F.linear(h, self.lora_A), self.lora_B) * self.scaling  # (N, r) -> (N, O)
        if self.lora_magnitude is None:
            return result + lora
        # DoRA, as PEFT: the norm of the adapted weight, detached; the base output reused where nothing dropped
        norm = self._row_norm(self.weight + self.delta_weight().detach()).detach()  # (O,)
        scale = self.lora_magnitude / norm  # (O,)
        if isinstance(self.dropout, nn.Identity) or not self.training:
            base = result - self.bias if self.bias is not None else result  # W x, (N, O)
        else:
            base = F.linear(h, self.weight)
        return result + (scale - 1) * base + scale * lora

    @torch.no_grad()
    def merge_(self, *, keep_original: bool = True) -> None:
        """Fold the adapter into ``weight``: W + s B A (LoRA), m / ||W + s B A||_row * (W + s B A) (DoRA).

        ``keep_original``: keep a copy of W so `unmerge_` restores it bit for bit; without, unmerge subtracts
        (equal to W up to float rounding, about 1 ulp of the largest term per entry).
        """
        if self.merged:
            return
        self._original = self.weight.detach().clone() if keep_original else None
        adapted = self.weight + self.delta_weight()  # (O, I)
        if self.lora_magnitude is not None:
            self._merge_norm = self._row_norm(adapted)
            adapted = adapted * (self.lora_magnitude / self._merge_norm)[:, None]
        self.weight.copy_(adapted)
        self.merged = True

    @torch.no_grad()
    def unmerge_(self) -> None:
        """Take the adapter out of ``weight`` again (exactly when `merge_` kept the original)."""
        if not self.merged:
            return
        if self._original is not None:
            self.weight.copy_(self._original)
        else:
            weight = self.weight.detach()
            if self.lora_magnitude is not None:
                assert self._merge_norm is not None  # set by merge_
                weight = weight / (self.lora_magnitude / self._merge_norm)[:, None]
            self.weight.copy_(weight - self.delta_weight())
        self._original = self._merge_norm = None
        self.merged = False

    def to_linear(self) -> nn.Linear:
        """A plain ``nn.Linear`` holding this wrapper's ``weight`` and ``bias`` parameters (not copies)."""
        linear = nn.Linear(self.in_features, self.out_features, bias=self.bias is not None, device="meta")
        linear.weight = self.weight
        linear.register_parameter("bias", self.bias)
        return linear

    @staticmethod
    def _row_norm(weight: torch.Tensor) -> torch.Tensor:
        """||W||_2 of each output row, (O, I) -> (O,), in W's dtype (as PEFT)."""
        return torch.linalg.norm(weight, dim=1).to(weight.dtype)
