"""The pooling heads of a dual encoder (`zoo.spec.dual`): one vector per image and per text.

Shapes: B batch, P image tokens (patches, [+ class token]), T text tokens, C a tower's width.

    first_token     hidden[:, 0]                                       CLIP's class token
    attention       probe ──cross-attn over the P tokens──> h;  h + mlp(norm(h))     SigLIP's MAP head
    eos_token       hidden[b, first t with input_ids[b, t] == eos]    CLIP
    max_token_id    hidden[b, argmax_t input_ids[b, t]]                CLIP's original configs
    last_token      hidden[:, -1]                                      SigLIP
"""

from __future__ import annotations

import torch
from torch import nn

from zoo.blocks import build_norm
from zoo.blocks.attention import Attention
from zoo.blocks.ffn import FeedForward
from zoo.spec import AttentionSpec, FFNSpec, NormSpec
from zoo.spec.blocks import Activation
from zoo.spec.dual import AttentionPooling, TextPoolingSpec


class AttentionPoolingHead(nn.Module):
    """SigLIP's multihead-attention pooling: hidden (B, P, C) -> (B, C).

    One learned query (``probe``) attends to every token through zoo's cross-attention (transformers keeps
    the query/key/value rows fused in nn.MultiheadAttention's in_proj: the mapping splits them), then a
    pre-norm MLP with a residual, as in Zhai et al. 2022 (big_vision's MAPHead)."""

    def __init__(
        self,
        spec: AttentionPooling,
        *,
        d_model: int,
        num_heads: int,
        d_ff: int,
        activation: Activation,
        norm: NormSpec,
    ) -> None:
        super().__init__()
        self.probe = nn.Parameter(torch.empty(1, 1, d_model))  # (1, 1, C): the one learned query
        nn.init.normal_(self.probe)  # a fill the meta-device build skips (`zoo.models.build`), unlike randn
        self.attn = Attention(
            AttentionSpec(num_heads=spec.num_heads or num_heads), d_model=d_model, cross=True
        )
        self.norm = build_norm(norm, dim=d_model)
        ffn = FFNSpec(d_ff=spec.d_ff or d_ff, activation=spec.activation or activation, bias=True)
        self.mlp = FeedForward(ffn, d_model=d_model)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        probe = self.probe.expand(hidden.shape[0], -1, -1)  # (B, 1, C)
        h, _ = self.attn(probe, memory=hidden)  # (B, 1, C)
        h = h + self.mlp(self.norm(h))  # (B, 1, C)
        return h[:, 0]  # (B, C)


def pool_text(
    hidden: torch.Tensor, input_ids: torch.Tensor, spec: TextPoolingSpec, *, eos_token_id: int | None
) -> torch.Tensor:
    """hidden (B, T, C), input_ids (B, T) -> (B, C): the state of the position ``spec`` names."""
    rows = torch.arange(hidden.shape[0], device=hidden.device)  # (B,)
    if spec.kind == "last_token":
        return hidden[:, -1]
    if spec.kind == "max_token_id":
        return hidden[rows, input_ids.argmax(dim=-1)]
    # the first eos: padding may reuse the eos id (argmax returns the first maximum)
    assert eos_token_id is not None  # the spec requires it for eos_token pooling
    first = torch.eq(input_ids, eos_token_id).int().argmax(dim=-1)  # (B,)
    return hidden[rows, first]
