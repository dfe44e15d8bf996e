"""Cohere 2 (``model_type: cohere2``; Command R7B): ``Cohere2ForCausalLM`` and the headless ``Cohere2Model``.

After transformers' ``models/cohere2/modeling_cohere2.py``: one bias-free LayerNorm per layer feeds the
attention and the SwiGLU MLP side by side, x + attn(norm(x)) + mlp(norm(x)); sliding-window layers
alternate with full-attention ones, and only the sliding layers rotate (the full ones see no position at
all); the logits are scaled. Each is a spec option:

    config.json                                  zoo spec
    input_layernorm (no bias), layer_norm_eps    norm: {kind: layernorm, bias: false, placement: pre,
                                                   residual: parallel_shared}
    layer_types / sliding_window_pattern +       decoder.layer_patterns: sliding_window (window kept even
      sliding_window                               when longer than the context: the layer's kind) / causal
    rope only where a layer slides               position.nope_layers: the full-attention layers
    logit_scale                                  lm_head.scale (1: none)

    zoo                                     HF (under ``model.`` with the LM head)
    decoder.layers.i.self_attn_norm         layers.i.input_layernorm
    decoder.layers.i.self_attn.qkv_proj     layers.i.self_attn.{q,k,v}_proj (rows [q; k; v])
    decoder.layers.i.ffn.up_proj            layers.i.mlp.{gate,up}_proj (rows [gate; up])

Cohere rotates interleaved pairs (dims 2i, 2i + 1 of a head turn by frequency i); zoo's rotary pairs dims i
and i + D/2 (the rotate-half layout). The q and k rows of each head are reordered on import, evens first,
then odds, and back on export (`_deinterleave`): the same permutation of every query and key dim leaves
q·k unchanged, and the pairs then rotate as Cohere's do. transformers forces ``head_dim`` to
hidden_size / heads, so a free ``attention.head_dim`` is refused.
"""

from __future__ import annotations

from typing import Any

