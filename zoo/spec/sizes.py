"""How big a spec's model is, from the spec alone: parameters and fixed buffers, counted without torch.

`parameter_count` is exact: it equals ``zoo.build(spec).num_parameters()`` (a tied or shared tensor counts
once), so a spec can be sized, and refused (`zoo.spec.limits`), before a single tensor is allocated.
`buffer_count` counts the fixed tables built with the model (sinusoids, rotary angles, ALiBi slopes, BART's
logits bias). Per-call memory (activations, the KV cache) depends on the batch, not the spec: not here.
"""

from __future__ import annotations

from typing import Any, Protocol

from zoo.spec.blocks import AttentionSpec, EmbeddingSpec, FeedForwardSpec, MoESpec, NormSpec
from zoo.spec.stacks import ResolvedStack


class SizedSpec(Protocol):
    """What sizing reads from a model spec (`zoo.spec.model` validates with this module, so it cannot be
    imported here); family-specific fields (heads, lm_head, source_vocab_size) are read if present."""

    @property
    def vocab_size(self) -> int: ...
    @property
    def d_model(self) -> int: ...
    @property
    def max_positions(self) -> int: ...
    @property
    def norm(self) -> NormSpec: ...
    @property
    def embedding(self) -> EmbeddingSpec: ...
    @property
    def embedding_dim(self) -> int: ...
    def stacks(self) -> dict[str, ResolvedStack]: ...


def parameter_count(spec: SizedSpec, *, active: bool = False) -> int:
    """Distinct parameters of the model ``spec`` describes (== ``zoo.build(spec).num_parameters()``).

    ``active``: the parameters one token runs through: a Mixture-of-Experts layer counts its router, its
    shared expert and ``top_k`` of its ``num_experts`` routed experts (Mixtral 8x7B: 46.7B total, 12.9B
    active); a dense model's active count is its total."""
    E, C = spec.embedding_dim, spec.d_model
    total = _embedding(spec, spec.vocab_size)
    source_vocab_size: int | None = getattr(spec, "source_vocab_size", None)
    if source_vocab_size:
        total += _embedding(spec, source_vocab_size)
    S = spec.embedding.stack_dim(C)  # positions and the embedding norm (E, unless E is projected in first)
    for stack in spec.stacks().values():
        total += _stack(
            stack, embed_dim=S, d_model=C, max_positions=spec.max_positions, spec=spec, active=active
        )
    if spec.embedding.projection_dim:
        total += 2 * _linear(E, C, bias=False)  # OPT's project_in (E -> C) and project_out (C -> E)
    heads: Any = getattr(spec, "heads", None)  # an encoder's EncoderHeadsSpec
    lm_head: Any = getattr(spec, "lm_head", None)  # a decoder's LMHeadSpec
    if heads is not None:
        if heads.pooler:
            total += _linear(C, C, bias=True)
        if heads.mlm is not None:
            total += _linear(C, E, bias=heads.mlm.dense_bias) + _norm(spec.norm, E)
            total += spec.vocab_size if heads.mlm.bias else 0  # the output bias
            total += 0 if heads.mlm.tied else spec.vocab_size * E
        classifier = heads.classifier
        if classifier is not None:
            total += _linear(C, classifier.num_labels, bias=True)
            if getattr(classifier, "pooling", None) in ("dense", "pre_classifier"):  # its own dense C -> C
                total += _linear(C, C, bias=True)
            if classifier.transform is not None:  # ModernBERT's head: dense C -> C and a norm
                total += _linear(C, C, bias=classifier.transform.bias) + _norm(spec.norm, C)
        if heads.replaced_token is not None:  # ELECTRA's discriminator: C -> C -> 1
            total += _linear(C, C, bias=True) + _linear(C, 1, bias=True)
    if lm_head is not None and not lm_head.tied:
        total += spec.vocab_size * (spec.embedding.projection_dim or C)  # a projected model's head reads E
    if lm_head is not None and lm_head.bias:
        total += spec.vocab_size
    return total


