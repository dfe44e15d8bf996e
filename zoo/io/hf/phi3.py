"""Phi-3 (``model_type: phi3``; Phi-3, Phi-3.5, Phi-4-mini): ``Phi3ForCausalLM`` and ``Phi3Model``.

After transformers' ``models/phi3/modeling_phi3.py``: Llama's layer (pre-norm RMSNorm, rotary positions in
the rotate-half layout, SwiGLU, grouped-query attention, no biases) with the projections stored fused the
way zoo keeps them: ``qkv_proj`` rows [q; k; v] and ``gate_up_proj`` rows [gate; up] are zoo's
``qkv_proj`` and ``up_proj`` as they are. What Phi-3 adds, each a spec option:

    config.json                                   zoo spec
    sliding_window (every layer; null = none)     decoder.pattern: {kind: sliding_window, window}
    partial_rotary_factor (Phi-4-mini: 0.75)      position.fraction
    rope_scaling {type: longrope (or su),         position.scaling: {type: longrope, short_factor,
      short_factor, long_factor}                    long_factor, original_max_positions, attention_factor}
    original_max_position_embeddings (top level)

LongRoPE switches from the short to the long factors in a forward whose largest position id reaches past
``original_max_position_embeddings`` (transformers' rule, `zoo.blocks.position.RotaryPositions`).
"""

from __future__ import annotations

from typing import Any

from zoo.io.hf.common import (
    ACTIVATIONS_TO_HF,
    FamilyMapping,
    HFError,
    Rule,
    activation_from_hf,
    decoder_converters,
    has_lm_head,
    layernorm,
    linear,
    rename,
    require,
    token_id,
)
from zoo.io.hf.llama import layer_windows
from zoo.io.hf.rope import as_rotary, rope_from_config, rope_to_config
from zoo.spec import DecoderSpec, ModelSpec, parse_spec

PREFIX = "model."
HEADED = "Phi3ForCausalLM"
_ROPE_KINDS = ("default", "longrope")  # what Phi-3 reads (linear and llama3 are refused)
_DEFAULTS: dict[str, Any] = {  # Phi3Config's (Phi-3-mini's shape)
    "vocab_size": 32064, "hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 32,
    "num_attention_heads": 32, "max_position_embeddings": 4096, "original_max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
}  # fmt: skip


def config_to_spec(config: dict[str, Any], names: set[str]) -> ModelSpec:
    def get(key: str) -> Any:
        return config.get(key, _DEFAULTS[key])

    has_head = has_lm_head(config, names, headed=HEADED, prefix=PREFIX)
    d_model, vocab, num_heads = get("hidden_size"), get("vocab_size"), get("num_attention_heads")
    max_positions, head_dim = get("max_position_embeddings"), config.get("head_dim")
    window = config.get("sliding_window")
    if window is not None and (not isinstance(window, int) or isinstance(window, bool) or window < 1):
        raise HFError(f"config.json sliding_window={window!r}: a positive number of keys or null is expected")
    # transformers' Phi3Config reads original_max_position_embeddings at the top level (default 4096)
    rotary = {**config, "original_max_position_embeddings": get("original_max_position_embeddings")}
    return parse_spec({
        "family": "decoder",
        "vocab_size": vocab,
        "d_model": d_model,
        "num_layers": get("num_hidden_layers"),
        "max_positions": max_positions,
        "attention": {
            "num_heads": num_heads,
            "num_kv_heads": config.get("num_key_value_heads") or num_heads,
            "head_dim": head_dim if head_dim and num_heads and head_dim != d_model // num_heads else None,
            "bias": False,
            "dropout": config.get("attention_dropout", 0.0),
        },
        "ffn": {
            "d_ff": get("intermediate_size"),
            "activation": activation_from_hf(config.get("hidden_act", "silu"), field="hidden_act"),
            "gated": True,
            "bias": False,
        },
        "norm": {"kind": "rmsnorm", "eps": get("rms_norm_eps"), "placement": "pre"},
        "position": rope_from_config(rotary, partial=True, kinds=_ROPE_KINDS),
        # a window as long as the context never hides a key
        "decoder": {"pattern": {"kind": "sliding_window", "window": window}}
        if window is not None and window < max_positions
        else {},
        "lm_head": {"tied": config.get("tie_word_embeddings", False)} if has_head else None,
        "dropout": config.get("resid_pdrop", 0.0),
        "init": {"std": config.get("initializer_range", 0.02)},
        "pad_token_id": token_id(config, "pad_token_id", vocab, 32000),
        "bos_token_id": token_id(config, "bos_token_id", vocab, 1),
        "eos_token_id": token_id(config, "eos_token_id", vocab, 32000),
    })  # fmt: skip


