"""CLIP and SigLIP: ``clip`` (CLIPModel) and ``siglip`` (SiglipModel), the dual encoders, as `Variant` rows.

transformers' ``models/clip/modeling_clip.py`` and ``models/siglip/modeling_siglip.py``: both towers are
pre-norm encoders with separate q/k/v matrices (fused into zoo's ``qkv_proj``), ``layer_norm1`` before
attention and ``layer_norm2`` before the MLP (``fc1``, ``fc2``), learned text positions from 0 and a final
norm on each tower. What the two differ in is data in their row:

    model_type  text mask   text pooled at                        image tower                     embeds
    clip        causal      first eos_token_id (eos 2: max id)    class token, pre_layrnorm,      projections,
                                                                  bias-free patches, quick_gelu   no bias
    siglip      padding     last position, + text_model.head      no class token, MAP head        the pooled ones;
                                                                  (vision_model.head)             + logit_bias

The config's ``text_config`` is the zoo spec's model-level text tower, its ``vision_config`` the ``vision``
image encoder (`zoo.spec.model.DualEncoderSpec`). CLIP's ``post_layernorm`` on the pooled class token is
the vision stack's final norm (the same pooled vector). SigLIP's MAP head keeps its query/key/value rows in
one ``in_proj_weight`` (nn.MultiheadAttention): zoo's cross-attention has ``q_proj`` and ``kv_proj``, split
here. SigLIP's config has no field for the logit scale's or bias's first values: they read back as the
paper's (log 10, -10).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from zoo.io.hf.common import (
    ACTIVATIONS_TO_HF,
    FamilyMapping,
    HFError,
    NamesOnly,
    Rule,
    StateDict,
    TypedConfig,
    activation_from_hf,
    fused_linear,
    json_kind,
    layernorm,
    linear,
    rename,
    require,
    rules_to_hf,
    rules_to_zoo,
    token_id,
)
from zoo.spec import DualEncoderSpec, EncoderSpec, ModelSpec, parse_spec
from zoo.spec.errors import short_repr

SIGLIP_LOGIT_SCALE, SIGLIP_LOGIT_BIAS = math.log(10.0), -10.0  # Zhai et al. 2023, 3.3 (no config field)
# Where zoo's image tower keeps its patch front-end (`zoo.blocks.patches.PatchEmbedding`)
_PATCHES = "vision.embed"


@dataclass(frozen=True)
class Variant:
    """One model type: its classes, its config classes' defaults (text and vision), and how it pools.

    clip: class token, pre_layrnorm, projections, eos pooling; else SigLIP's MAP head, last-token pooling and
    text head, a logit bias."""

    model_type: str
    architecture: str
    text_defaults: dict[str, Any]
    vision_defaults: dict[str, Any]
    clip: bool


CLIP = Variant(
    model_type="clip",
    architecture="CLIPModel",
    text_defaults={
        "vocab_size": 49408, "hidden_size": 512, "intermediate_size": 2048, "num_hidden_layers": 12,
        "num_attention_heads": 8, "max_position_embeddings": 77, "hidden_act": "quick_gelu",
        "layer_norm_eps": 1e-5, "attention_dropout": 0.0, "pad_token_id": 1, "bos_token_id": 49406,
        "eos_token_id": 49407,
    },
    vision_defaults={
        "hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12, "num_attention_heads": 12,
        "num_channels": 3, "image_size": 224, "patch_size": 32, "hidden_act": "quick_gelu",
        "layer_norm_eps": 1e-5, "attention_dropout": 0.0,
    },
    clip=True,
)  # fmt: skip
SIGLIP = Variant(
    model_type="siglip",
    architecture="SiglipModel",
    text_defaults={
        "vocab_size": 32000, "hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12,
        "num_attention_heads": 12, "max_position_embeddings": 64, "hidden_act": "gelu_pytorch_tanh",
        "layer_norm_eps": 1e-6, "attention_dropout": 0.0, "pad_token_id": 1, "bos_token_id": 49406,
        "eos_token_id": 49407,
    },
    vision_defaults={
        "hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12, "num_attention_heads": 12,
        "num_channels": 3, "image_size": 224, "patch_size": 16, "hidden_act": "gelu_pytorch_tanh",
        "layer_norm_eps": 1e-6, "attention_dropout": 0.0,
    },
    clip=False,
)  # fmt: skip


# -- config <-> spec ---------------------------------------------------------------------------------------


def _sub_config(config: dict[str, Any], key: str, defaults: dict[str, Any]) -> Callable[[str], Any]:
    """A reader of ``config[key]`` with the config class's defaults, each value's type checked against its
    default (`TypedConfig`)."""
    sub = config.get(key) or {}
    if not isinstance(sub, dict):
        raise HFError(f"config.json {key}: expected an object, got {json_kind(sub)}")
    typed = TypedConfig(sub)
    return lambda name: typed.get(name, defaults.get(name))


def _tower(get: Callable[[str], Any], where: str) -> dict[str, Any]:
    """The blocks both towers share: width, depth, attention, MLP, pre-norm."""
    return {
        "d_model": get("hidden_size"),
        "num_layers": get("num_hidden_layers"),
        "attention": {"num_heads": get("num_attention_heads"), "dropout": float(get("attention_dropout") or 0.0)},
        "ffn": {"d_ff": get("intermediate_size"), "activation": activation_from_hf(get("hidden_act"), field=f"{where}.hidden_act")},
        "norm": {"eps": get("layer_norm_eps"), "placement": "pre", "final": True},
        "dropout": 0.0,
    }  # fmt: skip


def config_to_spec(variant: Variant, config: dict[str, Any], names: set[str]) -> ModelSpec:
    text = _sub_config(config, "text_config", variant.text_defaults)
    vision = _sub_config(config, "vision_config", variant.vision_defaults)
    image_size, patch_size = vision("image_size"), vision("patch_size")
    if not isinstance(image_size, int) or not isinstance(patch_size, int):
        raise HFError(
            f"config.json vision_config: image_size ({short_repr(image_size)}) and patch_size "
            f"({short_repr(patch_size)}) must be integers (square images and patches)"
        )
    vocab_size = text("vocab_size")
    eos = token_id(
        config.get("text_config") or {}, "eos_token_id", vocab_size, variant.text_defaults["eos_token_id"]
    )
    grid = image_size // patch_size
    vision_spec: dict[str, Any] = {
        "family": "encoder",
        **_tower(vision, "vision_config"),
        "position": {"kind": "none"},
        "max_positions": grid * grid + int(variant.clip),
        "embedding": {
            "kind": "patches",
            "image_size": image_size,
            "patch_size": patch_size,
            "channels": vision("num_channels"),
            "class_token": variant.clip,
            "bias": not variant.clip,
            "norm": variant.clip,  # CLIP's pre_layrnorm
        },
    }
    spec: dict[str, Any] = {
        "family": "dual-encoder",
        "vocab_size": vocab_size,
        **_tower(text, "text_config"),
        "max_positions": text("max_position_embeddings"),
        "position": {"kind": "learned"},
        "pad_token_id": token_id(config.get("text_config") or {}, "pad_token_id", vocab_size, variant.text_defaults["pad_token_id"]),
        "bos_token_id": token_id(config.get("text_config") or {}, "bos_token_id", vocab_size, variant.text_defaults["bos_token_id"]),
        "eos_token_id": eos,
        "vision": vision_spec,
    }  # fmt: skip
    if variant.clip:
        raw_eos = (config.get("text_config") or {}).get("eos_token_id", variant.text_defaults["eos_token_id"])
        spec["text"] = {"pattern": {"kind": "causal"}}
        spec["heads"] = {
            "image_pooling": {"kind": "first_token"},
            # transformers' reading of the original configs' eos_token_id 2: the end-of-text is the largest id
            "text_pooling": {"kind": "max_token_id" if raw_eos == 2 else "eos_token"},
            "projection": {"dim": config.get("projection_dim", 512), "bias": False},
            "logit_scale_init": float(config.get("logit_scale_init_value", 2.6592)),
            "loss": "contrastive",
        }
    else:
        if not (config.get("vision_config") or {}).get("vision_use_head", True):
            raise HFError("config.json vision_config.vision_use_head=false: a SigLIP image tower without its "
                          "pooling head has no image embedding; zoo needs true")  # fmt: skip
        spec["heads"] = {
            "image_pooling": {"kind": "attention"},
            "text_pooling": {"kind": "last_token"},
            "text_head_dim": text("projection_size") or text("hidden_size"),
            "projection": None,
            "logit_scale_init": SIGLIP_LOGIT_SCALE,
            "logit_bias_init": SIGLIP_LOGIT_BIAS,
            "loss": "sigmoid",
        }
    return parse_spec(spec)


def spec_to_config(variant: Variant, spec: ModelSpec) -> dict[str, Any]:
    family = variant.model_type
    require(family, [("family", spec.family, "dual-encoder")])
    assert isinstance(spec, DualEncoderSpec)
    heads, vision = spec.heads, spec.vision
    patches = vision.embedding
    require(
        family,
        [
            ("vision.embedding.kind", patches.kind, "patches"),
            (
                "heads.image_pooling.kind",
                heads.image_pooling.kind,
                "first_token" if variant.clip else "attention",
            ),
            ("heads.projection", heads.projection is None, not variant.clip),
        ],
    )
    for name, act in (("ffn.activation", spec.ffn), ("vision.ffn.activation", vision.ffn)):
        require(family, [(name, getattr(act, "activation", None), tuple(ACTIVATIONS_TO_HF))])

    def tower(s: EncoderSpec | DualEncoderSpec) -> dict[str, Any]:
        stack = next(iter(s.stacks().values()))
        return {
            "hidden_size": s.d_model,
            "intermediate_size": getattr(stack.ffn, "d_ff", 0),
            "num_hidden_layers": stack.num_layers,
            "num_attention_heads": stack.attention.num_heads,
            "hidden_act": _act_to_hf(getattr(stack.ffn, "activation", "gelu")),
            "layer_norm_eps": stack.norm.eps,
            "attention_dropout": stack.attention.dropout,
        }

    text_config = tower(spec) | {
        "vocab_size": spec.vocab_size,
        "max_position_embeddings": spec.max_positions,
        "pad_token_id": spec.pad_token_id,
        "bos_token_id": spec.bos_token_id,
        "eos_token_id": 2 if heads.text_pooling.kind == "max_token_id" else spec.eos_token_id,
    }
    vision_config = tower(vision) | {
        "image_size": getattr(patches, "image_size", 224),
        "patch_size": getattr(patches, "patch_size", 16),
        "num_channels": getattr(patches, "channels", 3),
    }
    config: dict[str, Any] = {"model_type": family, "architectures": [variant.architecture]}
    if variant.clip:
        assert heads.projection is not None
        config |= {"projection_dim": heads.projection.dim, "logit_scale_init_value": heads.logit_scale_init}
        text_config["projection_dim"] = vision_config["projection_dim"] = heads.projection.dim
    else:
        text_config["projection_size"] = spec.text_dim
        vision_config["vision_use_head"] = True
    return config | {"text_config": text_config, "vision_config": vision_config}


def _act_to_hf(activation: str) -> str:
    # transformers' SigLIP checkpoints say gelu_pytorch_tanh (the same function as gelu_new)
    return "gelu_pytorch_tanh" if activation == "gelu_tanh" else ACTIVATIONS_TO_HF.get(activation, activation)


# -- tensors -----------------------------------------------------------------------------------------------


def _encoder_layers(zoo: str, hf: str, num_layers: int, d_model: int) -> list[Rule]:
    rules: list[Rule] = []
    for i in range(num_layers):
        z, h = f"{zoo}.layers.{i}", f"{hf}.encoder.layers.{i}"
        rules += fused_linear(
            f"{z}.self_attn.qkv_proj", [f"{h}.self_attn.{p}_proj" for p in "qkv"], [d_model] * 3
        )
        rules += linear(f"{z}.self_attn.out_proj", f"{h}.self_attn.out_proj")
        rules += layernorm(f"{z}.self_attn_norm", f"{h}.layer_norm1")
        rules += linear(f"{z}.ffn.up_proj", f"{h}.mlp.fc1")
        rules += linear(f"{z}.ffn.down_proj", f"{h}.mlp.fc2")
        rules += layernorm(f"{z}.ffn_norm", f"{h}.layer_norm2")
    return rules


def rules(variant: Variant, spec: DualEncoderSpec) -> list[Rule]:
    vision, heads = spec.vision, spec.heads
    C = vision.d_model
    table = [
        rename("embed.tokens.weight", "text_model.embeddings.token_embedding.weight"),
        rename("text.positions.weight", "text_model.embeddings.position_embedding.weight"),
        *_encoder_layers("text", "text_model", spec.stacks()["text"].num_layers, spec.d_model),
        *layernorm("text.final_norm", "text_model.final_layer_norm"),
        *linear(f"{_PATCHES}.proj", "vision_model.embeddings.patch_embedding", bias=not variant.clip),
        Rule(f"{_PATCHES}.positions", ("vision_model.embeddings.position_embedding.weight",),
             shape=(1, vision.max_positions, C)),
        *_encoder_layers("vision.encoder", "vision_model", vision.stacks()["encoder"].num_layers, C),
        *layernorm("vision.encoder.final_norm", "vision_model.post_layernorm"),
        rename("logit_scale", "logit_scale"),
    ]  # fmt: skip
    if variant.clip:
        assert heads.projection is not None
        table += [
            rename(f"{_PATCHES}.cls_token", "vision_model.embeddings.class_embedding"),
            *layernorm("vision.encoder.embed_norm", "vision_model.pre_layrnorm"),
            *linear("visual_projection", "visual_projection", bias=False),
            *linear("text_projection", "text_projection", bias=False),
        ]
    else:
        head = "vision_model.head"
        table += [
            *linear("text_head", "text_model.head"),
            rename("image_pool.probe", f"{head}.probe"),
            rename("image_pool.attn.q_proj.weight", f"{head}.attention.in_proj_weight.q"),
            rename("image_pool.attn.q_proj.bias", f"{head}.attention.in_proj_bias.q"),
            rename("image_pool.attn.kv_proj.weight", f"{head}.attention.in_proj_weight.kv"),
            rename("image_pool.attn.kv_proj.bias", f"{head}.attention.in_proj_bias.kv"),
            *linear("image_pool.attn.out_proj", f"{head}.attention.out_proj"),
            *layernorm("image_pool.norm", f"{head}.layernorm"),
            *linear("image_pool.mlp.up_proj", f"{head}.mlp.fc1"),
            *linear("image_pool.mlp.down_proj", f"{head}.mlp.fc2"),
            rename("logit_bias", "logit_bias"),
        ]
    return table


def hf_to_zoo(variant: Variant, tensors: StateDict, spec: ModelSpec) -> StateDict:
    assert isinstance(spec, DualEncoderSpec)
    tensors = dict(tensors)
    in_proj = "vision_model.head.attention.in_proj_"
    C = spec.vision.d_model
    for part in ("weight", "bias"):  # nn.MultiheadAttention's fused rows [q; k; v] -> zoo's q_proj, kv_proj
        fused = tensors.pop(f"{in_proj}{part}", None)
        if fused is not None:
            tensors[f"{in_proj}{part}.q"], tensors[f"{in_proj}{part}.kv"] = fused[:C], fused[C:]
    for name in ("logit_scale", "logit_bias"):
        if name in tensors:
            tensors[name] = tensors[name].reshape(())
    cls = "vision_model.embeddings.class_embedding"
    if cls in tensors:
        tensors[cls] = tensors[cls].reshape(1, 1, -1)
    return rules_to_zoo(rules(variant, spec), tensors)


def zoo_to_hf(variant: Variant, tensors: StateDict, spec: ModelSpec) -> StateDict:
    assert isinstance(spec, DualEncoderSpec)
    out = rules_to_hf(rules(variant, spec), tensors)
    in_proj = "vision_model.head.attention.in_proj_"
    for part in ("weight", "bias"):
        q, kv = out.pop(f"{in_proj}{part}.q", None), out.pop(f"{in_proj}{part}.kv", None)
        if q is not None and kv is not None:
            out[f"{in_proj}{part}"] = torch.cat([q, kv]) if not isinstance(tensors, NamesOnly) else q
    if not variant.clip:  # SigLIP stores both as (1,)
        for name in ("logit_scale", "logit_bias"):
            if name in out:
                out[name] = out[name].reshape(1) if not isinstance(tensors, NamesOnly) else out[name]
    cls = "vision_model.embeddings.class_embedding"
    if cls in out and not isinstance(tensors, NamesOnly):
        out[cls] = out[cls].reshape(-1).contiguous()
    return out


def _mapping(variant: Variant) -> FamilyMapping:
    return FamilyMapping(
        model_types=(variant.model_type,),
        config_to_spec=lambda config, names: config_to_spec(variant, config, names),
        spec_to_config=lambda spec: spec_to_config(variant, spec),
        hf_to_zoo=lambda tensors, spec: hf_to_zoo(variant, tensors, spec),
        zoo_to_hf=lambda tensors, spec: zoo_to_hf(variant, tensors, spec),
    )


MAPPINGS = [_mapping(CLIP), _mapping(SIGLIP)]
