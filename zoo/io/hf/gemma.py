"""The Gemma family: ``gemma``, ``gemma2`` and ``gemma3_text`` (``*ForCausalLM`` and headless models).

After transformers' ``models/{gemma,gemma2,gemma3}/modeling_*.py``. Every Gemma is a Llama-shaped decoder
with RMSNorms that scale by (1 + weight) (`NormSpec.unit_offset`), token embeddings scaled by √d_model
(`EmbeddingSpec.scale`), a GeGLU feed-forward with tanh GELU and a free ``head_dim``; tied heads. What the
three add is a `Variant` row, never a branch on a name:

    model_type   norms     logit scale               soft-capping           layers                q/k norm
    gemma        pre       1/√head_dim               -                      all causal            -
    gemma2       sandwich  query_pre_attn_scalar^-½  attention + final      layer_types           -
    gemma3_text  sandwich  query_pre_attn_scalar^-½  final only             layer_types, local    (1 + w)
                                                                             rope base

``sandwich`` (`NormSpec.placement`): input_layernorm / post_attention_layernorm around attention,
pre_/post_feedforward_layernorm around the MLP. ``layer_types`` ↔ ``decoder.pattern`` (all alike) or
``decoder.layer_patterns`` (Gemma's alternation), a sliding layer being ``{kind: sliding_window, window:
sliding_window}`` (the same convention: W keys, the query's own included). Windows are kept even when longer
than the context, so a layer's type survives a round trip. Gemma 3's sliding layers rotate with their own
base (``rope_parameters.sliding_attention.rope_theta``, 4.x's ``rope_local_base_freq``) ↔
`RotaryPositions.local_theta`; its global layers take ``full_attention``'s, scaling included.

transformers 5 computes no attention soft-capping in Gemma 3 (``attn_logit_softcapping`` is read into the
config and never applied), so zoo ignores that key for ``gemma3_text`` as transformers does, and exports
none. Refused: ``use_bidirectional_attention`` (the embedding models), Gemma 3's multimodal ``gemma3``
(only its text model, ``gemma3_text`` / Gemma3ForCausalLM, is in scope) and a scaled local rotary other
than the global one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from zoo.io.hf.common import (
    ACTIVATIONS_TO_HF,
    FamilyMapping,
    HFError,
    Rule,
    activation_from_hf,
    decoder_converters,
    fused_linear,
    has_lm_head,
    layernorm,
    linear,
    rename,
    require,
    token_id,
)
from zoo.io.hf.llama import FULL, SLIDING, layer_windows
from zoo.io.hf.rope import as_rotary, layer_rope, legacy_scaling, local_rope, rope_from_config, rope_to_config
from zoo.spec import DecoderSpec, ModelSpec, ResolvedStack, RotaryPositions, parse_spec
from zoo.spec.errors import short_repr
from zoo.spec.limits import LAYERS

PREFIX = "model."


@dataclass(frozen=True)
class Variant:
    """What one ``model_type`` of the family can say.

    activation_key: the config key of the MLP's activation. sandwich: four norms per layer. softcap:
    ``attention`` (attn_logit_softcapping and final_logit_softcapping) or ``final`` only. layered: per-layer
    ``layer_types`` with ``sliding_window``, ``query_pre_attn_scalar``; local_rope: Gemma 3's per-layer-type
    rotary bases and q/k norms. pattern: the sliding-window period of the default ``layer_types``;
    pattern_key: the config key that may change it (Gemma 3's ``sliding_window_pattern``; Gemma 2's
    config class ignores that key, its period is 2).
    """

    model_type: str
    headed: str
    headless: str
    activation_key: str
    sandwich: bool
    softcap: Literal["none", "attention", "final"]
    layered: bool
    local_rope: bool
    pattern: int = 0
    pattern_key: str | None = None
    defaults: dict[str, Any] = field(default_factory=dict)


# Each transformers config class's defaults, for keys a config.json may leave out.
_COMMON = {
    "vocab_size": 256000, "rms_norm_eps": 1e-6, "pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 2,
    "tie_word_embeddings": True, "attention_bias": False, "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh",
    "hidden_act": "gelu_pytorch_tanh",
}  # fmt: skip
VARIANTS = (
    Variant(
        "gemma", "GemmaForCausalLM", "GemmaModel", "hidden_act", sandwich=False, softcap="none", layered=False,
        local_rope=False,
        defaults={**_COMMON, "hidden_size": 3072, "intermediate_size": 24576, "num_hidden_layers": 28,
                  "num_attention_heads": 16, "num_key_value_heads": 16, "max_position_embeddings": 8192},
    ),
    Variant(
        "gemma2", "Gemma2ForCausalLM", "Gemma2Model", "hidden_activation", sandwich=True, softcap="attention",
        layered=True, local_rope=False, pattern=2,
        defaults={**_COMMON, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
                  "num_attention_heads": 8, "num_key_value_heads": 4, "max_position_embeddings": 8192,
                  "query_pre_attn_scalar": 256, "sliding_window": 4096, "final_logit_softcapping": 30.0,
                  "attn_logit_softcapping": 50.0},
    ),
    Variant(
        "gemma3_text", "Gemma3ForCausalLM", "Gemma3TextModel", "hidden_activation", sandwich=True,
        softcap="final", layered=True, local_rope=True, pattern=6, pattern_key="sliding_window_pattern",
        defaults={**_COMMON, "vocab_size": 262208, "hidden_size": 2304, "intermediate_size": 9216,
                  "num_hidden_layers": 26, "num_attention_heads": 8, "num_key_value_heads": 4,
                  "max_position_embeddings": 131072, "query_pre_attn_scalar": 256, "sliding_window": 4096,
                  "final_logit_softcapping": None},
    ),
)  # fmt: skip
# Gemma's own name for the tanh GELU (the same function zoo's gelu_tanh computes, by the same kernel)
_ACTIVATIONS_TO_HF = {**ACTIVATIONS_TO_HF, "gelu_tanh": "gelu_pytorch_tanh"}
_GEMMA3_THETA = {"global": 1_000_000.0, "local": 10_000.0}  # Gemma3TextConfig.default_theta


# -- config -> spec ----------------------------------------------------------------------------------------


def config_to_spec(variant: Variant, config: dict[str, Any], names: set[str]) -> ModelSpec:
    def get(key: str) -> Any:
        return config.get(key, variant.defaults.get(key))

    if config.get("use_bidirectional_attention"):
        raise HFError(
            f"config.json use_bidirectional_attention={config['use_bidirectional_attention']!r} is not supported: "
            f"zoo imports {variant.model_type} as a causal decoder (the bidirectional variant is an encoder)"
        )
    has_head = has_lm_head(config, names, headed=variant.headed, prefix=PREFIX)
    d_model, vocab, num_heads = get("hidden_size"), get("vocab_size"), get("num_attention_heads")
    eps, head_dim = get("rms_norm_eps"), get("head_dim")
    free_head_dim = head_dim if head_dim and num_heads and head_dim != d_model // num_heads else None
    resolved_head_dim = head_dim or (d_model // num_heads if num_heads else None)
    scalar = get("query_pre_attn_scalar") if variant.layered else None
    if scalar is not None and (
        not isinstance(scalar, int | float) or isinstance(scalar, bool) or scalar <= 0
    ):
        raise HFError(
            f"config.json query_pre_attn_scalar={short_repr(scalar)}: a positive number is expected"
        )
    attn_softcap = get("attn_logit_softcapping") if variant.softcap == "attention" else None
    final_softcap = get("final_logit_softcapping") if variant.softcap != "none" else None
    windows = _windows_from_config(variant, config, get)
    position = _rope_from_config(variant, config)
    activation = get(variant.activation_key)
    if variant.model_type == "gemma" and activation == "gelu":
        activation = "gelu_pytorch_tanh"  # GemmaConfig: the released configs' "gelu" means the tanh form
    return parse_spec({
        "family": "decoder",
        "vocab_size": vocab,
        "d_model": d_model,
        "num_layers": get("num_hidden_layers"),
        "max_positions": get("max_position_embeddings"),
        "attention": {
            "num_heads": num_heads,
            "num_kv_heads": get("num_key_value_heads") or num_heads,
            "head_dim": free_head_dim,
            "bias": get("attention_bias"),
            "scale": scalar**-0.5 if scalar is not None and scalar != resolved_head_dim else None,
            "softcap": attn_softcap,
            "qk_norm": variant.local_rope,
            **({"qk_norm_eps": eps} if variant.local_rope else {}),
            "dropout": config.get("attention_dropout", 0.0),
        },
        "ffn": {
            "d_ff": get("intermediate_size"),
            "activation": activation_from_hf(activation, field=variant.activation_key),
            "gated": True,
            "bias": False,
        },
        "norm": {
            "kind": "rmsnorm", "eps": eps, "placement": "sandwich" if variant.sandwich else "pre",
            "unit_offset": True,
        },
        "position": position,
        "embedding": {"scale": True},
        "decoder": _patterns_spec(windows),
        "lm_head": {"tied": get("tie_word_embeddings"), "softcap": final_softcap} if has_head else None,
        "dropout": 0.0,
        "init": {"std": config.get("initializer_range", 0.02)},
        "pad_token_id": token_id(config, "pad_token_id", vocab, variant.defaults["pad_token_id"]),
        "bos_token_id": token_id(config, "bos_token_id", vocab, variant.defaults["bos_token_id"]),
        "eos_token_id": token_id(config, "eos_token_id", vocab, variant.defaults["eos_token_id"]),
    })  # fmt: skip


def _windows_from_config(variant: Variant, config: dict[str, Any], get: Any) -> list[int | None]:
    """Per layer: its sliding window, or None for full causal attention (transformers' own defaults)."""
    num_layers = get("num_hidden_layers")
    if not isinstance(num_layers, int) or not 1 <= num_layers <= LAYERS.value:
        raise HFError(
            f"config.json num_hidden_layers={short_repr(num_layers)} must be in [1, {LAYERS.value:,}] "
            f"({LAYERS.env} raises it)"
        )
    if not variant.layered:
        return [None] * num_layers
    types = config.get("layer_types")
    if types is None:  # transformers: every `pattern`-th layer global, the others sliding
        period = config.get(variant.pattern_key, variant.pattern) if variant.pattern_key else variant.pattern
        types = [SLIDING if (i + 1) % period else FULL for i in range(num_layers)]
    if (
        not isinstance(types, list)
        or len(types) != num_layers
        or any(t not in (FULL, SLIDING) for t in types)
    ):
        raise HFError(
            f"config.json layer_types must list {num_layers} entries of {FULL!r} / {SLIDING!r} "
            f"(num_hidden_layers={num_layers})"
        )
    window = get("sliding_window")
    if SLIDING in types and (not isinstance(window, int) or isinstance(window, bool) or window < 1):
        raise HFError(
            f"config.json sliding_window={short_repr(window)}: layer_types has 'sliding_attention' layers, "
            "which need a positive number of keys"
        )
    return [window if kind == SLIDING else None for kind in types]


def _patterns_spec(windows: list[int | None]) -> dict[str, Any]:
    """``decoder:`` overrides: none (all causal), one ``pattern``, or ``layer_patterns``. Windows longer than
    the context are kept: a sliding layer stays one (Gemma 3 rotates it with its own base)."""
    if all(w is None for w in windows):
        return {}
    if len(set(windows)) == 1:
        return {"pattern": {"kind": "sliding_window", "window": windows[0]}}
    return {
        "layer_patterns": [
            {"kind": "causal"} if w is None else {"kind": "sliding_window", "window": w} for w in windows
        ]
    }


def _rope_from_config(variant: Variant, config: dict[str, Any]) -> dict[str, Any]:
    """The ``position`` sub-spec; Gemma 3's two rotary settings (per layer type) as theta + local_theta."""
    if not variant.local_rope:
        return rope_from_config(config)
    params = config.get("rope_parameters")
    if params is not None and not (isinstance(params, Mapping) and set(params) <= {FULL, SLIDING}):
        raise HFError(
            f"config.json rope_parameters must map {FULL!r} and {SLIDING!r} to rotary settings (Gemma 3 keys "
            f"them by layer type), got {short_repr(params)}"
        )
    scaling = legacy_scaling(config)
    full, local = layer_rope(params, FULL, scaling), layer_rope(params, SLIDING, {})
    full.setdefault("rope_theta", config.get("rope_theta", _GEMMA3_THETA["global"]))
    local.setdefault("rope_theta", config.get("rope_local_base_freq", _GEMMA3_THETA["local"]))
    where = "rope_scaling" if scaling else f"rope_parameters.{FULL}"
    return local_rope(full, local, where=where, local_where=f"rope_parameters.{SLIDING}")


# -- spec -> config ----------------------------------------------------------------------------------------


def spec_to_config(variant: Variant, spec: ModelSpec) -> dict[str, Any]:
    family = variant.model_type
    require(family, [("family", spec.family, "decoder")])
    assert isinstance(spec, DecoderSpec)
    stack = spec.stacks()["decoder"]
    attention, ffn, norm, head = stack.attention, stack.ffn, stack.norm, spec.lm_head
    position = as_rotary(stack.position)
    config = {
        "model_type": family,
        "architectures": [variant.headed if head else variant.headless],
        "vocab_size": spec.vocab_size,
        "hidden_size": spec.d_model,
        "intermediate_size": ffn.d_ff,
        "num_hidden_layers": stack.num_layers,
        "num_attention_heads": attention.num_heads,
        "num_key_value_heads": attention.kv_heads,
        "head_dim": attention.resolved_head_dim(spec.d_model),
        variant.activation_key: _ACTIVATIONS_TO_HF[ffn.activation],
        "max_position_embeddings": spec.max_positions,
        "rms_norm_eps": norm.eps,
        "attention_bias": attention.bias,
        "attention_dropout": attention.dropout,
        "initializer_range": spec.init.std,
        "tie_word_embeddings": head.tied if head else True,
        "pad_token_id": spec.pad_token_id,
        "bos_token_id": spec.bos_token_id,
        "eos_token_id": spec.eos_token_id,
        **_rope_to_config(variant, position),
    }
    if variant.layered:
        config["query_pre_attn_scalar"] = _query_pre_attn_scalar(attention.resolved_scale(spec.d_model))
        config |= _windows_to_config(variant, stack)
    if variant.softcap != "none":
        config["final_logit_softcapping"] = head.softcap if head else None
    if variant.softcap == "attention":
        config["attn_logit_softcapping"] = attention.softcap
    if variant.softcap == "final":
        config["attn_logit_softcapping"] = None  # transformers' Gemma 3 would not apply it anyway
    return config


def _query_pre_attn_scalar(scale: float) -> float | int:
    """The ``query_pre_attn_scalar`` whose ``** -0.5`` is ``scale``: a whole number where one gives it back
    exactly (Gemma's 256, 224), else scale ** -2 (the read-back check refuses what does not return)."""
    exact = scale**-2
    whole = round(exact)
    return whole if whole > 0 and whole**-0.5 == scale else exact


def _rope_to_config(variant: Variant, position: RotaryPositions) -> dict[str, Any]:
    if not variant.local_rope:  # one base for every layer: a local_theta reads back as none
        return rope_to_config(position)
    fields = rope_to_config(position)
    full = fields["rope_parameters"]
    local = (
        dict(full)  # no local base: the local layers rotate as the global ones, scaling included
        if position.local_theta is None
        else {"rope_type": "default", "rope_theta": position.local_theta}
    )
    return {  # 5.x's rope_parameters by layer type; 4.x's top-level keys agree with them
        "rope_theta": position.theta,
        "rope_local_base_freq": local["rope_theta"],
        "rope_scaling": fields["rope_scaling"],
        "rope_parameters": {FULL: full, SLIDING: local},
    }


def _windows_to_config(variant: Variant, stack: ResolvedStack) -> dict[str, Any]:
    """``layer_types`` and the one ``sliding_window`` for the stack's per-layer patterns."""
    family, windows = variant.model_type, layer_windows(stack)
    sizes = sorted({w for w in windows if w is not None})
    if len(sizes) > 1:
        where = f"{stack.name}.layer_patterns" if stack.layer_patterns is not None else stack.pattern_path()
        raise HFError(
            f"{family} cannot express {where} with windows {sizes}: Hugging Face {family} has one "
            "sliding_window for all its sliding layers"
        )
    return {
        "sliding_window": sizes[0] if sizes else None,
        "layer_types": [FULL if w is None else SLIDING for w in windows],
        "use_bidirectional_attention": False,
    }


# -- tensors -----------------------------------------------------------------------------------------------


def _rules(spec: DecoderSpec, prefix: str) -> list[Rule]:
    """zoo <-> HF names; body names carry ``prefix`` (``model.`` under ``*ForCausalLM``)."""
    stack = spec.stacks()["decoder"]
    attention, sandwich = stack.attention, stack.norm.placement == "sandwich"
    H, K = attention.num_heads, attention.kv_heads
    D, F = attention.resolved_head_dim(spec.d_model), stack.ffn.d_ff
    rules = [
        rename("embed.tokens.weight", f"{prefix}embed_tokens.weight"),
        *layernorm("decoder.final_norm", f"{prefix}norm", bias=False),
    ]
    for i in range(stack.num_layers):
        zoo, hf = f"decoder.layers.{i}", f"{prefix}layers.{i}"
        attn, mlp = f"{hf}.self_attn", f"{hf}.mlp"
        rules += [
            *fused_linear(
                f"{zoo}.self_attn.qkv_proj",
                [f"{attn}.{n}_proj" for n in "qkv"],
                (H * D, K * D, K * D),
                bias=attention.bias,
            ),
            *linear(f"{zoo}.self_attn.out_proj", f"{attn}.o_proj", bias=attention.bias),
            *fused_linear(f"{zoo}.ffn.up_proj", [f"{mlp}.gate_proj", f"{mlp}.up_proj"], (F, F), bias=False),
            *linear(f"{zoo}.ffn.down_proj", f"{mlp}.down_proj", bias=False),
            rename(f"{zoo}.self_attn_norm.weight", f"{hf}.input_layernorm.weight"),
        ]
        if sandwich:
            rules += [
                rename(f"{zoo}.self_attn_post_norm.weight", f"{hf}.post_attention_layernorm.weight"),
                rename(f"{zoo}.ffn_norm.weight", f"{hf}.pre_feedforward_layernorm.weight"),
                rename(f"{zoo}.ffn_post_norm.weight", f"{hf}.post_feedforward_layernorm.weight"),
            ]
        else:
            rules.append(rename(f"{zoo}.ffn_norm.weight", f"{hf}.post_attention_layernorm.weight"))
        if attention.qk_norm:
            rules += [
                rename(f"{zoo}.self_attn.q_norm.weight", f"{attn}.q_norm.weight"),
                rename(f"{zoo}.self_attn.k_norm.weight", f"{attn}.k_norm.weight"),
            ]
    if spec.lm_head is not None and not spec.lm_head.tied:
        rules.append(rename("lm_head.weight", "lm_head.weight"))
    return rules


hf_to_zoo, zoo_to_hf = decoder_converters(_rules, prefix=PREFIX)


def _mapping(variant: Variant) -> FamilyMapping:
    def to_spec(config: dict[str, Any], names: set[str]) -> ModelSpec:
        return config_to_spec(variant, config, names)

    def to_config(spec: ModelSpec) -> dict[str, Any]:
        return spec_to_config(variant, spec)

    return FamilyMapping(
        model_types=(variant.model_type,),
        config_to_spec=to_spec,
        spec_to_config=to_config,
        hf_to_zoo=hf_to_zoo,
        zoo_to_hf=zoo_to_hf,
    )


def _multimodal(config: dict[str, Any], names: set[str]) -> ModelSpec:
    raise HFError(
        "config.json model_type 'gemma3' is Gemma 3's multimodal model (text_config + vision_config); zoo "
        "imports its text model only: a checkpoint with model_type 'gemma3_text' (Gemma3ForCausalLM)"
    )


def _not_multimodal(spec: ModelSpec) -> dict[str, Any]:
    raise HFError(  # fields: ranked with the other model families, farthest (`closeness`)
        "gemma3 (multimodal) is not an export target: zoo writes Gemma 3 as gemma3_text", fields=("family",)
    )


def _unused(tensors: Any, spec: ModelSpec) -> Any:  # never reached: the config is refused first
    raise HFError("gemma3 (multimodal) checkpoints are not supported; use gemma3_text")


# In this order `to_hf` tries them: the plainest format that can express a spec wins.
MAPPINGS = [_mapping(variant) for variant in VARIANTS] + [
    FamilyMapping(
        model_types=("gemma3",),
        config_to_spec=_multimodal,
        spec_to_config=_not_multimodal,
        hf_to_zoo=_unused,
        zoo_to_hf=_unused,
    )
]
