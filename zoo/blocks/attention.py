"""Multi-head attention for self- and cross-attention, with MHA, GQA and MQA (Vaswani et al. 2017, 3.2).

Shapes: B batch, T query length, S key length, H query heads, K key/value heads, D head dim, C model width.

    self-attention:   qkv_proj: (B, T, C) -> (B, T, (H + 2K) D), one fused matmul
    cross-attention:  q_proj on the decoder stream, kv_proj: (B, S, C) -> (B, S, 2 K D) on the encoder output

Grouped-query attention shares each key/value head among H / K query heads:

    q heads:  0 1 2 3 | 4 5 6 7        (H = 8)
    kv heads:    0    |    1           (K = 2)

Fast path: `torch.nn.functional.scaled_dot_product_attention` (fused kernels). GQA goes to SDPA as
``enable_gqa`` where a fused kernel accepts it, or as keys/values expanded to H heads where none would
(`gqa_mode`): on CUDA the flash kernel takes no mask and the memory-efficient kernel takes no ``enable_gqa``,
so a masked GQA call with ``enable_gqa`` would fall back to the O(T²)-memory math kernel.
Eager path (``output_attentions=True``): the same math written out, returning the (B, H, T, S) weights.
Block-sparse path: a flex_attention ``BlockMask`` as the mask (an attention pattern, `zoo.blocks.flex`).
Packed-rows path: a `zoo.blocks.segments.SegmentPlan` as the mask: SDPA per group of like-length documents.

Soft-capped logits (``softcap``, Gemma 2: ``logits = cap * tanh(logits / cap)`` after scaling, before the
mask) have no SDPA form: with a flex ``BlockMask`` they run as flex_attention's ``score_mod``; otherwise
the math path (the eager one, weights not returned) computes them. It holds (B, H, T, S) scores, as
transformers' eager Gemma 2 does; the flex path is the fused one (``attention_kernel("flex")``).

q/k norms (``qk_norm``) are RMSNorms over each head's D dims with one weight for every head (Qwen3), or with
``qk_norm_scope: all_heads`` (OLMo 2) over the whole (B, T, H D) query and (B, T, K D) key projections,
before they split into heads. Llama 4's (``qk_norm_weight: false``, ``qk_norm_layers: rotary``) have no
weight and run on the rotary layers only; transformers applies them after the rotation, zoo before: an RMS
over a head is unchanged by rotating its pairs, so the two agree. Its temperature tuning
(``temperature_tuning``) scales the queries of the layers without rotary positions by their slot.

Attention sinks (``sinks``, gpt-oss): each head has a learned logit that joins every query's softmax as
one more key with a zero value, so weights over the real keys may sum to less than one. SDPA has no sink
input: the dense path appends a zero key and value and puts the sink logits in the float mask's extra
column (`with_sink_column`), exact and still a fused kernel; flex_attention returns the log-sum-exp of the
real keys' logits and its output is rescaled by sigmoid(lse - sink) = Z / (Z + exp(sink)), the same
softmax; the math path (and torch.export) concatenates the sink column to the scores, as transformers'
eager gpt-oss does.

The KV-cache hook: pass ``cache``, an object with ``update(k, v) -> (k_all, v_all)`` (self-attention:
append this step's keys/values, return all so far), ``filled`` and ``get()`` (cross-attention: the
encoder's keys/values are projected once, stored with ``update`` and reused).
"""

from __future__ import annotations

from typing import Literal, Protocol

import torch
from torch import nn
from torch.nn import functional as F

from zoo.blocks import segments
from zoo.blocks.flex import BlockMask, flex_attend
from zoo.blocks.masks import additive_as, causal_mask, with_sink_column
from zoo.blocks.norm import RMSNorm
from zoo.blocks.position import apply_rotary
from zoo.spec import AttentionSpec

GQAMode = Literal["mha", "enable_gqa", "expand"]


def gqa_mode(*, device_type: str, masked: bool, num_heads: int, num_kv_heads: int) -> GQAMode:
    """How SDPA should see K < H key/value heads so a fused kernel runs.

    ``mha``: K == H, nothing to do. ``enable_gqa``: SDPA shares each key/value head itself (CPU kernels and
    CUDA's flash kernel, which needs no mask). ``expand``: repeat keys/values to H heads first — on CUDA
    with a mask, where only the memory-efficient kernel (no GQA support) accepts the mask.
    """
    if num_kv_heads == num_heads:
        return "mha"
    if device_type == "cuda" and masked:
        return "expand"
    return "enable_gqa"


class KVSlot(Protocol):
    """One attention module's slot in a KV cache (see `zoo.generation.cache`)."""

    filled: bool

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...

    def get(self) -> tuple[torch.Tensor, torch.Tensor]: ...


