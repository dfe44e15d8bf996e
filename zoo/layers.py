"""One Transformer layer: self-attention, optional cross-attention, feed-forward, each a residual branch.

Where the norm sits is the one real difference between the 2017 paper and most later models:

    post-norm (Vaswani et al., BERT, BART):      pre-norm (tensor2tensor, GPT-2, T5, Llama):

        x ──┬──> sublayer ──> dropout ──(+)──> norm ──>        x ──┬──> norm ──> sublayer ──> dropout ──(+)──>
            └──────────────────────────────┘                       └───────────────────────────────────┘

Sandwich norms (Gemma 2/3) put a norm on both sides of each sub-layer, inside the residual branch:

    x ──┬──> norm ──> sublayer ──> post_norm ──> dropout ──(+)──>
        └─────────────────────────────────────────────────┘

Post-sublayer norms (``norm.placement: post_sublayer``, OLMo 2) keep only the sandwich's second norm:

    x ──┬──> sublayer ──> post_norm ──> dropout ──(+)──>
        └───────────────────────────────────────┘

Parallel residual (``norm.residual: parallel``; GPT-NeoX, PaLM): every branch reads the layer's input
through its own norm, and their outputs are added to it at once, not one after the other:

        x ──┬──> norm1 ──> self-attention ──> dropout ──(+)──>
            ├──> norm2 ──> feed-forward   ──> dropout ───┤
            └────────────────────────────────────────────┘

(with cross-attention, it is a third branch reading the same x through its own norm). With
``parallel_shared`` (GPT-J, Cohere) one norm, ``self_attn_norm``, feeds every branch: x + attn(n) + ffn(n),
n = norm(x).

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

from zoo.blocks import Attention, MoEFeedForward, RouterOutput, build_attention, build_ffn, build_norm
from zoo.blocks.dropout import Dropout
from zoo.blocks.flex import BlockMask
from zoo.blocks.segments import SegmentPlan
from zoo.spec import AttentionSpec, FeedForwardSpec, NormSpec

Branch = Callable[[torch.Tensor], tuple[torch.Tensor, Any]]
Norm = Callable[[torch.Tensor], torch.Tensor]


def _identity(x: torch.Tensor) -> torch.Tensor:
    """A branch without a norm of its own on its input."""
    return x


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
        self.pre_norm = norm.placement != "post"  # the residual is added last (pre, sandwich, post_sublayer)
        self.input_norm = norm.placement != "post_sublayer"  # a norm on each branch's input (or, post: sum)
        self.parallel = norm.parallel
        self.shared_norm = norm.residual == "parallel_shared"  # self_attn_norm feeds every branch
        after = norm.placement in ("sandwich", "post_sublayer")  # a norm on each branch's output
        own = self.input_norm and not self.shared_norm  # a branch past the first has its own input norm
        unit_offset = norm.unit_offset
        self.self_attn = build_attention(attention, d_model=d_model, qk_unit_offset=unit_offset)
        self.self_attn_norm = (
            build_norm(norm, dim=d_model) if attention_norm and self.input_norm else nn.Identity()
        )
        self.self_attn_post_norm = build_norm(norm, dim=d_model) if after else None
        self.cross_attn = (
            Attention(cross_attention, d_model=d_model, cross=True, qk_unit_offset=unit_offset)
            if cross_attention
            else None
        )
        self.cross_attn_norm = build_norm(norm, dim=d_model) if cross_attention and own else None
        self.cross_attn_post_norm = build_norm(norm, dim=d_model) if cross_attention and after else None
        self.ffn = build_ffn(ffn, d_model=d_model)
        self.ffn_norm = build_norm(norm, dim=d_model) if own else None
        self.ffn_post_norm = build_norm(norm, dim=d_model) if after else None
        self.dropout = Dropout(dropout)

    def forward(
        self,
        x: torch.Tensor,
        *,
        self_mask: torch.Tensor | BlockMask | SegmentPlan | None = None,
        is_causal: bool = False,
        rotary: tuple[torch.Tensor, torch.Tensor] | None = None,
        memory: torch.Tensor | None = None,
        cross_mask: torch.Tensor | BlockMask | SegmentPlan | None = None,
        cache: Any = None,
        output_attentions: bool = False,
        slots: torch.Tensor | None = None,
    ) -> LayerOutput:
        """x (B, T, C); memory (B, S, C) is the encoder output for the cross-attention branch; ``slots`` (T,) or
        (B, T) each query's slot in its row, for attention temperature tuning (`AttentionSpec.temperature_tuning`)."""
        tuned = {} if slots is None else {"slots": slots}
        # what each branch reads under the parallel residual: x, or its one shared norm's output
        layer_input = self.self_attn_norm(x) if self.shared_norm else x
        self_norm = _identity if self.shared_norm else self.self_attn_norm
        self_cache, cross_cache = (cache.self_attn, cache.cross_attn) if cache is not None else (None, None)
        x, self_weights = self._branch(self_norm, x, layer_input, lambda h: self.self_attn(
            h, mask=self_mask, is_causal=is_causal, rotary=rotary, cache=self_cache, output_attentions=output_attentions,
            **tuned,
        ), self.self_attn_post_norm)  # fmt: skip
        cross_weights = None
        if self.cross_attn is not None:
            cross_attn = self.cross_attn  # a local: the lambda keeps its not-None type
            cross_norm = self.cross_attn_norm if self.cross_attn_norm is not None else _identity
            x, cross_weights = self._branch(cross_norm, x, layer_input, lambda h: cross_attn(
                h, memory=memory, mask=cross_mask, cache=cross_cache, output_attentions=output_attentions
            ), self.cross_attn_post_norm)  # fmt: skip
        ffn_norm = self.ffn_norm if self.ffn_norm is not None else _identity
        x, router = self._branch(ffn_norm, x, layer_input, self._ffn, self.ffn_post_norm)
        return LayerOutput(x, self_weights, cross_weights, router)

    def _ffn(self, h: torch.Tensor) -> tuple[torch.Tensor, RouterOutput | None]:
        if isinstance(self.ffn, MoEFeedForward):  # fixed at build time: no data-dependent branch
            return self.ffn(h)
        return self.ffn(h), None

    def _branch(
        self,
        norm: Norm,
        x: torch.Tensor,
        layer_input: torch.Tensor,
        sublayer: Branch,
        post_norm: nn.Module | None = None,
    ) -> tuple[torch.Tensor, Any]:
        """x plus one residual branch; the branch reads ``layer_input`` under the parallel residual."""
        if self.pre_norm:  # pre-norm, sandwich or post_sublayer: the sum comes last
            out, weights = sublayer(norm(layer_input if self.parallel else x))
            if post_norm is not None:
                out = post_norm(out)
            return x + self.dropout(out), weights
        out, weights = sublayer(x)
        return norm(x + self.dropout(out)), weights