def spec_to_config(spec: ModelSpec) -> dict[str, Any]:
    require("phi3", [("family", spec.family, "decoder")])
    assert isinstance(spec, DecoderSpec)
    stack = spec.stacks()["decoder"]
    attention, ffn, norm, head = stack.attention, stack.ffn, stack.norm, spec.lm_head
    position = as_rotary(stack.position)
    windows = layer_windows(stack)
    sizes = sorted({w for w in windows if w is not None})
    if len(sizes) > 1 or (sizes and None in windows):
        where = f"{stack.name}.layer_patterns" if stack.layer_patterns is not None else stack.pattern_path()
        raise HFError(
            f"phi3 cannot express {where} with windows {windows}: Hugging Face phi3 applies one "
            "sliding_window to every layer"
        )
    scaling = position.scaling
    longrope = scaling is not None and scaling.type == "longrope"
    rope = rope_to_config(position, partial=True, kinds=_ROPE_KINDS)
    if scaling is not None and scaling.type == "longrope":
        # Phi3Config reads the original context at the top level, over the rotary dict's
        rope["original_max_position_embeddings"] = scaling.original_max_positions
    return {
        "model_type": "phi3",
        "architectures": [HEADED if head else "Phi3Model"],
        "vocab_size": spec.vocab_size,
        "hidden_size": spec.d_model,
        "intermediate_size": ffn.d_ff,
        "num_hidden_layers": stack.num_layers,
        "num_attention_heads": attention.num_heads,
        "num_key_value_heads": attention.kv_heads,
        **_head_dim(attention.resolved_head_dim(spec.d_model), spec.d_model // attention.num_heads),
        "hidden_act": ACTIVATIONS_TO_HF[ffn.activation],
        "max_position_embeddings": spec.max_positions,
        **({} if longrope else {"original_max_position_embeddings": spec.max_positions}),
        "rms_norm_eps": norm.eps,
        **rope,
        "sliding_window": sizes[0] if sizes else None,
        "attention_dropout": attention.dropout,
        "resid_pdrop": spec.dropout,
        "embd_pdrop": spec.dropout,
        "initializer_range": spec.init.std,
        "tie_word_embeddings": head.tied if head else False,
        "pad_token_id": spec.pad_token_id,
        "bos_token_id": spec.bos_token_id,
        "eos_token_id": spec.eos_token_id,
    }


def _head_dim(head_dim: int, default: int) -> dict[str, int]:
    """``head_dim`` only when it is not hidden_size / heads (Phi3Config has no such field by default)."""
    return {"head_dim": head_dim} if head_dim != default else {}


def _rules(spec: DecoderSpec, prefix: str) -> list[Rule]:
    """zoo <-> HF names; body names carry ``prefix`` (``model.`` under ``Phi3ForCausalLM``). Both fused
    projections already hold zoo's row order ([q; k; v], [gate; up]): renames only."""
    rules = [
        rename("embed.tokens.weight", f"{prefix}embed_tokens.weight"),
        *layernorm("decoder.final_norm", f"{prefix}norm", bias=False),
    ]
    for i in range(spec.stacks()["decoder"].num_layers):
        zoo, hf = f"decoder.layers.{i}", f"{prefix}layers.{i}"
        rules += [
            *layernorm(f"{zoo}.self_attn_norm", f"{hf}.input_layernorm", bias=False),
            *linear(f"{zoo}.self_attn.qkv_proj", f"{hf}.self_attn.qkv_proj", bias=False),
            *linear(f"{zoo}.self_attn.out_proj", f"{hf}.self_attn.o_proj", bias=False),
            *layernorm(f"{zoo}.ffn_norm", f"{hf}.post_attention_layernorm", bias=False),
            *linear(f"{zoo}.ffn.up_proj", f"{hf}.mlp.gate_up_proj", bias=False),
            *linear(f"{zoo}.ffn.down_proj", f"{hf}.mlp.down_proj", bias=False),
        ]
    if spec.lm_head is not None and not spec.lm_head.tied:
        rules.append(rename("lm_head.weight", "lm_head.weight"))
    return rules


hf_to_zoo, zoo_to_hf = decoder_converters(_rules, prefix=PREFIX)


MAPPING = FamilyMapping(
    model_types=("phi3",),
    config_to_spec=config_to_spec,
    spec_to_config=spec_to_config,
    hf_to_zoo=hf_to_zoo,
    zoo_to_hf=zoo_to_hf,
)