class Attention(nn.Module):
    """Self-attention (``cross=False``) or cross-attention over a ``memory`` (``cross=True``)."""

    def __init__(
        self, spec: AttentionSpec, *, d_model: int, cross: bool = False, qk_unit_offset: bool = False
    ) -> None:
        """``qk_unit_offset``: the stack's RMSNorms scale by (1 + weight) (`NormSpec.unit_offset`), and so
        do the q/k norms here."""
        super().__init__()
        self.num_heads, self.num_kv_heads = spec.num_heads, spec.kv_heads
        self.head_dim = spec.resolved_head_dim(d_model)
        # what one layer's KV cache slot holds per token: keys and values of (cache_heads, cache_dim) each
        self.cache_heads, self.cache_dim = self.num_kv_heads, self.head_dim
        self.cross = cross
        self.scale = spec.resolved_scale(d_model)
        self.softcap = spec.softcap
        self.dropout = spec.dropout
        q_width, kv_width = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        # Without a key bias (``key_bias: false``, Whisper) the fused projection has none, and the query and
        # value biases are a parameter of their own: qv_bias (H D + K D) here, v_bias (K D) on the cross side
        keyless = spec.bias and not spec.has_key_bias
        if cross:
            self.q_proj = nn.Linear(d_model, q_width, bias=spec.bias)
            self.kv_proj = nn.Linear(d_model, 2 * kv_width, bias=spec.has_key_bias)
            self.v_bias = nn.Parameter(torch.zeros(kv_width)) if keyless else None
        else:
            self.qkv_proj = nn.Linear(d_model, q_width + 2 * kv_width, bias=spec.has_key_bias)
            self.qv_bias = nn.Parameter(torch.zeros(q_width + kv_width)) if keyless else None
        self.out_proj = nn.Linear(q_width, d_model, bias=spec.has_out_bias)
        eps = spec.qk_norm_eps
        self.qk_norm_all_heads = spec.qk_norm and spec.qk_norm_scope == "all_heads"
        q_dim, k_dim = (q_width, kv_width) if self.qk_norm_all_heads else (self.head_dim, self.head_dim)
        weighted = spec.qk_norm_weight
        self.q_norm = (
            RMSNorm(q_dim, eps=eps, unit_offset=qk_unit_offset, weight=weighted) if spec.qk_norm else None
        )
        self.k_norm = (
            RMSNorm(k_dim, eps=eps, unit_offset=qk_unit_offset, weight=weighted) if spec.qk_norm else None
        )
        self.qk_norm_rotary_only = spec.qk_norm_layers == "rotary"
        self.temperature = spec.temperature_tuning
        # (H,) one sink logit per head; zero at init: the sink starts as one more key of logit 0
        self.sinks = nn.Parameter(torch.zeros(self.num_heads)) if spec.sinks else None

    @torch.no_grad()
    def init_weights(self, *, residual_std: float | None = None, fold_scale_into_query: bool = False) -> None:
        """This block's part of `zoo.models.init.initialize`, on top of the default for every matrix.

        ``residual_std``: redraw ``out_proj``, which writes into the residual stream, from N(0, residual_std)
        (GPT-2's scaled residual). ``fold_scale_into_query``: when the logits are unscaled (T5), shrink
        the query rows by head_dim**-0.5 instead, so the first logits are as small as a scaled model's.
        """
        if residual_std is not None:
            self.out_proj.weight.normal_(0.0, residual_std)
        if fold_scale_into_query and self.scale == 1.0:
            q_rows = self.num_heads * self.head_dim
            q = self.q_proj.weight if self.cross else self.qkv_proj.weight[:q_rows]  # rows [q | k | v]
            q.mul_(self.head_dim**-0.5)

    def forward(
        self,
        x: torch.Tensor,
        *,
        memory: torch.Tensor | None = None,
        mask: torch.Tensor | BlockMask | segments.SegmentPlan | None = None,
        is_causal: bool = False,
        rotary: tuple[torch.Tensor, torch.Tensor] | None = None,
        cache: KVSlot | None = None,
        output_attentions: bool = False,
        slots: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x (B, T, C); memory (B, S, C) for cross-attention; mask bool or additive, broadcastable to
        (B, H, T, S), a flex `BlockMask`, or packed rows' `SegmentPlan`. ``slots`` (T,) or (B, T): each query's slot in its row (cached
        ones counted), for ``temperature_tuning``. Returns the output (B, T, C) and, when asked, the weights
        (B, H, T, S)."""
        q, k, v = self._project(x, memory, rotary, cache)
        if self.temperature is not None and rotary is None and not self.cross:
            assert slots is not None, "temperature tuning needs each query's slot"
            q = temperature_scaled(
                q, slots, floor_scale=self.temperature.floor_scale, scale=self.temperature.scale
            )
        dtype = q.dtype
        if dtype != k.dtype:  # a KV cache may keep k/v in float32 (zoo.generation.cache)
            q = q.to(k.dtype)
        if isinstance(mask, BlockMask):  # a pattern through flex_attention (no weights, no dropout)
            out = flex_attend(q, k, v, mask, scale=self.scale, softcap=self.softcap, sinks=self.sinks)
            weights = None
        elif isinstance(mask, segments.SegmentPlan):  # packed rows: per document (the stack checked it may)
            out, weights = segments.attend(q, k, v, mask, self._sdpa), None
        elif output_attentions or self.softcap is not None or self._sink_math():  # SDPA cannot: math path
            out, weights = self._eager(q, k, v, mask, is_causal)
            weights = weights if output_attentions else None
        else:
            out, weights = self._sdpa(q, k, v, mask, is_causal), None
        B, _, T, _ = q.shape
        out = out.transpose(1, 2)  # (B, T, H, D)
        if torch.compiler.is_exporting():
            # The traced reshape becomes a view valid for the traced kernel's output layout; a later
            # lowering (ONNX) may pick an SDPA kernel with another layout: copy, so the view always holds.
            out = out.clone(memory_format=torch.contiguous_format)
        out = out.reshape(B, T, self.num_heads * self.head_dim)  # (B, T, H D)
        return self.out_proj(out if out.dtype == dtype else out.to(dtype)), weights

    def _sink_math(self) -> bool:
        """Sinks under torch.export take the math path: SDPA over the sink column (S + 1 keys) makes the
        exporter guard on stride relations that do not hold for every length."""
        return self.sinks is not None and torch.compiler.is_exporting()

    def _project(
        self,
        x: torch.Tensor,
        memory: torch.Tensor | None,
        rotary: tuple[torch.Tensor, torch.Tensor] | None,
        cache: KVSlot | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        B, T, _ = x.shape
        H, K, D = self.num_heads, self.num_kv_heads, self.head_dim
        whole = self.qk_norm_all_heads  # q/k norms over all heads: before the split into heads
        if self.cross:
            q = self.q_proj(x)  # (B, T, H D)
            if whole and self.q_norm is not None:
                q = self.q_norm(q)
            q = q.view(B, T, H, D).transpose(1, 2)  # (B, H, T, D)
            if cache is not None and cache.filled:
                k, v = cache.get()
            else:
                assert memory is not None, "cross-attention needs the encoder output as memory"
                S = memory.shape[1]
                kv = self.kv_proj(memory)  # (B, S, 2 K D)
                if self.v_bias is not None:  # no key bias: zeros for the keys, then the values' bias
                    kv = kv + torch.cat([self.v_bias.new_zeros(K * D), self.v_bias])
                kv = kv.view(B, S, 2, K, D)
                k, v = kv.unbind(dim=2)  # (B, S, K, D) each
                if whole and self.k_norm is not None:
                    k = self.k_norm(k.reshape(B, S, K * D)).view(B, S, K, D)
                k, v = k.transpose(1, 2), v.transpose(1, 2)  # (B, K, S, D)
                if self.k_norm is not None and not whole:
                    k = self.k_norm(k)
                if cache is not None:
                    k, v = cache.update(k, v)
            if self.q_norm is not None and not whole:
                q = self.q_norm(q)
            return q, k, v
        qkv = self.qkv_proj(x)  # (B, T, (H + 2K) D)
        if self.qv_bias is not None:  # no key bias: the queries' bias, zeros for the keys, the values'
            q_bias, v_bias = self.qv_bias.split([H * D, K * D])
            qkv = qkv + torch.cat([q_bias, q_bias.new_zeros(K * D), v_bias])
        if whole and self.q_norm is not None and self.k_norm is not None:
            q, k, v = qkv.split([H * D, K * D, K * D], dim=-1)  # (B, T, H D | K D)
            q, k = self.q_norm(q), self.k_norm(k)
            q, k, v = q.view(B, T, H, D), k.view(B, T, K, D), v.view(B, T, K, D)
        else:
            q, k, v = qkv.view(B, T, H + 2 * K, D).split([H, K, K], dim=2)  # (B, T, H|K, D)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, H|K, T, D)
        normed = not self.qk_norm_rotary_only or rotary is not None  # Llama 4: rotary layers only
        if self.q_norm is not None and self.k_norm is not None and not whole and normed:
            q, k = self.q_norm(q), self.k_norm(k)
        if rotary is not None:
            q, k = apply_rotary(q, *rotary), apply_rotary(k, *rotary)
        if cache is not None:
            k, v = cache.update(k, v)  # (B, K, S, D): cached keys followed by this step's
        return q, k, v

    def _sdpa(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, is_causal: bool
    ) -> torch.Tensor:
        if self.sinks is not None:  # one more key: zero key and value, its logit the sink (mask column)
            B, H, T, _ = q.shape
            mask = with_sink_column(
                causal_mask(T, k.shape[2], device=q.device) if is_causal and mask is None else mask,
                self.sinks,
                shape=(B, H, T, k.shape[2]),
                dtype=q.dtype,
            )  # (B|1, H, T, S + 1)
            zero = k.new_zeros(k.shape[0], k.shape[1], 1, k.shape[3])  # (B, K, 1, D)
            k, v = torch.cat([k, zero], dim=2), torch.cat([v, zero], dim=2)  # (B, K, S + 1, D)
        return sdpa(
            q, k, v, mask, is_causal, scale=self.scale, dropout=self.dropout if self.training else 0.0
        )

    def _eager(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, is_causal: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return eager_attention(
            q,
            k,
            v,
            mask,
            is_causal,
            scale=self.scale,
            softcap=self.softcap,
            dropout=self.dropout,
            training=self.training,
            sinks=self.sinks,
        )


def temperature_scaled(
    q: torch.Tensor, slots: torch.Tensor, *, floor_scale: int, scale: float
) -> torch.Tensor:
    """Llama 4's temperature tuning: q (B, H, T, D) times 1 + scale * log(1 + floor((slot + 1) / floor_scale)),
    ``slots`` (T,) or (B, T) each query's slot, the factor computed in float32 as transformers does."""
    factor = torch.log1p(torch.floor((slots.float() + 1.0) / floor_scale)) * scale + 1.0  # (T,) | (B, T)
    return (q * factor.view(-1, 1, slots.shape[-1], 1)).to(q.dtype)


def sdpa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    is_causal: bool,
    *,
    scale: float,
    dropout: float = 0.0,
) -> torch.Tensor:
    """q (B, H, T, D), k (B, K, S, D), v (B, K, S, Dv), K dividing H -> (B, H, T, Dv) through SDPA's fused
    kernels (`gqa_mode` says how K < H heads go to them); ``dropout``: the rate to apply now."""
    if mask is not None and mask.dtype != torch.bool:
        mask = additive_as(mask, q.dtype)  # under autocast q is narrower than the mask: stay finite
    H, K = q.shape[1], k.shape[1]
    mode = gqa_mode(device_type=q.device.type, masked=mask is not None, num_heads=H, num_kv_heads=K)
    if mode == "expand":
        k, v = k.repeat_interleave(H // K, dim=1), v.repeat_interleave(H // K, dim=1)  # (B, H, S, D)
    return F.scaled_dot_product_attention(
        q,
        k,
        v,
        attn_mask=mask,
        dropout_p=dropout,
        is_causal=is_causal and mask is None,
        scale=scale,
        enable_gqa=mode == "enable_gqa",
    )  # (B, H, T, Dv)


def eager_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    is_causal: bool,
    *,
    scale: float,
    softcap: float | None = None,
    dropout: float = 0.0,
    training: bool = False,
    sinks: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The math path of `sdpa`, with Gemma 2's soft-cap and gpt-oss's ``sinks`` (H,): ((B, H, T, Dv)
    output, (B, H, T, S) weights)."""
    H, K = q.shape[1], k.shape[1]
    if K != H:
        k, v = k.repeat_interleave(H // K, dim=1), v.repeat_interleave(H // K, dim=1)  # (B, H, S, D)
    scores = (q @ k.transpose(-2, -1)).float() * scale  # (B, H, T, S)
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if is_causal and mask is None:
        mask = causal_mask(*scores.shape[-2:], device=q.device)
    if mask is not None:
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        else:
            scores = scores + mask.float()
    if sinks is not None:  # the sink column joins the softmax, then is dropped
        B, _, T, _ = scores.shape
        sink = sinks.float().view(1, H, 1, 1).expand(B, H, T, 1)  # (B, H, T, 1)
        weights = torch.cat([scores, sink], dim=-1).softmax(dim=-1)[..., :-1]  # (B, H, T, S)
    else:
        weights = scores.softmax(dim=-1)
    dropped = F.dropout(weights, p=dropout, training=training)
    return dropped.to(v.dtype) @ v, weights  # (B, H, T, Dv), (B, H, T, S)
