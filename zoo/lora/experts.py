"""`LoraStackedLinear`: LoRA on a Mixture-of-Experts projection, one adapter per expert.

Shapes: E experts, I in features, O out features, r rank, s = alpha / r.

An MoE block keeps each projection of its ``E`` experts as one stacked weight (E, O, I) (`zoo.blocks.moe`),
and dispatches tokens by sorting them per expert and running one matmul per expert over its slice (or, under
torch.compile / torch.export, one batched matmul over gathered weights). The adapter keeps that dispatch as it
is: it stacks too, ``lora_A`` (E, r, I) and ``lora_B`` (E, O, r), and adds its update to the weight the
experts read (``stacked_weight``):

    W'[e] = W[e] + s * B[e] @ A[e]          one batched (E, O, r) @ (E, r, I) matmul per forward

This costs one extra pass over a projection's weights per forward rather than two skinny matmuls per expert
slice: the same order of work as the experts themselves at training batch sizes, and what PEFT does for
parameters it targets directly (``target_parameters``). Each expert learns its own update (an adapter shared by
all experts would tie their fine-tuning together). LoRA dropout (on the adapter's input) and DoRA have no
place in a weight update and are refused for expert targets (`zoo.lora.inject`).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from zoo.blocks.moe import StackedLinear


class LoraStackedLinear(nn.Module):
    """A frozen `StackedLinear` (its ``weight``, taken over) plus trainable ``lora_A`` (E, r, I), ``lora_B`` (E, O, r)."""

    lora_magnitude: None = None  # no DoRA on experts; the same interface as `zoo.lora.layer.LoraLinear`

    def __init__(self, base: StackedLinear, *, r: int, alpha: float) -> None:
        super().__init__()
        self.num, self.in_features, self.out_features = base.num, base.in_features, base.out_features
        self.r, self.alpha, self.scaling = r, alpha, alpha / r
        self.weight = base.weight  # (E, O, I), frozen by `zoo.lora.apply`
        device, dtype = base.weight.device, base.weight.dtype
        E = base.num
        self.lora_A = nn.Parameter(
            torch.empty(E, r, self.in_features, device=device, dtype=dtype)
        )  # (E, r, I)
        self.lora_B = nn.Parameter(
            torch.zeros(E, self.out_features, r, device=device, dtype=dtype)
        )  # (E, O, r)
        for a in self.lora_A:  # each expert's A as a LoraLinear's: Kaiming-uniform(a=sqrt(5)); B = 0
            nn.init.kaiming_uniform_(a, a=math.sqrt(5))
        self.merged = False
        self.disabled = False  # `zoo.lora.disabled`: the experts read the base weights alone
        self._original: torch.Tensor | None = None

    def extra_repr(self) -> str:
        return (
            f"num={self.num}, in_features={self.in_features}, out_features={self.out_features}, r={self.r}, "
            f"alpha={self.alpha:g}, merged={self.merged}"
        )

    def delta_weight(self) -> torch.Tensor:
        """s * B @ A per expert, (E, O, I)."""
        return torch.bmm(self.lora_B, self.lora_A) * self.scaling

    def stacked_weight(self) -> torch.Tensor:
        """(E, O, I): the base weights plus each expert's update (just the weights once merged)."""
        return self.weight if self.merged or self.disabled else self.weight + self.delta_weight()

    @torch.no_grad()
    def merge_(self, *, keep_original: bool = True) -> None:
        """Fold the updates into ``weight`` (a copy kept for an exact `unmerge_` when ``keep_original``)."""
        if self.merged:
            return
        self._original = self.weight.detach().clone() if keep_original else None
        self.weight.add_(self.delta_weight())
        self.merged = True

    @torch.no_grad()
    def unmerge_(self) -> None:
        if not self.merged:
            return
        if self._original is not None:
            self.weight.copy_(self._original)
        else:
            self.weight.sub_(self.delta_weight())
        self._original = None
        self.merged = False

    def to_linear(self) -> StackedLinear:
        """A plain `StackedLinear` holding this wrapper's ``weight`` parameter (not a copy)."""
        stacked = StackedLinear.__new__(StackedLinear)
        nn.Module.__init__(stacked)
        stacked.num, stacked.in_features, stacked.out_features = self.num, self.in_features, self.out_features
        stacked.weight = self.weight
        return stacked
