"""Multi-head latent attention (MLA), built from an `AttentionSpec` with ``latent`` (DeepSeek-V2, arXiv
2405.04434, section 2.1; DeepSeek-V3, Kimi K2), after transformers' ``DeepseekV3Attention``.

Shapes: B batch, T query length, S key length, H heads, C model width, R ``kv_lora_rank`` (the latent),
P ``rope_head_dim``, N ``head_dim`` (no-rope query/key dims), V ``v_head_dim``.

    x ──q_proj (or q_a_proj ─> q_norm ─> q_b_proj)──> q (B, H, T, N + P): [q_nope | q_rope] ─rope on q_rope
    x ──kv_a_proj──> [latent (R) | k_rope (P)] ──kv_norm on latent, rope on k_rope (one key for all heads)
                          │
                          └─> cached per token: [latent | k_rope], R + P numbers (not 2 H (N + P) of k, v)
    latent ──kv_b_proj──> per head [k_nope (N) | v (V)];  k = [k_nope | k_rope]  ──attention──> out_proj

Two exact ways to attend over the cached latents:

    plain     expand every cached latent through kv_b_proj into H keys and values (prefill: T large)
    absorbed  fold kv_b_proj into the query and the output instead (decode: one query, many keys):
              q·k_nope = (W_uk^T q_nope)·latent, so the H heads attend over the one shared
              [latent | k_rope] as multi-query attention of width R + P, and the (B, H, T, R) result is
              mapped by W_uv to the values' width; no key or value is ever expanded.

``absorb`` picks: ``"decode"`` (the default) absorbs on cached one-token steps, ``"always"`` / ``"never"``
force a path (the tests compare the two). A ``kv_b_proj`` that is no plain ``nn.Linear`` (a LoRA adapter, a
quantised layer) is never folded: the plain path runs it as it is.

The cache slot (`zoo.blocks.attention.KVSlot`) stores k and v of one head each: the per-token vector
``[latent | k_rope]`` (zero-padded to an even width) split into two equal halves, so the generation cache,
the serving slots, their moves and the prefix cache keep every slot one tensor and need no latent kind.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

from zoo.blocks.attention import Attention, KVSlot, eager_attention, sdpa
from zoo.blocks.flex import BlockMask, flex_attend
from zoo.blocks.norm import RMSNorm
from zoo.blocks.position import apply_rotary
from zoo.spec import AttentionSpec

Absorb = Literal["decode", "always", "never"]


class LatentAttention(nn.Module):
    """Self-attention through a cached low-rank latent (see the module docstring)."""

    def __init__(self, spec: AttentionSpec, *, d_model: int, qk_unit_offset: bool = False) -> None:
        """``qk_unit_offset``: the stack's RMSNorms scale by (1 + weight), and so do the latent norms here."""
        super().__init__()
        latent = spec.latent
        assert latent is not None  # `build_attention` sends only latent specs here
        self.num_heads = self.num_kv_heads = spec.num_heads
        self.head_dim = spec.resolved_head_dim(d_model)  # N: the no-rope query/key dims
        self.rope_dim, self.rank = latent.rope_head_dim, latent.kv_lora_rank
        self.v_dim = latent.v_head_dim or self.head_dim
        self.cross = False
        self.scale, self.softcap, self.dropout = spec.resolved_scale(d_model), spec.softcap, spec.dropout
        self.absorb: Absorb = "decode"
        width = self.rank + self.rope_dim
        self.cache_heads, self.cache_dim = 1, (width + 1) // 2  # [latent | k_rope] in two halves
        H, N, P, eps = self.num_heads, self.head_dim, self.rope_dim, latent.norm_eps
        self.q_proj: nn.Linear | None = None
        self.q_a_proj: nn.Linear | None = None
        self.q_norm: RMSNorm | None = None
        self.q_b_proj: nn.Linear | None = None
        if latent.q_lora_rank is None:
            self.q_proj = nn.Linear(d_model, H * (N + P), bias=False)  # DeepSeek: never a bias here
        else:
            self.q_a_proj = nn.Linear(d_model, latent.q_lora_rank, bias=spec.bias)
            self.q_norm = RMSNorm(latent.q_lora_rank, eps=eps, unit_offset=qk_unit_offset)
            self.q_b_proj = nn.Linear(latent.q_lora_rank, H * (N + P), bias=False)
        self.kv_a_proj = nn.Linear(d_model, width, bias=spec.bias)
        self.kv_norm = RMSNorm(self.rank, eps=eps, unit_offset=qk_unit_offset)
        self.kv_b_proj = nn.Linear(self.rank, H * (N + self.v_dim), bias=False)
        self.out_proj = nn.Linear(H * self.v_dim, d_model, bias=spec.has_out_bias)

    @torch.no_grad()
    def init_weights(self, *, residual_std: float | None = None, fold_scale_into_query: bool = False) -> None:
        """As `zoo.blocks.attention.Attention.init_weights` (the logits are always scaled here)."""
        if residual_std is not None:
            self.out_proj.weight.normal_(0.0, residual_std)

    def forward(
        self,
        x: torch.Tensor,
        *,
        memory: torch.Tensor | None = None,
        mask: torch.Tensor | BlockMask | None = None,
        is_causal: bool = False,
        rotary: tuple[torch.Tensor, torch.Tensor] | None = None,
        cache: KVSlot | None = None,
        output_attentions: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x (B, T, C); mask bool or additive, broadcastable to (B, H, T, S), or a flex `BlockMask`;
        ``rotary``: (cos, sin) of the rope dims. Returns (B, T, C) and, when asked, the weights (B, H, T, S)."""
        B, T, _ = x.shape
        H, N, P, R = self.num_heads, self.head_dim, self.rope_dim, self.rank
        q = self._query(x).view(B, T, H, N + P).transpose(1, 2)  # (B, H, T, N + P)
        q_nope, q_rope = q.split([N, P], dim=-1)
        latent, k_rope = self.kv_a_proj(x).split([R, P], dim=-1)  # (B, T, R), (B, T, P)
        latent, k_rope = self.kv_norm(latent).unsqueeze(1), k_rope.unsqueeze(1)  # (B, 1, T, R | P)
        if rotary is not None:
            q_rope, k_rope = apply_rotary(q_rope, *rotary), apply_rotary(k_rope, *rotary)
        keys = torch.cat([latent, k_rope], dim=-1)  # (B, 1, T, R + P)
        if cache is not None:
            keys = self._cached(keys, cache)  # (B, 1, S, R + P), every position so far
        absorbed = self.absorb == "always" or (self.absorb == "decode" and cache is not None and T == 1)
        # only where kv_b_proj is a plain linear, whose weight is all it computes (an adapter or a quantised
        # layer computes more, or otherwise: the plain path runs it as it is)
        foldable = type(self.kv_b_proj) is nn.Linear
        if absorbed and foldable and not output_attentions and not isinstance(mask, BlockMask):
            out, weights = self._absorbed(q_nope, q_rope, keys, mask, is_causal), None  # (B, H, T, V)
        else:
            out, weights = self._plain(q_nope, q_rope, keys, mask, is_causal, output_attentions)
        out = out.transpose(1, 2).reshape(B, T, H * self.v_dim)  # (B, T, H V)
        return self.out_proj(out.to(x.dtype)), weights

    def _query(self, x: torch.Tensor) -> torch.Tensor:
        if self.q_proj is not None:
            return self.q_proj(x)
        assert self.q_a_proj is not None and self.q_norm is not None and self.q_b_proj is not None
        return self.q_b_proj(self.q_norm(self.q_a_proj(x)))  # (B, T, H (N + P))

    def _cached(self, keys: torch.Tensor, cache: KVSlot) -> torch.Tensor:
        """Store this step's [latent | k_rope] (B, 1, T, R + P) as the slot's two halves; return all so far."""
        width = keys.shape[-1]
        if 2 * self.cache_dim != width:
            keys = torch.nn.functional.pad(keys, (0, 1))  # (B, 1, T, 2 cache_dim)
        first, second = cache.update(keys[..., : self.cache_dim], keys[..., self.cache_dim :])
        return torch.cat([first, second], dim=-1)[..., :width]  # (B, 1, S, R + P)

    def _plain(
        self,
        q_nope: torch.Tensor,
        q_rope: torch.Tensor,
        keys: torch.Tensor,
        mask: torch.Tensor | BlockMask | None,
        is_causal: bool,
        output_attentions: bool,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Every key and value expanded from its latent: (B, H, T, V) and the weights when asked."""
        B, S, H, N = keys.shape[0], keys.shape[2], self.num_heads, self.head_dim
        latent, k_rope = keys.split([self.rank, self.rope_dim], dim=-1)  # (B, 1, S, R), (B, 1, S, P)
        weight = self.kv_b_proj.weight
        kv = self.kv_b_proj(latent.squeeze(1).to(weight.dtype)).view(B, S, H, N + self.v_dim).transpose(1, 2)
        k_nope, v = kv.split([N, self.v_dim], dim=-1)  # (B, H, S, N), (B, H, S, V)
        k = torch.cat([k_nope, k_rope.to(k_nope.dtype).expand(-1, H, -1, -1)], dim=-1)  # (B, H, S, N + P)
        q = torch.cat([q_nope, q_rope], dim=-1)  # (B, H, T, N + P)
        if isinstance(mask, BlockMask):
            return flex_attend(q, k, v, mask, scale=self.scale, softcap=self.softcap), None
        if output_attentions or self.softcap is not None:
            out, weights = eager_attention(
                q, k, v, mask, is_causal, scale=self.scale, softcap=self.softcap, dropout=self.dropout,
                training=self.training,
            )  # fmt: skip
            return out, weights if output_attentions else None
        dropout = self.dropout if self.training else 0.0
        return sdpa(q, k, v, mask, is_causal, scale=self.scale, dropout=dropout), None

    def _absorbed(
        self,
        q_nope: torch.Tensor,
        q_rope: torch.Tensor,
        keys: torch.Tensor,
        mask: torch.Tensor | None,
        is_causal: bool,
    ) -> torch.Tensor:
        """kv_b_proj folded into the query and the output: (B, H, T, V), the keys never expanded."""
        H, N = self.num_heads, self.head_dim
        weight = self.kv_b_proj.weight.view(H, N + self.v_dim, self.rank)  # (H, N + V, R)
        w_k, w_v = weight.split([N, self.v_dim], dim=1)  # (H, N, R), (H, V, R)
        q_latent = torch.einsum("bhtn,hnr->bhtr", q_nope, w_k)  # (B, H, T, R)
        q = torch.cat([q_latent, q_rope], dim=-1).to(keys.dtype)  # (B, H, T, R + P)
        values = keys[..., : self.rank]  # (B, 1, S, R): the latent is every head's value too
        if self.softcap is not None:
            out, _ = eager_attention(q, keys, values, mask, is_causal, scale=self.scale, softcap=self.softcap)
        else:
            dropout = self.dropout if self.training else 0.0
            out = sdpa(q, keys, values, mask, is_causal, scale=self.scale, dropout=dropout)  # (B, H, T, R)
        return torch.einsum("bhtr,hvr->bhtv", out.to(w_v.dtype), w_v)  # (B, H, T, V)


def build_attention(
    spec: AttentionSpec, *, d_model: int, qk_unit_offset: bool = False
) -> Attention | LatentAttention:
    """A layer's self-attention: latent (`LatentAttention`) when the spec has ``latent``, else `Attention`."""
    if spec.latent is not None:
        return LatentAttention(spec, d_model=d_model, qk_unit_offset=qk_unit_offset)
    return Attention(spec, d_model=d_model, qk_unit_offset=qk_unit_offset)
