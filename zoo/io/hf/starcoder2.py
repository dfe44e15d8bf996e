"""StarCoder2 (``model_type: starcoder2``): ``Starcoder2ForCausalLM`` and the headless ``Starcoder2Model``.

After transformers' ``models/starcoder2/modeling_starcoder2.py``: a pre-norm decoder with LayerNorms that
have biases, grouped-query attention with biased projections, rotary positions in the rotate-half layout,
a plain (not gated) MLP ``c_fc`` -> GELU (tanh) -> ``c_proj``, and one sliding window for every layer. Each
piece is a spec option zoo already has:

    config.json                          zoo spec
    norm_epsilon                         norm: {kind: layernorm, eps, placement: pre} (weight and bias)
    use_bias                             attention.bias and ffn.bias (all projections, the MLP too)
    hidden_act (gelu_pytorch_tanh)       ffn: {activation: gelu_tanh, gated: false}
    sliding_window (null: none)          decoder.pattern: {kind: sliding_window, window}
    residual_dropout, embedding_dropout  dropout (training only)

    zoo                                  HF (under ``model.`` with the LM head)
    decoder.layers.i.self_attn_norm      layers.i.input_layernorm
    decoder.layers.i.self_attn.qkv_proj  layers.i.self_attn.{q,k,v}_proj (rows [q; k; v])
    decoder.layers.i.ffn_norm            layers.i.post_attention_layernorm
    decoder.layers.i.ffn.up_proj         layers.i.mlp.c_fc
    decoder.layers.i.ffn.down_proj       layers.i.mlp.c_proj

A window at least as long as ``max_position_embeddings`` never hides a key and is dropped, as for Mistral.
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
    fused_linear,
    has_lm_head,
    layernorm,
    linear,
    rename,
    require,
    token_id,
)
from zoo.io.hf.llama import layer_windows
from zoo.io.hf.rope import rope_from_config, rope_to_config
from zoo.spec import DecoderSpec, ModelSpec, parse_spec
from zoo.spec.errors import short_repr

PREFIX = "model."
HEADED = "Starcoder2ForCausalLM"
_ACTIVATIONS_TO_HF = {**ACTIVATIONS_TO_HF, "gelu_tanh": "gelu_pytorch_tanh"}  # StarCoder2's own name
_DEFAULTS: dict[str, Any] = {  # Starcoder2Config's (the 7B's shape)
    "vocab_size": 49152, "hidden_size": 3072, "intermediate_size": 12288, "num_hidden_layers": 30,
    "num_attention_heads": 24, "num_key_value_heads": 2, "hidden_act": "gelu_pytorch_tanh",
    "max_position_embeddings": 4096, "initializer_range": 0.018042, "norm_epsilon": 1e-5,
    "bos_token_id": 50256, "eos_token_id": 50256, "use_bias": True, "tie_word_embeddings": True,
}  # fmt: skip


def config_to_spec(config: dict[str, Any], names: set[str]) -> ModelSpec:
    def get(key: str) -> Any:
        return config.get(key, _DEFAULTS[key])

    has_head = has_lm_head(config, names, headed=HEADED, prefix=PREFIX)
    d_model, vocab, num_heads = get("hidden_size"), get("vocab_size"), get("num_attention_heads")
    max_positions, head_dim, bias = get("max_position_embeddings"), config.get("head_dim"), get("use_bias")
    window = config.get("sliding_window")
    if window is not None and (not isinstance(window, int) or isinstance(window, bool) or window < 1):
        raise HFError(
            f"config.json sliding_window={short_repr(window)}: a positive number of keys or null is expected"
        )
    return parse_spec({
        "family": "decoder",
        "vocab_size": vocab,
        "d_model": d_model,
        "num_layers": get("num_hidden_layers"),
        "max_positions": max_positions,
        "attention": {
            "num_heads": num_heads,
            "num_kv_heads": get("num_key_value_heads") or num_heads,
            "head_dim": head_dim if head_dim and num_heads and head_dim != d_model // num_heads else None,
            "bias": bias,
            "dropout": config.get("attention_dropout", 0.0),
        },
        "ffn": {
            "d_ff": get("intermediate_size"),
            "activation": activation_from_hf(get("hidden_act"), field="hidden_act"),
            "bias": bias,
        },
        "norm": {"kind": "layernorm", "eps": get("norm_epsilon"), "placement": "pre"},
        "position": rope_from_config(config),
        # a window as long as the context never hides a key
        "decoder": {"pattern": {"kind": "sliding_window", "window": window}}
        if window is not None and window < max_positions
        else {},
        "lm_head": {"tied": get("tie_word_embeddings")} if has_head else None,
        "dropout": config.get("residual_dropout", 0.0),
        "init": {"std": get("initializer_range")},
        "pad_token_id": token_id(config, "pad_token_id", vocab),
        "bos_token_id": token_id(config, "bos_token_id", vocab, _DEFAULTS["bos_token_id"]),
        "eos_token_id": token_id(config, "eos_token_id", vocab, _DEFAULTS["eos_token_id"]),
    })  # fmt: skip


def spec_to_config(spec: ModelSpec) -> dict[str, Any]:
    require("starcoder2", [("family", spec.family, "decoder")])
    assert isinstance(spec, DecoderSpec)
    stack = spec.stacks()["decoder"]
    attention, ffn, norm, head = stack.attention, stack.ffn, stack.norm, spec.lm_head
    head_dim = attention.resolved_head_dim(spec.d_model)
    # one window for every layer: what the config can hold (other patterns read back as it, and are named)
    window = next((w for w in layer_windows(stack) if w is not None), None)
    return {
        "model_type": "starcoder2",
        "architectures": [HEADED if head else "Starcoder2Model"],
        "vocab_size": spec.vocab_size,
        "hidden_size": spec.d_model,
        "intermediate_size": ffn.d_ff,
        "num_hidden_layers": stack.num_layers,
        "num_attention_heads": attention.num_heads,
        "num_key_value_heads": attention.kv_heads,
        **({"head_dim": head_dim} if head_dim != spec.d_model // attention.num_heads else {}),
        "hidden_act": _ACTIVATIONS_TO_HF[ffn.activation],
        "max_position_embeddings": spec.max_positions,
        "norm_epsilon": norm.eps,
        **rope_to_config(stack.position),
        "sliding_window": window,
        "use_bias": attention.bias,
        "attention_dropout": attention.dropout,
        "residual_dropout": spec.dropout,
        "embedding_dropout": spec.dropout,
        "initializer_range": spec.init.std,
        "tie_word_embeddings": head.tied if head else True,
        "pad_token_id": spec.pad_token_id,
        "bos_token_id": spec.bos_token_id,
        "eos_token_id": spec.eos_token_id,
    }


def _rules(spec: DecoderSpec, prefix: str) -> list[Rule]:
    """zoo <-> HF names; body names carry ``prefix`` (``model.`` under ``Starcoder2ForCausalLM``)."""
    stack = spec.stacks()["decoder"]
    attention = stack.attention
    H, K, D = attention.num_heads, attention.kv_heads, attention.resolved_head_dim(spec.d_model)
    bias = attention.bias
    rules = [
        rename("embed.tokens.weight", f"{prefix}embed_tokens.weight"),
        *layernorm("decoder.final_norm", f"{prefix}norm"),
    ]
    for i in range(stack.num_layers):
        zoo, hf = f"decoder.layers.{i}", f"{prefix}layers.{i}"
        attn = f"{hf}.self_attn"
        rules += [
            *layernorm(f"{zoo}.self_attn_norm", f"{hf}.input_layernorm"),
            *fused_linear(
                f"{zoo}.self_attn.qkv_proj",
                [f"{attn}.{n}_proj" for n in "qkv"],
                (H * D, K * D, K * D),
                bias=bias,
            ),
            *linear(f"{zoo}.self_attn.out_proj", f"{attn}.o_proj", bias=bias),
            *layernorm(f"{zoo}.ffn_norm", f"{hf}.post_attention_layernorm"),
            *linear(f"{zoo}.ffn.up_proj", f"{hf}.mlp.c_fc", bias=bias),
            *linear(f"{zoo}.ffn.down_proj", f"{hf}.mlp.c_proj", bias=bias),
        ]
    if spec.lm_head is not None and not spec.lm_head.tied:
        rules.append(rename("lm_head.weight", "lm_head.weight"))
    return rules


hf_to_zoo, zoo_to_hf = decoder_converters(_rules, prefix=PREFIX)


MAPPING = FamilyMapping(
    model_types=("starcoder2",),
    config_to_spec=config_to_spec,
    spec_to_config=spec_to_config,
    hf_to_zoo=hf_to_zoo,
    zoo_to_hf=zoo_to_hf,
)
