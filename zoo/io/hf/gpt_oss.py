"""OpenAI's gpt-oss (``gpt_oss``: ``GptOssForCausalLM``, headless ``GptOssModel``), after transformers'
``models/gpt_oss/modeling_gpt_oss.py``.

A Llama-shaped decoder (pre-norm RMSNorm, rotate-half RoPE, GQA with biases on q/k/v/o) with three
options of its own, each a zoo spec option any stack may use:

    gpt-oss                              zoo
    self_attn.sinks (H,)                 attention.sinks: true -> self_attn.sinks
    layer_types + sliding_window         decoder.layer_patterns (sliding_window / causal), sliding first
    mlp.router (weight, bias)            ffn.router_bias -> ffn.router.{weight,bias}
    top-k logits -> softmax              ffn.normalize_top_k: true (the same weights)
    experts.gate_up_proj (E, C, 2F)      ffn.experts.up_proj.weight (E, 2F, C): HF's columns interleave
      + gate_up_proj_bias (E, 2F)          [g0 u0 g1 u1 ...]; zoo's rows are [gate; up], so both are
                                           de-interleaved (and the weight transposed) both ways
    experts.down_proj (E, F, C)          ffn.experts.down_proj.weight (E, C, F), transposed
      + down_proj_bias (E, C)              ffn.experts.down_bias
    swiglu_alpha, swiglu_limit           ffn.clamped_glu {alpha, limit}

Published checkpoints store the expert weights as MXFP4 (``gate_up_proj_blocks`` / ``_scales``, config
``quantization_config.quant_method: mxfp4``): they are dequantised on import (`zoo.io.hf.mxfp4`) into the
dtype of the layer's expert biases; an export writes plain weights and no ``quantization_config``.

gpt-oss's published rotary is YaRN (factor 32 over 4096 positions, theta 150000), read as
``position.scaling: {type: yarn}``; ``default``, ``llama3``, ``linear`` and ``dynamic`` configs import too. ``hidden_act`` is never read by transformers (the
clamped SwiGLU replaces it): zoo reads the experts' activation as silu and writes silu.
"""

from __future__ import annotations

from typing import Any

import torch

from zoo.io.hf.common import (
    FamilyMapping,
    HFError,
    NamesOnly,
    Rule,
    StateDict,
    decoder_converters,
    has_lm_head,
    layernorm,
    linear,
    rename,
    require,
    token_id,
)
from zoo.io.hf.llama import layer_windows
from zoo.io.hf.mxfp4 import dequantize_mxfp4
from zoo.io.hf.rope import (
    LONG_CONTEXT,
    max_positions_from_config,
    max_positions_to_config,
    rope_from_config,
    rope_to_config,
)
from zoo.spec import DecoderSpec, ModelSpec, MoESpec, parse_spec
from zoo.spec.limits import LAYERS

PREFIX = "model."
FULL, SLIDING = "full_attention", "sliding_attention"
# GptOssConfig's defaults, for keys a config.json may leave out
DEFAULTS: dict[str, Any] = {
    "num_hidden_layers": 36, "num_local_experts": 128, "vocab_size": 201088, "hidden_size": 2880,
    "intermediate_size": 2880, "head_dim": 64, "num_attention_heads": 64, "num_key_value_heads": 8,
    "sliding_window": 128, "tie_word_embeddings": False, "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5, "num_experts_per_tok": 4, "swiglu_alpha": 1.702, "swiglu_limit": 7.0,
    "attention_bias": True, "initializer_range": 0.02, "attention_dropout": 0.0,
}  # fmt: skip
# GptOssConfig's rotary when config.json has none: YaRN (refused by name until zoo runs it)
DEFAULT_ROPE = {
    "rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
    "original_max_position_embeddings": 4096, "rope_theta": 150000.0,
}  # fmt: skip
EXPERT_TENSORS = ("gate_up_proj", "down_proj")


# -- config <-> spec ---------------------------------------------------------------------------------------