from zoo.io.hf.common import (
    ACTIVATIONS_TO_HF,
    FamilyMapping,
    HFError,
    NamesOnly,
    Rule,
    StateDict,
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
from zoo.io.hf.rope import rope_from_config, rope_to_config
from zoo.spec import DecoderSpec, ModelSpec, parse_spec
from zoo.spec.errors import short_repr
from zoo.spec.limits import LAYERS

PREFIX = "model."
HEADED = "Cohere2ForCausalLM"
_DEFAULTS: dict[str, Any] = {  # Cohere2Config's
    "vocab_size": 256000, "hidden_size": 8192, "intermediate_size": 22528, "logit_scale": 0.0625,
    "num_hidden_layers": 40, "num_attention_heads": 64, "max_position_embeddings": 8192,
    "layer_norm_eps": 1e-5, "pad_token_id": 0, "bos_token_id": 5, "eos_token_id": 255001,
    "tie_word_embeddings": True, "sliding_window": 4096, "sliding_window_pattern": 4,
}  # fmt: skip


def config_to_spec(config: dict[str, Any], names: set[str]) -> ModelSpec:
    def get(key: str) -> Any:
        return config.get(key, _DEFAULTS[key])

    has_head = has_lm_head(config, names, headed=HEADED, prefix=PREFIX)
    vocab, scale = get("vocab_size"), get("logit_scale")
    if not isinstance(scale, int | float) or isinstance(scale, bool) or scale <= 0:
        raise HFError(f"config.json logit_scale={short_repr(scale)}: a positive number is expected")
    types = _layer_types(config, get)
    window = get("sliding_window")
    if SLIDING in types and (not isinstance(window, int) or isinstance(window, bool) or window < 1):
        raise HFError(
            f"config.json sliding_window={short_repr(window)}: layer_types has 'sliding_attention' layers, "
            "which need a positive number of keys (the only layers that rotate)"
        )
    position = rope_from_config(config, layer_types=types)
    nope = [i for i, kind in enumerate(types) if kind == FULL]
    if nope:
        position["nope_layers"] = nope  # only the sliding layers rotate
    patterns = [
        {"kind": "sliding_window", "window": window} if t == SLIDING else {"kind": "causal"} for t in types
    ]
    return parse_spec({
        "family": "decoder",
        "vocab_size": vocab,
        "d_model": get("hidden_size"),
        "num_layers": len(types),
        "max_positions": get("max_position_embeddings"),
        "attention": {
            "num_heads": get("num_attention_heads"),
            "num_kv_heads": config.get("num_key_value_heads") or get("num_attention_heads"),
            "bias": config.get("attention_bias", False),
            "dropout": config.get("attention_dropout", 0.0),
        },
        "ffn": {
            "d_ff": get("intermediate_size"),
            "activation": activation_from_hf(config.get("hidden_act", "silu"), field="hidden_act"),
            "gated": True,
            "bias": False,
        },
        "norm": {
            "kind": "layernorm", "eps": get("layer_norm_eps"), "bias": False, "placement": "pre",
            "residual": "parallel_shared",
        },
        "position": position,
        "decoder": {"layer_patterns": patterns} if len({repr(p) for p in patterns}) > 1 else {"pattern": patterns[0]},
        "lm_head": {"tied": get("tie_word_embeddings"), "scale": scale if scale != 1 else None} if has_head else None,
        "dropout": 0.0,
        "init": {"std": config.get("initializer_range", 0.02)},
        "pad_token_id": token_id(config, "pad_token_id", vocab, _DEFAULTS["pad_token_id"]),
        "bos_token_id": token_id(config, "bos_token_id", vocab, _DEFAULTS["bos_token_id"]),
        "eos_token_id": token_id(config, "eos_token_id", vocab, _DEFAULTS["eos_token_id"]),
    })  # fmt: skip


def _layer_types(config: dict[str, Any], get: Any) -> list[str]:
    """Per layer: ``sliding_attention`` or ``full_attention``, as Cohere2Config derives them."""
    num_layers = get("num_hidden_layers")
    if not isinstance(num_layers, int) or not 1 <= num_layers <= LAYERS.value:
        raise HFError(
            f"config.json num_hidden_layers={short_repr(num_layers)} must be in [1, {LAYERS.value:,}] "
            f"({LAYERS.env} raises it)"
        )
    types = config.get("layer_types")
    if types is None:  # transformers: every `period`-th layer full, the others sliding
        period = get("sliding_window_pattern")
        if not isinstance(period, int) or isinstance(period, bool) or period < 1:
            raise HFError(
                f"config.json sliding_window_pattern={short_repr(period)}: a positive integer is expected"
            )
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
    return types


def spec_to_config(spec: ModelSpec) -> dict[str, Any]:
    require("cohere2", [("family", spec.family, "decoder")])
    assert isinstance(spec, DecoderSpec)
    stack = spec.stacks()["decoder"]
    attention, ffn, norm, head = stack.attention, stack.ffn, stack.norm, spec.lm_head
    windows = layer_windows(stack)
    types = [FULL if w is None else SLIDING for w in windows]
    return {
        "model_type": "cohere2",
        "architectures": [HEADED if head else "Cohere2Model"],
        "vocab_size": spec.vocab_size,
        "hidden_size": spec.d_model,
        "intermediate_size": ffn.d_ff,
        "logit_scale": head.scale if head is not None and head.scale is not None else 1.0,
        "num_hidden_layers": stack.num_layers,
        "num_attention_heads": attention.num_heads,
        "num_key_value_heads": attention.kv_heads,
        "hidden_act": ACTIVATIONS_TO_HF[ffn.activation],
        "max_position_embeddings": spec.max_positions,
        "layer_norm_eps": norm.eps,
        **rope_to_config(stack.position),
        "attention_bias": attention.bias,
        "attention_dropout": attention.dropout,
        # one window for the sliding layers: what the config holds (others read back as it, and are named)
        "sliding_window": next((w for w in windows if w is not None), None),
        "layer_types": types,
        "initializer_range": spec.init.std,
        "tie_word_embeddings": head.tied if head else True,
        "pad_token_id": spec.pad_token_id,
        "bos_token_id": spec.bos_token_id,
        "eos_token_id": spec.eos_token_id,
    }


def _rules(spec: DecoderSpec, prefix: str) -> list[Rule]:
    """zoo <-> HF names; body names carry ``prefix`` (``model.`` under ``Cohere2ForCausalLM``)."""
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
            *layernorm(f"{zoo}.self_attn_norm", f"{hf}.input_layernorm", bias=False),
            *fused_linear(
                f"{zoo}.self_attn.qkv_proj",
                [f"{attn}.{n}_proj" for n in "qkv"],
                (H * D, K * D, K * D),
                bias=bias,
            ),
            *linear(f"{zoo}.self_attn.out_proj", f"{attn}.o_proj", bias=bias),
            *fused_linear(f"{zoo}.ffn.up_proj", [f"{mlp}.gate_proj", f"{mlp}.up_proj"], (F, F), bias=False),
            *linear(f"{zoo}.ffn.down_proj", f"{mlp}.down_proj", bias=False),
        ]
    if spec.lm_head is not None and not spec.lm_head.tied:
        rules.append(rename("lm_head.weight", "lm_head.weight"))
    return rules


def _deinterleave(tensors: StateDict, spec: ModelSpec, *, inverse: bool) -> StateDict:
    """The q/k rows (and biases) of every head reordered from Cohere's interleaved rotary pairs to zoo's
    halves, (D/2, 2) -> (2, D/2) per head, or back (``inverse``); other tensors as they are."""
    attention = spec.stacks()["decoder"].attention
    D = attention.resolved_head_dim(spec.d_model)
    out = dict(tensors)
    for name, tensor in tensors.items():
        if not name.endswith((".self_attn.q_proj.weight", ".self_attn.q_proj.bias", ".self_attn.k_proj.weight",
                              ".self_attn.k_proj.bias")):  # fmt: skip
            continue
        heads = tensor.shape[0] // D
        rows = (2, D // 2) if inverse else (D // 2, 2)
        blocks = tensor.reshape(heads, *rows, *tensor.shape[1:])  # (heads, a, b, ...)
        out[name] = blocks.transpose(1, 2).reshape(tensor.shape).contiguous()
    return out


_hf_to_zoo, _zoo_to_hf = decoder_converters(_rules, prefix=PREFIX)


def hf_to_zoo(tensors: StateDict, spec: ModelSpec) -> StateDict:
    return _hf_to_zoo(_deinterleave(tensors, spec, inverse=False), spec)


def zoo_to_hf(tensors: StateDict, spec: ModelSpec) -> StateDict:
    converted = _zoo_to_hf(tensors, spec)
    return converted if isinstance(tensors, NamesOnly) else _deinterleave(converted, spec, inverse=True)


MAPPING = FamilyMapping(
    model_types=("cohere2",),
    config_to_spec=config_to_spec,
    spec_to_config=spec_to_config,
    hf_to_zoo=hf_to_zoo,
    zoo_to_hf=zoo_to_hf,
)
