"""Llama (``model_type: llama``): ``LlamaForCausalLM`` and the headless ``LlamaModel``.

transformers' ``models/llama/modeling_llama.py``: pre-norm RMSNorm, rotary positions with the rotate-half
layout (the same as zoo's, so HF-format q/k weights need no permutation), SwiGLU, grouped-query attention.
HF keeps q/k/v and gate/up as separate matrices; zoo fuses them (rows [q; k; v] and [gate; up]).

Only the plain ("default") rotary schedule is supported: Llama 3's "llama3" frequency scaling, linear,
dynamic and YaRN scaling have no field in zoo's `RotaryPositions`, so such configs are refused.
"""

from __future__ import annotations

from typing import Any

from zoo.io.hf.common import (
    ACTIVATIONS_TO_HF,
    FamilyMapping,
    HFError,
    Rule,
    StateDict,
    activation_from_hf,
    fused_linear,
    has_lm_head,
    layernorm,
    linear,
    rename,
    require,
    rules_to_hf,
    rules_to_zoo,
    strip_prefix,
    token_id,
)
from zoo.spec import DecoderSpec, ModelSpec, RotaryPositions, parse_spec

PREFIX = "model."
HEADED = "LlamaForCausalLM"


def _rope_theta(config: dict[str, Any]) -> float:
    """The rotary base from transformers 5's ``rope_parameters`` or 4.x's ``rope_theta``/``rope_scaling``."""
    params = config.get("rope_parameters") or config.get("rope_scaling") or {}
    kind = params.get("rope_type", params.get("type", "default"))
    if kind != "default":
        raise HFError(
            f"config.json rope_type={kind!r} is not supported: zoo's rotary positions have no frequency "
            "scaling; only rope_type 'default' converts"
        )
    factor = params.get("partial_rotary_factor", config.get("partial_rotary_factor", 1.0))
    if factor != 1.0:
        raise HFError(f"config.json partial_rotary_factor={factor} is not supported; zoo rotates every dim")
    return float(params.get("rope_theta", config.get("rope_theta", 10000.0)))


def config_to_spec(config: dict[str, Any], names: set[str]) -> ModelSpec:
    has_head = has_lm_head(config, names, headed=HEADED, prefix=PREFIX)
    d_model, vocab = config.get("hidden_size", 4096), config.get("vocab_size", 32000)
    num_heads = config.get("num_attention_heads", 32)
    head_dim = config.get("head_dim")
    return parse_spec({
        "family": "decoder",
        "vocab_size": vocab,
        "d_model": d_model,
        "num_layers": config.get("num_hidden_layers", 32),
        "max_positions": config.get("max_position_embeddings", 2048),
        "attention": {
            "num_heads": num_heads,
            "num_kv_heads": config.get("num_key_value_heads") or num_heads,
            "head_dim": head_dim if head_dim and head_dim != d_model // num_heads else None,
            "bias": config.get("attention_bias", False),
            "dropout": config.get("attention_dropout", 0.0),
        },
        "ffn": {
            "d_ff": config.get("intermediate_size", 11008),
            "activation": activation_from_hf(config.get("hidden_act", "silu"), field="hidden_act"),
            "gated": True,
            "bias": config.get("mlp_bias", False),
        },
        "norm": {"kind": "rmsnorm", "eps": config.get("rms_norm_eps", 1e-6), "placement": "pre"},
        "position": {"kind": "rotary", "theta": _rope_theta(config)},
        "lm_head": {"tied": config.get("tie_word_embeddings", False)} if has_head else None,
        "dropout": 0.0,
        "init": {"std": config.get("initializer_range", 0.02)},
        "pad_token_id": token_id(config, "pad_token_id", vocab),
        "bos_token_id": token_id(config, "bos_token_id", vocab, 1),
        "eos_token_id": token_id(config, "eos_token_id", vocab, 2),
    })  # fmt: skip