def config_to_spec(config: dict[str, Any], names: set[str]) -> ModelSpec:
    def get(key: str) -> Any:
        return config.get(key, DEFAULTS.get(key))

    _check_quantization(config)
    has_head = has_lm_head(config, names, headed="GptOssForCausalLM", prefix=PREFIX)
    d_model, vocab, num_heads = get("hidden_size"), get("vocab_size"), get("num_attention_heads")
    head_dim, max_positions = get("head_dim") or d_model // num_heads, get("max_position_embeddings")
    rope = config if config.get("rope_parameters") or config.get("rope_scaling") else {
        **config, "rope_parameters": DEFAULT_ROPE,
    }  # fmt: skip
    if "rope_theta" not in rope and "rope_theta" not in (rope.get("rope_parameters") or {}):
        rope = {**rope, "rope_theta": DEFAULT_ROPE["rope_theta"]}
    windows = _windows_from_config(config, get)
    position = rope_from_config(
        rope, layer_types=config.get("layer_types"), kinds=LONG_CONTEXT, max_positions=max_positions
    )
    return parse_spec({
        "family": "decoder",
        "vocab_size": vocab,
        "d_model": d_model,
        "num_layers": get("num_hidden_layers"),
        "max_positions": max_positions_from_config(position, max_positions),
        "attention": {
            "num_heads": num_heads,
            "num_kv_heads": get("num_key_value_heads") or num_heads,
            "head_dim": head_dim if head_dim != d_model // num_heads else None,
            "bias": get("attention_bias"),
            "dropout": get("attention_dropout"),
            "sinks": True,
        },
        "ffn": {
            "kind": "moe",
            "num_experts": config.get("num_local_experts", config.get("num_experts", DEFAULTS["num_local_experts"])),
            "top_k": get("num_experts_per_tok"),
            "d_ff": get("intermediate_size"),
            "activation": "silu",
            "normalize_top_k": True,
            "router_bias": True,
            "expert_bias": True,
            "clamped_glu": {"alpha": get("swiglu_alpha"), "limit": get("swiglu_limit")},
        },
        "norm": {"kind": "rmsnorm", "eps": get("rms_norm_eps"), "placement": "pre"},
        "position": position,
        "decoder": _patterns_spec(windows, max_positions),
        "lm_head": {"tied": get("tie_word_embeddings")} if has_head else None,
        "dropout": 0.0,
        "init": {"std": get("initializer_range")},
        "pad_token_id": token_id(config, "pad_token_id", vocab),
        "bos_token_id": token_id(config, "bos_token_id", vocab),
        "eos_token_id": token_id(config, "eos_token_id", vocab),
    })  # fmt: skip


def _check_quantization(config: dict[str, Any]) -> None:
    quant = config.get("quantization_config")
    if quant is None:
        return
    method = quant.get("quant_method") if isinstance(quant, dict) else None
    if method != "mxfp4":
        raise HFError(
            f"config.json quantization_config.quant_method={method!r} is not supported for gpt_oss; "
            "zoo reads mxfp4 expert weights (dequantised) or plain ones"
        )


def _windows_from_config(config: dict[str, Any], get: Any) -> list[int | None]:
    """Per layer: its sliding window, or None (GptOssConfig: without layer_types, even layers slide)."""
    num_layers, window = get("num_hidden_layers"), get("sliding_window")
    if not isinstance(num_layers, int) or not 1 <= num_layers <= LAYERS.value:
        raise HFError(
            f"config.json num_hidden_layers={num_layers!r} must be in [1, {LAYERS.value:,}] ({LAYERS.env} raises it)"
        )
    types = config.get("layer_types") or [SLIDING if i % 2 == 0 else FULL for i in range(num_layers)]
    if (
        not isinstance(types, list)
        or len(types) != num_layers
        or any(t not in (FULL, SLIDING) for t in types)
    ):
        raise HFError(
            f"config.json layer_types must list {num_layers} entries of {FULL!r} / {SLIDING!r} "
            f"(num_hidden_layers={num_layers})"
        )
    if SLIDING in types and (not isinstance(window, int) or isinstance(window, bool) or window < 1):
        raise HFError(f"config.json sliding_window={window!r}: sliding layers need a positive number of keys")
    return [window if kind == SLIDING else None for kind in types]


def _patterns_spec(windows: list[int | None], max_positions: int) -> dict[str, Any]:
    """``decoder:`` overrides for per-layer windows (a window as long as the context never hides a key)."""
    windows = [w if w is not None and w < max_positions else None for w in windows]
    if all(w is None for w in windows):
        return {}
    if len(set(windows)) == 1:
        return {"pattern": {"kind": "sliding_window", "window": windows[0]}}
    return {
        "layer_patterns": [
            {"kind": "causal"} if w is None else {"kind": "sliding_window", "window": w} for w in windows
        ]
    }


