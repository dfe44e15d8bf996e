"""OLMo 2 (``model_type: olmo2``): ``Olmo2ForCausalLM`` and the headless ``Olmo2Model``.

After transformers' ``models/olmo2/modeling_olmo2.py``: Llama's layer (RMSNorm, rotary positions in the
rotate-half layout, SwiGLU, grouped-query attention) with two differences, each a spec option:

    transformers                                     zoo spec
    post_attention_layernorm / post_feedforward_     norm.placement: post_sublayer, x = x + norm(f(x)) (no
      layernorm on each sub-layer's output             norm on a sub-layer's input; the final norm kept)
    q_norm / k_norm: RMSNorm over the whole q          attention.qk_norm: true, qk_norm_scope: all_heads,
      (H·D) and k (K·D) projections, rms_norm_eps      qk_norm_eps: rms_norm_eps

    zoo                                     HF (under ``model.`` with the LM head)
    decoder.layers.i.self_attn.qkv_proj     layers.i.self_attn.{q,k,v}_proj (rows [q; k; v])
    decoder.layers.i.self_attn.{q,k}_norm   layers.i.self_attn.{q,k}_norm
    decoder.layers.i.self_attn_post_norm    layers.i.post_attention_layernorm
    decoder.layers.i.ffn.up_proj            layers.i.mlp.{gate,up}_proj (rows [gate; up])
    decoder.layers.i.ffn_post_norm          layers.i.post_feedforward_layernorm

``attention_bias`` puts a bias on all four projections. Rotary scaling is read and written by
`zoo.io.hf.rope`, as for Llama.
"""

from __future__ import annotations

from typing import Any

from zoo.io.hf.common import (
    ACTIVATIONS_TO_HF,
    FamilyMapping,
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
from zoo.io.hf.rope import rope_from_config, rope_to_config
from zoo.spec import DecoderSpec, ModelSpec, parse_spec

PREFIX = "model."
HEADED = "Olmo2ForCausalLM"
_DEFAULTS: dict[str, Any] = {  # Olmo2Config's (the 7B's shape)
    "vocab_size": 50304, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
    "num_attention_heads": 32, "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "pad_token_id": 1,
    "bos_token_id": None, "eos_token_id": 50279,
}  # fmt: skip


def config_to_spec(config: dict[str, Any], names: set[str]) -> ModelSpec:
    def get(key: str) -> Any:
        return config.get(key, _DEFAULTS[key])

    has_head = has_lm_head(config, names, headed=HEADED, prefix=PREFIX)
    d_model, vocab, num_heads = get("hidden_size"), get("vocab_size"), get("num_attention_heads")
    eps, head_dim = get("rms_norm_eps"), config.get("head_dim")
    return parse_spec({
        "family": "decoder",
        "vocab_size": vocab,
        "d_model": d_model,
        "num_layers": get("num_hidden_layers"),
        "max_positions": get("max_position_embeddings"),
        "attention": {
            "num_heads": num_heads,
            "num_kv_heads": config.get("num_key_value_heads") or num_heads,
            "head_dim": head_dim if head_dim and num_heads and head_dim != d_model // num_heads else None,
            "bias": config.get("attention_bias", False),
            "qk_norm": True,
            "qk_norm_eps": eps,
            "qk_norm_scope": "all_heads",
            "dropout": config.get("attention_dropout", 0.0),
        },
        "ffn": {
            "d_ff": get("intermediate_size"),
            "activation": activation_from_hf(config.get("hidden_act", "silu"), field="hidden_act"),
            "gated": True,
            "bias": False,
        },
        "norm": {"kind": "rmsnorm", "eps": eps, "placement": "post_sublayer"},
        "position": rope_from_config(config),
        "lm_head": {"tied": config.get("tie_word_embeddings", False)} if has_head else None,
        "dropout": 0.0,
        "init": {"std": config.get("initializer_range", 0.02)},
        "pad_token_id": token_id(config, "pad_token_id", vocab, _DEFAULTS["pad_token_id"]),
        "bos_token_id": token_id(config, "bos_token_id", vocab, _DEFAULTS["bos_token_id"]),
        "eos_token_id": token_id(config, "eos_token_id", vocab, _DEFAULTS["eos_token_id"]),
    })  # fmt: skip


def spec_to_config(spec: ModelSpec) -> dict[str, Any]:
    require("olmo2", [("family", spec.family, "decoder")])
    assert isinstance(spec, DecoderSpec)
    stack = spec.stacks()["decoder"]
    attention, ffn, norm, head = stack.attention, stack.ffn, stack.norm, spec.lm_head
    head_dim = attention.resolved_head_dim(spec.d_model)
    return {
        "model_type": "olmo2",
        "architectures": [HEADED if head else "Olmo2Model"],
        "vocab_size": spec.vocab_size,
        "hidden_size": spec.d_model,
        "intermediate_size": ffn.d_ff,
        "num_hidden_layers": stack.num_layers,
        "num_attention_heads": attention.num_heads,
        "num_key_value_heads": attention.kv_heads,
        # transformers reads head_dim where given, else hidden_size // heads
        **({"head_dim": head_dim} if head_dim != spec.d_model // attention.num_heads else {}),
        "hidden_act": ACTIVATIONS_TO_HF[ffn.activation],
        "max_position_embeddings": spec.max_positions,
        "rms_norm_eps": norm.eps,
        **rope_to_config(stack.position),
        "attention_bias": attention.bias,
        "attention_dropout": attention.dropout,
        "initializer_range": spec.init.std,
        "tie_word_embeddings": head.tied if head else False,
        "pad_token_id": spec.pad_token_id,
        "bos_token_id": spec.bos_token_id,
        "eos_token_id": spec.eos_token_id,
    }


def _rules(spec: DecoderSpec, prefix: str) -> list[Rule]:
    """zoo <-> HF names; body names carry ``prefix`` (``model.`` under ``Olmo2ForCausalLM``)."""
    stack = spec.stacks()["decoder"]
    attention, F = stack.attention, stack.ffn.d_ff
    H, K, D = attention.num_heads, attention.kv_heads, attention.resolved_head_dim(spec.d_model)
    bias = attention.bias
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
                bias=bias,
            ),
            *linear(f"{zoo}.self_attn.out_proj", f"{attn}.o_proj", bias=bias),
            rename(f"{zoo}.self_attn.q_norm.weight", f"{attn}.q_norm.weight"),
            rename(f"{zoo}.self_attn.k_norm.weight", f"{attn}.k_norm.weight"),
            *layernorm(f"{zoo}.self_attn_post_norm", f"{hf}.post_attention_layernorm", bias=False),
            *fused_linear(f"{zoo}.ffn.up_proj", [f"{mlp}.gate_proj", f"{mlp}.up_proj"], (F, F), bias=False),
            *linear(f"{zoo}.ffn.down_proj", f"{mlp}.down_proj", bias=False),
            *layernorm(f"{zoo}.ffn_post_norm", f"{hf}.post_feedforward_layernorm", bias=False),
        ]
    if spec.lm_head is not None and not spec.lm_head.tied:
        rules.append(rename("lm_head.weight", "lm_head.weight"))
    return rules


hf_to_zoo, zoo_to_hf = decoder_converters(_rules, prefix=PREFIX)


MAPPING = FamilyMapping(
    model_types=("olmo2",),
    config_to_spec=config_to_spec,
    spec_to_config=spec_to_config,
    hf_to_zoo=hf_to_zoo,
    zoo_to_hf=zoo_to_hf,
)
