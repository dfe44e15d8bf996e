"""The module tree of a built model, with parameter counts and each block's settings, for `zoo show`.

Identical layers fold into one node (``layers.0-11``, ×12). A shared layer (ALBERT) is one node run N
times, counted once. A tied output head owns no parameters and says whose matrix it reads.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from zoo.blocks import (
    ACTIVATIONS,
    Attention,
    FeedForward,
    LatentAttention,
    MoEFeedForward,
    RMSNorm,
    TokenEmbedding,
)
from zoo.blocks.moe import StackedLinear
from zoo.blocks.patches import PatchEmbedding
from zoo.blocks.position import (
    AlibiBias,
    LearnedPositions,
    NoPositions,
    RelativeBias,
    RotaryPositions,
    SinusoidalPositions,
)
from zoo.layers import Layer
from zoo.models.dual_encoder import DualEncoderModel
from zoo.models.dual_heads import AttentionPoolingHead
from zoo.models.heads import ClassificationHead, LMHead, MLMHead, Pooler, ReplacedTokenHead
from zoo.stacks import Stack

EMBEDDING_TABLES = (nn.Embedding, LearnedPositions, RelativeBias)
"""Lookup tables: parameters that cost no matmul FLOPs (Kaplan's "embedding" parameters)."""


@dataclass
class SummaryNode:
    """One module: its state-dict path, class, settings and distinct parameters (all copies included).

    ``copies`` > 1: identical layers folded into this node, ``params`` counts them all and each child
    counts one copy. ``runs`` > ``copies``: shared weights run more often than they are stored (ALBERT).
    """

    path: str
    name: str
    kind: str
    detail: str
    params: int
    children: list[SummaryNode] = field(default_factory=list)
    copies: int = 1
    runs: int = 1


def build_tree(model: nn.Module) -> SummaryNode:
    """The tree of ``model`` (any zoo model; a meta-device build is enough)."""
    paths = {id(module): path for path, module in model.named_modules()}
    tied = {}  # id(embedding) -> the head reading it
    for path, module in model.named_modules():
        for owner in getattr(module, "_tied_to", ()):
            tied[id(owner)] = path
    node = _node(model, "", "model", paths=paths, tied=tied)
    assert node is not None
    return node


def _node(module: nn.Module, path: str, name: str, **context: Any) -> SummaryNode | None:
    children: list[SummaryNode] = []
    for child_name, child in module.named_children():
        child_path = f"{path}.{child_name}" if path else child_name
        if isinstance(child, nn.ModuleList):
            runs = getattr(module, "num_layers", len(child))
            children.extend(_layers(child, child_path, child_name, runs=runs, **context))
        elif (node := _node(child, child_path, child_name, **context)) is not None:
            children.append(node)
    params = _count(module)
    detail = describe(module, **context)
    if not params and not detail and not children:
        return None  # dropout, activations: nothing to show
    return SummaryNode(path, name, type(module).__name__, detail, params, children)


def _layers(layers: nn.ModuleList, path: str, name: str, *, runs: int, **context: Any) -> list[SummaryNode]:
    """Fold identical layers into one node; keep layers that differ (none in zoo today) apart."""
    shapes = [[tuple(p.shape) for p in layer.parameters()] for layer in layers]
    if len(layers) == 0 or any(s != shapes[0] for s in shapes):
        nodes = (_node(layer, f"{path}.{i}", f"{name}.{i}", **context) for i, layer in enumerate(layers))
        return [node for node in nodes if node is not None]
    label = "0" if len(layers) == 1 else f"0-{len(layers) - 1}"
    first = _node(layers[0], f"{path}.{0 if len(layers) == 1 else '*'}", f"{name}.{label}", **context)
    assert first is not None
    if runs > len(layers):
        first.detail += f"; shared: one set of weights run {runs} times (cross-layer sharing)"
    return [
        SummaryNode(
            f"{path}.{label}",
            first.name,
            first.kind,
            first.detail,
            _count(layers),
            first.children,
            copies=len(layers),
            runs=max(runs, len(layers)),
        )
    ]


def _count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


# -- settings, one describer per block kind (a registry, as the blocks themselves) --------------------


def _attention(m: Attention, **_: Any) -> str:
    proj = m.q_proj if m.cross else m.qkv_proj
    parts = [f"{'cross' if m.cross else 'self'}-attention, {m.num_heads} heads × {m.head_dim}"]
    if m.num_kv_heads != m.num_heads:
        parts.append("multi-query (1 kv head)" if m.num_kv_heads == 1 else f"{m.num_kv_heads} kv heads (GQA)")
    keyless = getattr(m, "v_bias" if m.cross else "qv_bias", None) is not None  # q and v biases only
    parts += ["no key bias"] if keyless else [] if proj.bias is not None else ["no bias"]
    parts += [] if m.scale != 1.0 else ["unscaled logits"]
    parts += [f"logits × {m.scale:.4g}"] if m.scale not in (1.0, m.head_dim**-0.5) else []
    parts += [f"logits soft-capped at {m.softcap:g}"] if m.softcap is not None else []
    if m.q_norm is not None:
        parts.append("qk-norm over all heads" if m.qk_norm_all_heads else "qk-norm")
    parts += [f"dropout {m.dropout}"] if m.dropout else []
    if not m.cross:
        H, K, D = m.num_heads, m.num_kv_heads, m.head_dim
        parts.append(f"qkv rows [q {H * D} | k {K * D} | v {K * D}]")
    return ", ".join(parts)


def _latent(m: LatentAttention, **_: Any) -> str:
    parts = [
        f"latent self-attention, {m.num_heads} heads × (nope {m.head_dim} + rope {m.rope_dim}), values "
        f"{m.v_dim}, cached latent {m.rank} + rope key {m.rope_dim} per token"
    ]
    parts += [f"q bottleneck {m.q_a_proj.out_features}"] if m.q_a_proj is not None else []
    parts += [f"logits × {m.scale:.4g}"] if m.scale != (m.head_dim + m.rope_dim) ** -0.5 else []
    parts += [f"logits soft-capped at {m.softcap:g}"] if m.softcap is not None else []
    parts += [f"dropout {m.dropout}"] if m.dropout else []
    return ", ".join(parts)


def _ffn(m: FeedForward, **_: Any) -> str:
    act = next((name for name, fn in ACTIVATIONS.items() if fn is m.act), type(m.act).__name__)
    kind = (
        {"silu": "SwiGLU", "gelu": "GeGLU", "gelu_tanh": "GeGLU"}.get(act, f"{act} GLU") if m.gated else act
    )
    rows = f", up rows [gate {m.d_ff} | up {m.d_ff}]" if m.gated else ""
    return f"{kind}, d_ff {m.d_ff}{rows}" + ("" if m.up_proj.bias is not None else ", no bias")


def _moe(m: MoEFeedForward, **_: Any) -> str:
    weights = ("renormalised" if m.normalize_top_k else "sigmoid") if m.sigmoid else None
    weights = weights or ("renormalised" if m.normalize_top_k else "softmax")
    routing = f", in the best {m.top_groups} of {m.num_groups} groups" if m.top_groups < m.num_groups else ""
    routing += " (by each one's best)" if routing and m.group_max else ""
    routing += ", biased choice" if m.score_bias is not None else ""
    routing += f", weights × {m.routed_scale:g}" if m.routed_scale != 1.0 else ""
    shared = (
        (" + gated shared expert" if m.shared_gate is not None else " + shared expert") if m.shared else ""
    )
    return (
        f"{m.num_experts} experts, top-{m.top_k} per token ({weights} weights{routing}), d_ff "
        f"{m.experts.d_ff}{shared}"
    )


def _linear(m: nn.Linear, **_: Any) -> str:
    return f"{m.in_features} → {m.out_features}" + ("" if m.bias is not None else ", no bias")


def _embedding(m: nn.Embedding, *, paths: dict[int, str], tied: dict[int, str], **_: Any) -> str:
    text = f"{m.num_embeddings:,} × {m.embedding_dim}"
    return text + (f", also the output matrix of {tied[id(m)]} (tied)" if id(m) in tied else "")


def _head(m: LMHead | MLMHead, *, paths: dict[int, str], **_: Any) -> str:
    if m._tied_to:
        vocab, width = m._tied_to[0].weight.shape
        text = f"tied: reads {paths[id(m._tied_to[0])]}.weight ({vocab:,} × {width}), no own output matrix"
    else:
        vocab, width = m.output_weight.shape  # untied: its own ``weight``
        text = f"own output matrix {vocab:,} × {width}"
    if getattr(m, "rescale", 1.0) != 1.0:
        text += f", hidden × {m.rescale:.4g} before the tied matrix"
    if getattr(m, "final_logits_bias", None) is not None:
        text += ", final_logits_bias buffer (not trained)"
    if getattr(m, "scale", None) is not None:
        text += f", logits × {m.scale:g}"
    if getattr(m, "softcap", None) is not None:
        text += f", logits soft-capped at {m.softcap:g}"
    return text


def _stack(m: Stack, **_: Any) -> str:
    first = m.layers[0]
    norm = (
        "post-norm"
        if not first.pre_norm
        else "post-sublayer norm"
        if not first.input_norm
        else "sandwich-norm"
        if first.ffn_post_norm is not None
        else "pre-norm"
    )
    nope = [i for i, unrotated in enumerate(m.unrotated) if unrotated]
    no_rope = f", no rotary in layers {', '.join(map(str, nope))}" if nope else ""
    residual = ", parallel (one shared norm)" if first.shared_norm else ", parallel" if first.parallel else ""
    return f"{m.num_layers} layers, {'causal' if m.causal else 'bidirectional'}, {norm}{residual}{no_rope}"


def _layer(m: Layer, **_: Any) -> str:
    branches = ["self-attn", *(["cross-attn"] if m.cross_attn is not None else []), "ffn"]
    return " → ".join(branches)


def _norm(m: nn.LayerNorm | RMSNorm, **_: Any) -> str:
    dim = m.dim if isinstance(m, RMSNorm) else m.normalized_shape[0]  # RMSNorm may have no weight
    offset = " × (1 + weight)" if getattr(m, "unit_offset", False) else ""
    return f"{'RMSNorm' if isinstance(m, RMSNorm) else 'LayerNorm'}({dim}), eps {m.eps:g}{offset}"


def _patches(m: PatchEmbedding, **_: Any) -> str:
    p, grid = m.patch_size, m.grid
    tokens = grid**2 + int(m.cls_token is not None)
    cls = " + class token" if m.cls_token is not None else ""
    positions = ", learned positions" if m.positions is not None else ""
    return f"{grid * p}px images in {grid}×{grid} patches of {p}px{cls} = {tokens} tokens{positions}"


def _dual(m: DualEncoderModel, **_: Any) -> str:
    own = "logit_scale" + (", logit_bias" if m.logit_bias is not None else "")
    return f"dual-encoder; own parameters: {own}"  # the scalars the tree's children do not show


DESCRIBERS: tuple[tuple[type | tuple[type, ...], Callable[..., str]], ...] = (
    (Attention, _attention),
    (LatentAttention, _latent),
    (FeedForward, _ffn),
    (nn.Linear, _linear),
    (MoEFeedForward, _moe),
    (StackedLinear, lambda m, **_: f"{m.num} × ({m.in_features} → {m.out_features}), no bias"),
    (nn.Embedding, _embedding),
    ((LMHead, MLMHead), _head),
    (Stack, _stack),
    (Layer, _layer),
    ((nn.LayerNorm, RMSNorm), _norm),
    (TokenEmbedding, lambda m, **_: "× √d_model" if m.scale != 1.0 else ""),
    (SinusoidalPositions, lambda m, **_: f"sinusoidal ({m.layout}), fixed {m.max_positions} × {m.dim} table"),
    (
        LearnedPositions,
        lambda m, **_: f"learned, {m.weight.shape[0]} × {m.weight.shape[1]} (offset {m.offset})",
    ),
    (
        RotaryPositions,
        lambda m, **_: (
            f"rotary, θ {m.theta:g}"
            + (f", {m.scaling.type} scaling × {m.scaling.factor:g}" if hasattr(m.scaling, "factor") else "")
            + (
                f", {m.scaling.type} scaling"
                if m.scaling is not None and m.scaling.type == "longrope"
                else ""
            )
            + (f" (sliding-window layers: θ {m.local_theta:g})" if m.local_theta is not None else "")
            + f", head_dim {m.head_dim}, applied to q and k"
        ),
    ),
    (
        RelativeBias,
        lambda m, **_: (
            f"T5 relative bias, {m.num_buckets} buckets × {m.weight.shape[-1]} heads, "
            f"{'bi' if m.bidirectional else 'uni'}directional, "
            f"{f'one table per layer ({m.weight.shape[0]})' if m.per_layer else 'one table for all layers'}"
        ),
    ),
    (AlibiBias, lambda m, **_: f"ALiBi, {m.num_heads} fixed slopes"),
    (NoPositions, lambda m, **_: "no positions"),
    (Pooler, lambda m, **_: "tanh(dense(hidden[:, 0]))"),
    (PatchEmbedding, _patches),
    (DualEncoderModel, _dual),
    (AttentionPoolingHead, lambda m, **_: "MAP pooling: a learned probe query attends to all tokens, + MLP"),
    (ClassificationHead, lambda m, **_: f"{m.out_proj.out_features} labels"),
    (ReplacedTokenHead, lambda m, **_: "one logit per token: replaced or original (ELECTRA)"),
)


def describe(module: nn.Module, **context: Any) -> str:
    """One line of settings for a module, '' for kinds without any (dropout, activations, the model)."""
    for kinds, describer in DESCRIBERS:
        if isinstance(module, kinds):
            return describer(module, **context)
    spec = getattr(module, "spec", None)
    return f"{spec.family}" if spec is not None else ""