def spec_to_config(spec: ModelSpec) -> dict[str, Any]:
    require("gpt_oss", [("family", spec.family, "decoder")])
    assert isinstance(spec, DecoderSpec)
    stack = spec.stacks()["decoder"]
    attention, ffn, head = stack.attention, stack.ffn, spec.lm_head
    assert isinstance(ffn, MoESpec)  # the mapping's ffn_kinds: a dense spec is refused before this
    glu = ffn.clamped_glu
    windows = layer_windows(stack)
    window = next((w for w in windows if w is not None), None)
    return {
        "model_type": "gpt_oss",
        "architectures": ["GptOssForCausalLM" if head else "GptOssModel"],
        "vocab_size": spec.vocab_size,
        "hidden_size": spec.d_model,
        "intermediate_size": ffn.d_ff,
        "num_hidden_layers": stack.num_layers,
        "num_attention_heads": attention.num_heads,
        "num_key_value_heads": attention.kv_heads,
        "head_dim": attention.resolved_head_dim(spec.d_model),
        "attention_bias": attention.bias,
        "attention_dropout": attention.dropout,
        "num_local_experts": ffn.num_experts,
        "num_experts_per_tok": ffn.top_k,
        # what transformers runs whatever the spec says; a spec without them reads back with them and the
        # export guard names the field (`faithful`)
        "swiglu_alpha": glu.alpha if glu else DEFAULTS["swiglu_alpha"],
        "swiglu_limit": glu.limit if glu else DEFAULTS["swiglu_limit"],
        "hidden_act": "silu",
        "max_position_embeddings": max_positions_to_config(stack.position, spec.max_positions),
        "rms_norm_eps": stack.norm.eps,
        **rope_to_config(stack.position, kinds=LONG_CONTEXT),
        # transformers builds the sliding mask even when no layer reads it: a window must be there
        "sliding_window": window if window is not None else DEFAULTS["sliding_window"],
        "layer_types": [FULL if w is None else SLIDING for w in windows],
        "initializer_range": spec.init.std,
        "tie_word_embeddings": head.tied if head else False,
        "pad_token_id": spec.pad_token_id,
        "bos_token_id": spec.bos_token_id,
        "eos_token_id": spec.eos_token_id,
    }


# -- tensors -----------------------------------------------------------------------------------------------


def _rules(spec: DecoderSpec, prefix: str) -> list[Rule]:
    """zoo <-> HF names; the expert tensors are renamed here, their layouts changed by `hf_to_zoo` /
    `zoo_to_hf` (HF's (E, C, 2F) interleaved columns against zoo's (E, 2F, C) [gate; up] rows)."""
    stack = spec.stacks()["decoder"]
    attention = stack.attention
    bias = attention.bias
    rules = [
        rename("embed.tokens.weight", f"{prefix}embed_tokens.weight"),
        *layernorm("decoder.final_norm", f"{prefix}norm", bias=False),
    ]
    for i in range(stack.num_layers):
        zoo, hf = f"decoder.layers.{i}", f"{prefix}layers.{i}"
        attn, mlp = f"{hf}.self_attn", f"{hf}.mlp"
        H, K = attention.num_heads, attention.kv_heads
        D = attention.resolved_head_dim(spec.d_model)
        rules += [
            Rule(f"{zoo}.self_attn.qkv_proj.weight", tuple(f"{attn}.{n}_proj.weight" for n in "qkv"), sizes=(H * D, K * D, K * D)),
            *([Rule(f"{zoo}.self_attn.qkv_proj.bias", tuple(f"{attn}.{n}_proj.bias" for n in "qkv"), sizes=(H * D, K * D, K * D))] if bias else []),
            *linear(f"{zoo}.self_attn.out_proj", f"{attn}.o_proj", bias=attention.has_out_bias),
            rename(f"{zoo}.self_attn.sinks", f"{attn}.sinks"),
            *linear(f"{zoo}.ffn.router", f"{mlp}.router"),
            rename(f"{zoo}.ffn.experts.up_proj.weight", f"{mlp}.experts.gate_up_proj"),
            rename(f"{zoo}.ffn.experts.up_bias", f"{mlp}.experts.gate_up_proj_bias"),
            rename(f"{zoo}.ffn.experts.down_proj.weight", f"{mlp}.experts.down_proj"),
            rename(f"{zoo}.ffn.experts.down_bias", f"{mlp}.experts.down_proj_bias"),
            *layernorm(f"{zoo}.self_attn_norm", f"{hf}.input_layernorm", bias=False),
            *layernorm(f"{zoo}.ffn_norm", f"{hf}.post_attention_layernorm", bias=False),
        ]  # fmt: skip
    if spec.lm_head is not None and not spec.lm_head.tied:
        rules.append(rename("lm_head.weight", "lm_head.weight"))
    return rules