def buffer_count(spec: SizedSpec) -> int:
    """Elements of the fixed (non-persistent) tables built with the model."""
    total = 0
    for stack in spec.stacks().values():
        kind = stack.position.kind
        if stack.position.kind == "sinusoidal":  # (not `kind`: mypy narrows the union for ``offset``)
            total += (spec.max_positions + stack.position.offset) * spec.embedding.stack_dim(spec.d_model)
        elif stack.position.kind == "rotary":
            dims = stack.position.rotary_dims(stack.attention.resolved_head_dim(spec.d_model))
            longrope = stack.position.scaling is not None and stack.position.scaling.type == "longrope"
            pairs = 1 + longrope + (stack.position.local_theta is not None)  # + LongRoPE's long, the local
            total += 2 * pairs * spec.max_positions * dims  # cos and sin of each pair
        elif kind == "alibi":
            total += stack.attention.num_heads
    lm_head: Any = getattr(spec, "lm_head", None)
    if lm_head is not None and lm_head.logits_bias:
        total += spec.vocab_size
    return total


def _embedding(spec: SizedSpec, vocab_size: int) -> int:
    return (vocab_size + spec.embedding.segment_vocab_size) * spec.embedding_dim


def _stack(
    stack: ResolvedStack, *, embed_dim: int, d_model: int, max_positions: int, spec: SizedSpec, active: bool
) -> int:
    position = stack.position
    total = 0
    if position.kind == "learned":
        total += (max_positions + position.offset) * embed_dim
        if position.relative_bias is not None:  # MPNet: a relative bias table beside the learned one
            total += position.relative_bias.num_buckets * stack.attention.num_heads
    elif position.kind == "relative_bias":
        tables = stack.num_layers if position.per_layer else 1
        total += tables * position.num_buckets * stack.attention.num_heads
    if spec.embedding.norm:
        total += _norm(stack.norm, embed_dim)
    if spec.embedding.factorized_dim:
        total += _linear(embed_dim, d_model, bias=True)
    norms = 2 if stack.norm.placement == "sandwich" else 1  # per sub-layer: before it, and after it
    layer = _attention(stack.attention, d_model) + norms * _norm(stack.norm, d_model)
    if stack.cross_attention is not None:
        layer += _attention(stack.cross_attention, d_model) + norms * _norm(stack.norm, d_model)
    layer += norms * _norm(stack.norm, d_model)
    layers = 1 if stack.share_layers else stack.num_layers
    total += layer * layers + sum(_ffn(stack.ffn, d_model, layer_idx=i, active=active) for i in range(layers))
    if not stack.norm.first_attention_norm:  # the first layer's attention input is not normalised
        total -= _norm(stack.norm, d_model)
    if stack.norm.has_final:
        total += _norm(stack.norm, d_model)
    return total


def _attention(spec: AttentionSpec, d_model: int) -> int:
    """Self- and cross-attention alike: q, k, v and output projections (+ per-head q/k norms)."""
    head_dim = spec.resolved_head_dim(d_model)
    q_width, kv_width = spec.num_heads * head_dim, spec.kv_heads * head_dim
    total = _linear(d_model, q_width + 2 * kv_width, bias=spec.bias) + _linear(
        q_width, d_model, bias=spec.has_out_bias
    )
    return total + (2 * head_dim if spec.qk_norm else 0)


def _ffn(spec: FeedForwardSpec, d_model: int, *, layer_idx: int, active: bool) -> int:
    if isinstance(spec, MoESpec):
        return _moe(spec, d_model, layer_idx=layer_idx, active=active)
    up = spec.d_ff * (2 if spec.gated else 1)
    return _linear(d_model, up, bias=spec.bias) + _linear(spec.d_ff, d_model, bias=spec.bias)


def _moe(spec: MoESpec, d_model: int, *, layer_idx: int, active: bool) -> int:
    """A sparse layer: router (E, C), experts (E, 2F, C) + (E, C, F), shared expert and its gate; or the
    dense layer's gated FFN."""
    if not spec.is_sparse(layer_idx):
        if spec.dense_d_ff is None:  # refused by the spec's own checks, which run after the size limits
            return 0
        return _ffn(spec.dense_spec(), d_model, layer_idx=layer_idx, active=active)
    experts = spec.top_k if active else spec.num_experts
    total = _linear(d_model, spec.num_experts, bias=False) + experts * 3 * d_model * spec.d_ff
    if spec.shared_d_ff is not None:
        total += 3 * d_model * spec.shared_d_ff + (d_model if spec.shared_gate else 0)
    return total


def _norm(spec: NormSpec, dim: int) -> int:
    return dim * (2 if spec.kind == "layernorm" and spec.bias else 1)


def _linear(n_in: int, n_out: int, *, bias: bool) -> int:
    return n_in * n_out + (n_out if bias else 0)
