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

QLoRA (``quantize_base="nf4"``, `zoo.lora.nf4`): ``weight`` holds torchao's NF4Tensor, frozen, dequantised
per matmul. Merging puts a dense ``W + s B A`` in its place (the NF4 weight kept aside, so `unmerge_` puts it
back bit for bit); ``base_sample`` keeps what the adapter fingerprint read from the dense weight.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from zoo.lora import nf4
from zoo.lora.fingerprint import WeightSample


class LoraLinear(nn.Module):
    """A frozen ``nn.Linear`` (its parameters, taken over) plus trainable ``lora_A``, ``lora_B`` [, magnitude].

    ``base`` may be an `Nf4Linear` (an NF4 base): its NF4 weight and fingerprint sample are taken over too.
    """

    def __init__(
        self,
        base: nn.Linear | nf4.Nf4Linear,
        *,
        r: int,
        alpha: float,
        dropout: float = 0.0,
        dora: bool = False,
    ) -> None:
        super().__init__()
        self.in_features, self.out_features = base.in_features, base.out_features
        self.r, self.alpha, self.scaling = r, alpha, alpha / r
        self.weight = base.weight  # (O, I), frozen by `zoo.lora.apply`; an NF4Tensor under QLoRA
        self.base_sample: WeightSample | None = getattr(base, "base_sample", None)  # NF4: the dense weight's
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
                self.lora_magnitude = nn.Parameter(self._row_norm(self.base_weight()))  # (O,)
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.merged = False
        self.disabled = False  # `zoo.lora.disabled`: forward is the base linear's alone
        self._original: torch.Tensor | None = (
            None  # the weight before `merge_`, when kept for an exact unmerge
        )
        self._merge_norm: torch.Tensor | None = None  # DoRA: the row norm the merge divided by

    def extra_repr(self) -> str:
        dora = ", dora" if self.lora_magnitude is not None else ""
        quantized = ", nf4" if self.quantized else ""
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
            f"r={self.r}, alpha={self.alpha:g}{dora}{quantized}, merged={self.merged}"
        )

    @property
    def quantized(self) -> bool:
        """The frozen base is stored NF4 (QLoRA): in ``weight``, or set aside while merged."""
        return nf4.is_nf4(self.weight) or nf4.is_nf4(self._original)

    def base_weight(self) -> torch.Tensor:
        """The frozen weight W (O, I) as a dense tensor (an NF4 one dequantised: a temporary copy)."""
        return nf4.dense(self.weight.detach())

    def delta_weight(self) -> torch.Tensor:
        """s * B @ A, (O, I): what LoRA adds to the weight."""
        return (self.lora_B @ self.lora_A) * self.scaling

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (N, I) -> (N, O)."""
        result = nf4.linear(x, self.weight, self.bias)  # (N, O)
        if self.merged or self.disabled:
            return result
        h = self.dropout(x)  # the adapter's input only
        lora = F.linear(F.linear(h, self.lora_A), self.lora_B) * self.scaling  # (N, r) -> (N, O)
        if self.lora_magnitude is None:
            return result + lora
        # DoRA, as PEFT: the norm of the adapted weight, detached; the base output reused where nothing dropped
        norm = self._row_norm(self.base_weight() + self.delta_weight().detach()).detach()  # (O,)
        scale = self.lora_magnitude / norm  # (O,)
        if isinstance(self.dropout, nn.Identity) or not self.training:
            base = result - self.bias if self.bias is not None else result  # W x, (N, O)
        else:
            base = nf4.linear(h, self.weight, None)
        return result + (scale - 1) * base + scale * lora

    @torch.no_grad()
    def merge_(self, *, keep_original: bool = True) -> None:
        """Fold the adapter into ``weight``: W + s B A (LoRA), m / ||W + s B A||_row * (W + s B A) (DoRA).

        ``keep_original``: keep a copy of W so `unmerge_` restores it bit for bit; without, unmerge subtracts
        (equal to W up to float rounding, about 1 ulp of the largest term per entry). An NF4 base becomes a
        dense ``weight`` in its compute dtype, and the NF4 one is always kept for `unmerge_`.
        """
        if self.merged:
            return
        if nf4.is_nf4(self.weight):
            object.__setattr__(self, "_original", self.weight)  # kept aside, not registered as a parameter
            adapted = self._adapted(self.base_weight())
            self.weight = nf4.frozen(adapted)
            self.merged = True
            return
        self._original = self.weight.detach().clone() if keep_original else None
        self.weight.copy_(self._adapted(self.weight))
        self.merged = True

    def _adapted(self, weight: torch.Tensor) -> torch.Tensor:
        """W + s B A, (O, I) (DoRA: rescaled to the magnitude, the norm divided by kept for unmerge)."""
        adapted = weight + self.delta_weight()  # (O, I)
        if self.lora_magnitude is not None:
            self._merge_norm = self._row_norm(adapted)
            adapted = adapted * (self.lora_magnitude / self._merge_norm)[:, None]
        return adapted

    @torch.no_grad()
    def unmerge_(self) -> None:
        """Take the adapter out of ``weight`` again (exactly when `merge_` kept the original)."""
        if not self.merged:
            return
        if self._original is not None and nf4.is_nf4(self._original):
            self.weight = self._original  # the very NF4 parameter merge_ set aside
        elif self._original is not None:
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
        """A plain ``nn.Linear`` holding this wrapper's ``weight`` and ``bias`` parameters (not copies; an NF4
        weight, unmerged, dequantised to its compute dtype)."""
        linear = nn.Linear(self.in_features, self.out_features, bias=self.bias is not None, device="meta")
        linear.weight = nf4.frozen(self.base_weight()) if nf4.is_nf4(self.weight) else self.weight
        linear.register_parameter("bias", self.bias)
        return linear

    @staticmethod
    def _row_norm(weight: torch.Tensor) -> torch.Tensor:
        """||W||_2 of each output row, (O, I) -> (O,), in W's dtype (as PEFT)."""
        return torch.linalg.norm(weight, dim=1).to(weight.dtype)