def _gate_up_to_zoo(tensor: torch.Tensor, *, weight: bool) -> torch.Tensor:
    """HF gate_up_proj (E, C, 2F) or its bias (E, 2F), columns [g0 u0 g1 u1 ...] -> zoo (E, 2F, C) or
    (E, 2F), rows [gate; up]."""
    rows = tensor.transpose(1, 2) if weight else tensor  # (E, 2F, C) | (E, 2F), interleaved
    return torch.cat([rows[:, 0::2], rows[:, 1::2]], dim=1).contiguous()


def _gate_up_to_hf(tensor: torch.Tensor, *, weight: bool) -> torch.Tensor:
    """The inverse of `_gate_up_to_zoo`."""
    gate, up = tensor.chunk(2, dim=1)  # (E, F, ...) each
    rows = torch.stack([gate, up], dim=2).flatten(1, 2)  # (E, 2F, ...) interleaved
    return (rows.transpose(1, 2) if weight else rows).contiguous()


def _experts_to_zoo_layout(tensors: StateDict) -> StateDict:
    """HF's expert tensors (plain or MXFP4) in zoo's layouts, under their HF names (the rules rename them)."""
    out = dict(tensors)
    for name in [
        n for n in tensors if n.endswith(("experts.gate_up_proj_blocks", "experts.down_proj_blocks"))
    ]:
        base = name.removesuffix("_blocks")
        scales, bias = f"{base}_scales", f"{base}_bias"
        if scales not in out:
            raise HFError(f"{name} has no {scales} beside it: MXFP4 weights need both")
        dtype = out[bias].dtype if bias in out and out[bias].is_floating_point() else torch.bfloat16
        rows = dequantize_mxfp4(out.pop(name), out.pop(scales), dtype=dtype, name=base)  # (E, O, I)
        out[base] = rows.transpose(1, 2)  # HF's in-memory (E, I, O)
    for name in list(out):
        if name.endswith("experts.gate_up_proj"):
            out[name] = _gate_up_to_zoo(out[name], weight=True)
        elif name.endswith("experts.gate_up_proj_bias"):
            out[name] = _gate_up_to_zoo(out[name], weight=False)
        elif name.endswith("experts.down_proj"):
            out[name] = out[name].transpose(1, 2).contiguous()  # (E, F, C) -> (E, C, F)
    return out


def _experts_to_hf_layout(tensors: StateDict) -> StateDict:
    if isinstance(tensors, NamesOnly):
        return tensors
    out = dict(tensors)
    for name in list(out):
        if name.endswith("experts.gate_up_proj"):
            out[name] = _gate_up_to_hf(out[name], weight=True)
        elif name.endswith("experts.gate_up_proj_bias"):
            out[name] = _gate_up_to_hf(out[name], weight=False)
        elif name.endswith("experts.down_proj"):
            out[name] = out[name].transpose(1, 2).contiguous()
    return out


def _mapping() -> FamilyMapping:
    rules_to_zoo, rules_to_hf = decoder_converters(_rules, prefix=PREFIX)

    def hf_to_zoo(tensors: StateDict, spec: ModelSpec) -> StateDict:
        return rules_to_zoo(_experts_to_zoo_layout(tensors), spec)

    def zoo_to_hf(tensors: StateDict, spec: ModelSpec) -> StateDict:
        return _experts_to_hf_layout(rules_to_hf(tensors, spec))

    return FamilyMapping(
        model_types=("gpt_oss",),
        config_to_spec=config_to_spec,
        spec_to_config=spec_to_config,
        hf_to_zoo=hf_to_zoo,
        zoo_to_hf=zoo_to_hf,
        ffn_kinds=("moe",),
    )


MAPPING = _mapping()