def spec_to_config(spec: ModelSpec) -> dict[str, Any]:
    require("llama", [("family", spec.family, "decoder")])
    assert isinstance(spec, DecoderSpec)
    stack = spec.stacks()["decoder"]
    src = stack.sources
    attention, ffn, norm, position = stack.attention, stack.ffn, stack.norm, stack.position
    head = spec.lm_head
    require("llama", [
        (f"{src['norm']}.kind", norm.kind, "rmsnorm"),
        (f"{src['norm']}.placement", norm.placement, "pre"),
        (f"{src['norm']}.final", norm.has_final, True),
        (f"{src['attention']}.scaled", attention.scaled, True),
        (f"{src['attention']}.qk_norm", attention.qk_norm, False),
        (f"{src['ffn']}.gated", ffn.gated, True),
        (f"{src['ffn']}.dropout", ffn.dropout, 0.0),
        (f"{src['position']}.kind", position.kind, "rotary"),
        ("embedding.scale", spec.embedding.scale, False),
        ("embedding.segment_vocab_size", spec.embedding.segment_vocab_size, 0),
        ("embedding.norm", spec.embedding.norm, False),
        ("embedding.factorized_dim", spec.embedding.factorized_dim, None),
        ("decoder.share_layers", stack.share_layers, False),
        ("dropout", spec.dropout, 0.0),
        ("lm_head.logits_bias", head.logits_bias if head else False, False),
        ("lm_head.rescale_tied", head.rescale_tied if head else False, False),
    ])  # fmt: skip
    assert isinstance(position, RotaryPositions)  # required above: position.kind == "rotary"
    theta = position.theta
    return {
        "model_type": "llama",
        "architectures": [HEADED if head else "LlamaModel"],
        "vocab_size": spec.vocab_size,
        "hidden_size": spec.d_model,
        "intermediate_size": ffn.d_ff,
        "num_hidden_layers": stack.num_layers,
        "num_attention_heads": attention.num_heads,
        "num_key_value_heads": attention.kv_heads,
        "head_dim": attention.resolved_head_dim(spec.d_model),
        "hidden_act": ACTIVATIONS_TO_HF[ffn.activation],
        "max_position_embeddings": spec.max_positions,
        "rms_norm_eps": norm.eps,
        "rope_theta": theta,  # transformers 4.x
        "rope_parameters": {"rope_type": "default", "rope_theta": theta},  # transformers 5
        "attention_bias": attention.bias,
        "attention_dropout": attention.dropout,
        "mlp_bias": ffn.bias,
        "initializer_range": spec.init.std,
        "tie_word_embeddings": head.tied if head else False,
        "pad_token_id": spec.pad_token_id,
        "bos_token_id": spec.bos_token_id,
        "eos_token_id": spec.eos_token_id,
    }


def _rules(spec: DecoderSpec, prefix: str) -> list[Rule]:
    """zoo <-> HF names; body names carry ``prefix`` (``model.`` under ``LlamaForCausalLM``)."""
    stack = spec.stacks()["decoder"]
    H, K = stack.attention.num_heads, stack.attention.kv_heads
    D, F = stack.attention.resolved_head_dim(spec.d_model), stack.ffn.d_ff
    attention_bias, ffn_bias = stack.attention.bias, stack.ffn.bias
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
                bias=attention_bias,
            ),
            *linear(f"{zoo}.self_attn.out_proj", f"{attn}.o_proj", bias=attention_bias),
            *fused_linear(
                f"{zoo}.ffn.up_proj", [f"{mlp}.gate_proj", f"{mlp}.up_proj"], (F, F), bias=ffn_bias
            ),
        ]
        rules += [
            *linear(f"{zoo}.ffn.down_proj", f"{mlp}.down_proj", bias=ffn_bias),
            *layernorm(f"{zoo}.self_attn_norm", f"{hf}.input_layernorm", bias=False),
            *layernorm(f"{zoo}.ffn_norm", f"{hf}.post_attention_layernorm", bias=False),
        ]  # fmt: skip
    if spec.lm_head is not None and not spec.lm_head.tied:
        rules.append(rename("lm_head.weight", "lm_head.weight"))
    return rules


def hf_to_zoo(tensors: StateDict, spec: ModelSpec) -> StateDict:
    assert isinstance(spec, DecoderSpec)
    tied = spec.lm_head is None or spec.lm_head.tied
    return rules_to_zoo(
        _rules(spec, ""), strip_prefix(tensors, PREFIX), ignore=["lm_head\\.weight"] if tied else []
    )


def zoo_to_hf(tensors: StateDict, spec: ModelSpec) -> StateDict:
    assert isinstance(spec, DecoderSpec)
    return rules_to_hf(_rules(spec, PREFIX if spec.lm_head is not None else ""), tensors)


MAPPING = FamilyMapping(
    model_types=("llama",),
    config_to_spec=config_to_spec,
    spec_to_config=spec_to_config,
    hf_to_zoo=hf_to_zoo,
    zoo_to_hf=zoo_to_hf,
)
