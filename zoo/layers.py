"""One Transformer layer: self-attention, optional cross-attention, feed-forward, each a residual branch.

Where the norm sits is the one real difference between the 2017 paper and most later models:

    post-norm (Vaswani et al., BERT, BART):      pre-norm (tensor2tensor, GPT-2, T5, Llama):

        x ──┬──> sublayer ──> dropout ──(+)──> norm ──>        x ──┬──> norm ──> sublayer ──> dropout ──(+)──>
            └──────────────────────────────┘                       └───────────────────────────────────┘

Sandwich norms (Gemma 2/3) put a norm on both sides of each sub-layer, inside the residual branch:

    x ──┬──> norm ──> sublayer ──> post_norm ──> dropout ──(+)──>
        └─────────────────────────────────────────────────┘

Parallel residual (``norm.residual: parallel``; GPT-NeoX, GPT-J, PaLM): every branch reads the layer's
input through its own norm, and their outputs are added to it at once, not one after the other:

        x ──┬──> norm1 ──> self-attention ──> dropout ──(+)──>
            ├──> norm2 ──> feed-forward   ──> dropout ───┤
            └────────────────────────────────────────────┘

(with cross-attention, it is a third branch reading the same x through its own norm).

A decoder layer of an encoder-decoder model has three branches: masked self-attention with the causal
mask, cross-attention over the encoder output with the encoder's padding mask, then the FFN. (Swapping
these two masks is a common slip; `tests/test_layers.py` keeps them straight.) Layers never build masks: the
stack builds them once per forward and hands them down. A Mixture-of-Experts FFN (`zoo.blocks.moe`) also
returns its routing, which the layer passes up for the load-balancing loss.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from zoo.blocks import Attention, MoEFeedForward, RouterOutput, build_ffn, build_norm
from zoo.blocks.dropout import Dropout
from zoo.blocks.flex import BlockMask
from zoo.spec import AttentionSpec, FeedForwardSpec, NormSpec

Branch = Callable[[torch.Tensor], tuple[torch.Tensor, Any]]


@dataclass
class LayerOutput:
    hidden: torch.Tensor  # (B, T, C)
    self_weights: torch.Tensor | None = None  # (B, H, T, T) when output_attentions
    cross_weights: torch.Tensor | None = None  # (B, H, T, S) when output_attentions
    router: RouterOutput | None = None  # a Mixture-of-Experts layer's routing


class Layer(nn.Module):
    """An encoder layer (``cross_attention=None``) or a decoder layer of an encoder-decoder model."""

    def __init__(
        self,
        *,
        attention: AttentionSpec,
        ffn: FeedForwardSpec,
        norm: NormSpec,
        cross_attention: AttentionSpec | None,
        d_model: int,
        dropout: float,
        attention_norm: bool = True,
    ) -> None:
        """``ffn``: this layer's own FFN (the stack picks it per layer from an MoE spec, `zoo.blocks.layer_ffn`).
        ``attention_norm``: false leaves the self-attention input un-normalised (the stack's first layer
        under ``norm.first_attention_norm: false``, ModernBERT)."""
        super().__init__()
        self.pre_norm = norm.placement != "post"
        self.parallel = norm.residual == "parallel"
        sandwich = norm.placement == "sandwich"
        unit_offset = norm.unit_offset
        self.self_attn = Attention(attention, d_model=d_model, qk_unit_offset=unit_offset)
        self.self_attn_norm = build_norm(norm, dim=d_model) if attention_norm else nn.Identity()
        self.self_attn_post_norm = build_norm(norm, dim=d_model) if sandwich else None
        self.cross_attn = (
            Attention(cross_attention, d_model=d_model, cross=True, qk_unit_offset=unit_offset)
            if cross_attention
            else None
        )
        self.cross_attn_norm = build_norm(norm, dim=d_model) if cross_attention else None
        self.cross_attn_post_norm = build_norm(norm, dim=d_model) if cross_attention and sandwich else None
        self.ffn = build_ffn(ffn, d_model=d_model)
        self.ffn_norm = build_norm(norm, dim=d_model)
        self.ffn_post_norm = build_norm(norm, dim=d_model) if sandwich else None
        self.dropout = Dropout(dropout)

    def forward(
        self,
        x: torch.Tensor,
        *,
        self_mask: torch.Tensor | BlockMask | None = None,
        is_causal: bool = False,
        rotary: tuple[torch.Tensor, torch.Tensor] | None = None,
        memory: torch.Tensor | None = None,
        cross_mask: torch.Tensor | BlockMask | None = None,
        cache: Any = None,
        output_attentions: bool = False,
    ) -> LayerOutput:
        """x (B, T, C); memory (B, S, C) is the encoder output for the cross-attention branch."""
        layer_input = x  # what each branch reads under the parallel residual
        self_cache, cross_cache = (cache.self_attn, cache.cross_attn) if cache is not None else (None, None)
        x, self_weights = self._branch(self.self_attn_norm, x, layer_input, lambda h: self.self_attn(
            h, mask=self_mask, is_causal=is_causal, rotary=rotary, cache=self_cache, output_attentions=output_attentions
        ), self.self_attn_post_norm)  # fmt: skip
        cross_weights = None
        if self.cross_attn is not None:
            cross_attn = self.cross_attn  # a local: the lambda keeps its not-None type
            assert self.cross_attn_norm is not None  # built together with cross_attn in __init__
            x, cross_weights = self._branch(self.cross_attn_norm, x, layer_input, lambda h: cross_attn(
                h, memory=memory, mask=cross_mask, cache=cross_cache, output_attentions=output_attentions
            ), self.cross_attn_post_norm)  # fmt: skip
        x, router = self._branch(self.ffn_norm, x, layer_input, self._ffn, self.ffn_post_norm)
        return LayerOutput(x, self_weights, cross_weights, router)

    def _ffn(self, h: torch.Tensor) -> tuple[torch.Tensor, RouterOutput | None]:
        if isinstance(self.ffn, MoEFeedForward):  # fixed at build time: no data-dependent branch
            return self.ffn(h)
        return self.ffn(h), None

    def _branch(
        self,
        norm: nn.Module,
        x: torch.Tensor,
        layer_input: torch.Tensor,
        sublayer: Branch,
        post_norm: nn.Module | None = None,
    ) -> tuple[torch.Tensor, Any]:
        """x plus one residual branch; the branch reads ``layer_input`` under the parallel residual."""
        if self.pre_norm:  # pre-norm, or sandwich with its post_norm
            out, weights = sublayer(norm(layer_input if self.parallel else x))
            if post_norm is not None:
                out = post_norm(out)
            return x + self.dropout(out), weights
        out, weights = sublayer(x)
        return norm(x + self.dropout(out)), weights
