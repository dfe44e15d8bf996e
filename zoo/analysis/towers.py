"""A dual encoder's parts for `zoo show`: the vision tower, the text tower and the heads that join them.

    vision tower   the image encoder (patch front-end, its stack and final norm)   = transformers' vision_model
    text tower     token embedding, text stack and final norm                      = CLIP's text_model
    heads          image pooling (SigLIP's MAP head), text head (SigLIP), the projections, logit scale (+ bias)

The three counts are disjoint and sum to ``model.num_parameters()``: 151,277,313 for clip-vit-base-patch32 and
203,155,970 for siglip-base-patch16-224, transformers' CLIPModel and SiglipModel. (transformers files SigLIP's
pooling heads under each tower's ``head``; they are counted here under heads, with CLIP's projections.)
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from torch import nn

from zoo.models.dual_encoder import DualEncoderModel
from zoo.spec import DualEncoderSpec, PatchEmbeddingSpec, ResolvedStack


@dataclass(frozen=True)
class Part:
    """One part of a model: its name, distinct parameters and settings in one line."""

    name: str
    params: int
    detail: str


def _count(params: Iterable[nn.Parameter | None]) -> int:
    return sum(p.numel() for p in {id(p): p for p in params if p is not None}.values())


def _modules(*modules: nn.Module | None) -> list[nn.Parameter]:
    return [p for m in modules if m is not None for p in m.parameters()]


def _stack(stack: ResolvedStack, *, d_model: int) -> str:
    att, d_ff = stack.attention, getattr(stack.ffn, "d_ff", None)
    ffn = f", d_ff {d_ff}" if d_ff is not None else ""
    return (
        f"{stack.num_layers} layers, {'causal' if stack.causal else 'bidirectional'}, width {d_model}, "
        f"{att.num_heads} heads × {att.resolved_head_dim(d_model)}{ffn}"
    )


def dual_encoder_parts(model: nn.Module) -> tuple[Part, ...]:
    """(vision tower, text tower, heads) of a built `DualEncoderModel`; () for any other model."""
    if not isinstance(model, DualEncoderModel):
        return ()
    spec = model.spec
    vision, patches = spec.vision, spec.vision.embedding
    assert isinstance(patches, PatchEmbeddingSpec)  # DualEncoderSpec requires an image front-end
    cls = " + class token" if patches.class_token else ""
    image = (
        f"{patches.image_size}px images in {patches.grid}×{patches.grid} patches of {patches.patch_size}px"
        f"{cls} = {patches.num_tokens} tokens"
    )
    text = spec.stacks()["text"]
    vision_part = Part(
        "vision tower",
        _count(_modules(model.vision)),
        f"{_stack(vision.stacks()['encoder'], d_model=vision.d_model)}; {image}",
    )
    text_part = Part(
        "text tower",
        _count(_modules(model.embed, model.text)),
        f"{_stack(text, d_model=spec.d_model)}; vocab {spec.vocab_size:,}, up to {spec.max_positions} tokens",
    )
    towers = {id(p) for p in _modules(model.vision, model.embed, model.text)}
    rest = [p for p in model.parameters() if id(p) not in towers]
    return (vision_part, text_part, Part("heads", _count(rest), _heads(model, spec)))


def _heads(model: DualEncoderModel, spec: DualEncoderSpec) -> str:
    heads, C_v = spec.heads, spec.vision.d_model
    pool = model.image_pool  # SigLIP's MAP head; None for CLIP's class token
    if pool is not None:
        image = (
            f"attention pooling (learned probe, {pool.attn.num_heads} heads, MLP d_ff {pool.mlp.d_ff}: "
            f"{_count(_modules(pool)):,})"
        )
    else:
        image = "class token"
    text = {"eos_token": "first eos token", "max_token_id": "largest token id", "last_token": "last token"}
    parts = [f"image pooling: {image}", f"text pooling: {text[heads.text_pooling.kind]}"]
    if model.text_head is not None:
        parts.append(f"text head {spec.d_model} → {spec.text_dim} ({_count(_modules(model.text_head)):,})")
    projection = heads.projection
    if projection is not None:
        bias = "" if projection.bias else ", no bias"
        count = _count(_modules(model.visual_projection, model.text_projection))
        parts.append(
            f"projections {C_v} → {projection.dim} and {spec.text_dim} → {projection.dim}{bias} ({count:,})"
        )
    else:
        parts.append(f"no projections (both towers end at width {spec.embed_dim})")
    scale = (
        f"logit scale exp({heads.logit_scale_init:g}) = {math.exp(heads.logit_scale_init):.4g} at init (1)"
    )
    parts.append(
        scale
        + (f", logit bias {heads.logit_bias_init:g} at init (1)" if model.logit_bias is not None else "")
    )
    return f"{'; '.join(parts)}; {heads.loss} loss"
