"""Llama 4's text stack (``llama4_text``: ``Llama4ForCausalLM``, headless ``Llama4TextModel``), after
transformers' ``models/llama4/modeling_llama4.py``.

A Llama-shaped decoder (pre-norm RMSNorm, GQA, SwiGLU) whose options are zoo spec options any stack may use:

    Llama 4                                  zoo
    no_rope_layers (1 = rotates) /           position.nope_layers (the 0s; else every interval-th layer)
      no_rope_layer_interval
    attention_chunk_size + layer_types       decoder.layer_patterns: chunked {size} on chunked_attention
      (chunked on the rotary layers)           layers, causal on full_attention ones
    use_qk_norm: weightless L2 norm of       attention.qk_norm, qk_norm_weight: false, qk_norm_layers:
      q/k on the rotary layers, after rope     rotary, qk_norm_eps = rms_norm_eps (an RMS over a head is
                                               unchanged by the rotation: zoo normalises before it)
    attn_temperature_tuning, floor_scale,    attention.temperature_tuning {floor_scale, scale} (no-rope layers)
      attn_scale
    rotary as complex numbers: pairs are     q/k rows permuted on import into zoo's rotate-half layout
      adjacent dims (x0 x1), (x2 x3) ...       (per head: x0 x2 x4 .. x1 x3 ..), back on export
    feed_forward.router: sigmoid of the      ffn: moe, scoring: sigmoid, normalize_top_k: false (the same
      top-k logits, others 0                   weights: sigmoid is monotone)
    routed input x * score, then experts     ffn.weighted_input: true
    experts.gate_up_proj (E, C, 2F):         ffn.experts.up_proj.weight (E, 2F, C): transposed, [gate; up]
      columns [gate | up]; down_proj (E, F, C)  and down_proj.weight (E, C, F), transposed
    shared_expert (intermediate_size)        ffn.shared_d_ff, no shared gate
    moe_layers / interleave_moe_layer_step;  ffn.sparse_step / dense_layers; dense_d_ff
      dense layers intermediate_size_mlp

transformers' temperature tuning counts a query's slot in its row, left padding included (its
``arange + past_seen_tokens``); zoo's does the same, so padded batches agree. Its chunks start at each row's
first real token, as zoo's chunked pattern does. ``router_jitter_noise`` and ``router_aux_loss_coef`` are not
read by transformers' forward and are not read here.
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
from zoo.io.hf.deepseek import rope_rows
from zoo.io.hf.rope import (
    LONG_CONTEXT,
    max_positions_from_config,
    max_positions_to_config,
    rope_from_config,
    rope_to_config,
)
from zoo.spec import ChunkedPattern, DecoderSpec, ModelSpec, MoESpec, RotaryPositions, parse_spec
from zoo.spec.limits import LAYERS

PREFIX = "model."
FULL, CHUNKED = "full_attention", "chunked_attention"
# Llama4TextConfig's defaults, for keys a config.json may leave out
DEFAULTS: dict[str, Any] = {
    "vocab_size": 202048, "hidden_size": 5120, "intermediate_size": 8192, "intermediate_size_mlp": 16384,
    "num_hidden_layers": 48, "num_attention_heads": 40, "num_key_value_heads": 8, "head_dim": 128,
    "max_position_embeddings": 4096 * 32, "rms_norm_eps": 1e-5, "num_experts_per_tok": 1,
    "num_local_experts": 16, "interleave_moe_layer_step": 1, "use_qk_norm": True, "no_rope_layer_interval": 4,
    "attention_chunk_size": 8192, "attn_temperature_tuning": True, "floor_scale": 8192, "attn_scale": 0.1,
    "attention_bias": False, "tie_word_embeddings": False, "attention_dropout": 0.0, "initializer_range": 0.02,
    "bos_token_id": 1, "eos_token_id": 2, "rope_theta": 500000.0,
}  # fmt: skip


# -- config <-> spec ---------------------------------------------------------------------------------------


def config_to_spec(config: dict[str, Any], names: set[str]) -> ModelSpec:
    def get(key: str) -> Any:
        return config.get(key, DEFAULTS.get(key))

    has_head = has_lm_head(config, names, headed="Llama4ForCausalLM", prefix=PREFIX)
    d_model, vocab, num_heads = get("hidden_size"), get("vocab_size"), get("num_attention_heads")
    max_positions, eps = get("max_position_embeddings"), get("rms_norm_eps")
    head_dim = get("head_dim") or d_model // num_heads
    num_layers = get("num_hidden_layers")
    if not isinstance(num_layers, int) or isinstance(num_layers, bool) or not 1 <= num_layers <= LAYERS.value:
        raise HFError(
            f"config.json num_hidden_layers={num_layers!r} must be in [1, {LAYERS.value:,}] ({LAYERS.env} raises it)"
        )
    rotates = _rotary_flags(config, get, num_layers)
    types = _layer_types(config, get, rotates)
    position = rope_from_config(
        config, kinds=LONG_CONTEXT, max_positions=max_positions, default_theta=DEFAULTS["rope_theta"]
    )
    nope = [i for i in range(num_layers) if not rotates[i]]
    if nope:
        position["nope_layers"] = nope
    qk_norm = bool(get("use_qk_norm"))
    # the published configs write 4 (truthy), transformers' default is a bool: read as given, as a truth value
    tuning = config.get("attn_temperature_tuning")
    tuning = DEFAULTS["attn_temperature_tuning"] if tuning is None else tuning
    if isinstance(tuning, float) or not isinstance(tuning, int):
        raise HFError(f"config.json attn_temperature_tuning={tuning!r}: a boolean is expected")
    return parse_spec({
        "family": "decoder",
        "vocab_size": vocab,
        "d_model": d_model,
        "num_layers": num_layers,
        "max_positions": max_positions_from_config(position, max_positions),
        "attention": {
            "num_heads": num_heads,
            "num_kv_heads": get("num_key_value_heads") or num_heads,
            "head_dim": head_dim if head_dim != d_model // num_heads else None,
            "bias": get("attention_bias"),
            "dropout": get("attention_dropout"),
            **({"qk_norm": True, "qk_norm_eps": eps, "qk_norm_weight": False, "qk_norm_layers": "rotary"}
               if qk_norm else {}),
            **({"temperature_tuning": {"floor_scale": get("floor_scale"), "scale": get("attn_scale")}}
               if tuning else {}),
        },
        "ffn": _moe_from_config(config, get, num_layers),
        "norm": {"kind": "rmsnorm", "eps": eps, "placement": "pre"},
        "position": position,
        "decoder": _patterns_spec(types, get("attention_chunk_size")),
        "lm_head": {"tied": get("tie_word_embeddings")} if has_head else None,
        "dropout": 0.0,
        "init": {"std": get("initializer_range")},
        "pad_token_id": token_id(config, "pad_token_id", vocab),
        "bos_token_id": token_id(config, "bos_token_id", vocab, DEFAULTS["bos_token_id"]),
        "eos_token_id": token_id(config, "eos_token_id", vocab, DEFAULTS["eos_token_id"]),
    })  # fmt: skip


def _rotary_flags(config: dict[str, Any], get: Any, num_layers: int) -> list[bool]:
    """Per layer: whether it rotates (``no_rope_layers``: 1 = rotary, 0 = none; else every
    ``no_rope_layer_interval``-th layer has none, as Llama4TextConfig fills it in)."""
    flags = config.get("no_rope_layers")
    if not flags:  # None or [] (transformers then takes the interval)
        interval = get("no_rope_layer_interval")
        if not isinstance(interval, int) or isinstance(interval, bool) or interval < 1:
            raise HFError(f"config.json no_rope_layer_interval={interval!r}: a positive integer is expected")
        return [(i + 1) % interval != 0 for i in range(num_layers)]
    if (
        not isinstance(flags, list)
        or len(flags) < num_layers
        or any(flag not in (0, 1) or isinstance(flag, float) for flag in flags)
    ):
        raise HFError(
            f"config.json no_rope_layers must list 1 (rotary) or 0 (none) for each of the {num_layers} layers "
            "(num_hidden_layers)"
        )
    return [bool(flags[i]) for i in range(num_layers)]


def _layer_types(config: dict[str, Any], get: Any, rotates: list[bool]) -> list[str]:
    """Per layer: chunked_attention or full_attention (Llama4TextConfig: chunked on the rotary layers when
    ``attention_chunk_size`` is set)."""
    chunk, types = get("attention_chunk_size"), config.get("layer_types")
    if types is None:
        types = [CHUNKED if rotary and chunk is not None else FULL for rotary in rotates]
    if (
        not isinstance(types, list)
        or len(types) != len(rotates)
        or any(t not in (FULL, CHUNKED) for t in types)
    ):
        raise HFError(
            f"config.json layer_types must list {len(rotates)} entries of {FULL!r} / {CHUNKED!r} "
            "(num_hidden_layers)"
        )
    if CHUNKED in types and (not isinstance(chunk, int) or isinstance(chunk, bool) or chunk < 1):
        raise HFError(
            f"config.json attention_chunk_size={chunk!r}: chunked layers need a positive chunk size"
        )
    return types


def _patterns_spec(types: list[str], chunk: Any) -> dict[str, Any]:
    """``decoder:`` overrides: one chunked pattern, or one per layer."""
    if CHUNKED not in types:
        return {}
    chunked = {"kind": "chunked", "size": chunk}
    if all(t == CHUNKED for t in types):
        return {"pattern": chunked}
    return {"layer_patterns": [chunked if t == CHUNKED else {"kind": "causal"} for t in types]}


def _moe_from_config(config: dict[str, Any], get: Any, num_layers: int) -> dict[str, Any]:
    """The ``ffn`` sub-spec: the routed experts with their shared expert; ``moe_layers`` (else every
    ``interleave_moe_layer_step``-th layer) sparse, the others dense of ``intermediate_size_mlp``."""
    step, moe_layers = get("interleave_moe_layer_step"), config.get("moe_layers")
    if not isinstance(step, int) or isinstance(step, bool) or step < 1:
        raise HFError(f"config.json interleave_moe_layer_step={step!r}: a positive integer is expected")
    if moe_layers is None:
        sparse = set(range(step - 1, num_layers, step))
    elif isinstance(moe_layers, list) and all(
        isinstance(i, int) and not isinstance(i, bool) for i in moe_layers
    ):
        sparse = {i for i in moe_layers if 0 <= i < num_layers}
    else:
        raise HFError(f"config.json moe_layers={moe_layers!r}: a list of layer indices is expected")
    by_step = sparse == set(range(step - 1, num_layers, step))
    dense = [] if by_step else [i for i in range(num_layers) if i not in sparse]
    width = get("intermediate_size")
    return {
        "kind": "moe",
        "num_experts": get("num_local_experts"),
        "top_k": get("num_experts_per_tok"),
        "d_ff": width,
        "activation": activation_from_hf(config.get("hidden_act", "silu"), field="hidden_act"),
        "normalize_top_k": False,
        "scoring": "sigmoid",
        "weighted_input": True,
        "shared_d_ff": width,
        "shared_gate": False,
        "sparse_step": step if by_step else 1,
        "dense_layers": dense,
        # the dense layers' width only where a layer is dense: an unused intermediate_size_mlp says nothing
        "dense_d_ff": get("intermediate_size_mlp") if len(sparse) < num_layers else None,
    }


def spec_to_config(spec: ModelSpec) -> dict[str, Any]:
    require("llama4_text", [("family", spec.family, "decoder")])
    assert isinstance(spec, DecoderSpec)
    stack = spec.stacks()["decoder"]
    attention, ffn, head, position = stack.attention, stack.ffn, spec.lm_head, stack.position
    assert isinstance(ffn, MoESpec)  # the mapping's ffn_kinds: a dense spec is refused before this
    num_layers = stack.num_layers
    patterns = [stack.layer_pattern(i) for i in range(num_layers)]
    chunks = {p.size for p in patterns if isinstance(p, ChunkedPattern)}
    nope = position.nope_layers if isinstance(position, RotaryPositions) else []
    tuning = attention.temperature_tuning
    return {
        "model_type": "llama4_text",
        "architectures": ["Llama4ForCausalLM" if head else "Llama4TextModel"],
        "vocab_size": spec.vocab_size,
        "hidden_size": spec.d_model,
        "intermediate_size": ffn.d_ff,
        # read by dense layers only; transformers' shared expert is always intermediate_size wide
        "intermediate_size_mlp": ffn.dense_d_ff or DEFAULTS["intermediate_size_mlp"],
        "num_hidden_layers": num_layers,
        "num_attention_heads": attention.num_heads,
        "num_key_value_heads": attention.kv_heads,
        "head_dim": attention.resolved_head_dim(spec.d_model),
        "hidden_act": ACTIVATIONS_TO_HF[ffn.activation],
        "attention_bias": attention.bias,
        "attention_dropout": attention.dropout,
        "num_local_experts": ffn.num_experts,
        "num_experts_per_tok": ffn.top_k,
        "moe_layers": [i for i in range(num_layers) if ffn.is_sparse(i)],
        "interleave_moe_layer_step": ffn.sparse_step,
        "use_qk_norm": attention.qk_norm,
        "no_rope_layers": [int(i not in nope) for i in range(num_layers)],
        "attention_chunk_size": min(chunks) if chunks else None,
        "layer_types": [CHUNKED if isinstance(p, ChunkedPattern) else FULL for p in patterns],
        "attn_temperature_tuning": tuning is not None,
        "floor_scale": tuning.floor_scale if tuning else DEFAULTS["floor_scale"],
        "attn_scale": tuning.scale if tuning else DEFAULTS["attn_scale"],
        "max_position_embeddings": max_positions_to_config(position, spec.max_positions),
        "rms_norm_eps": stack.norm.eps,
        **rope_to_config(position, kinds=LONG_CONTEXT),
        "initializer_range": spec.init.std,
        "tie_word_embeddings": head.tied if head else False,
        "pad_token_id": spec.pad_token_id,
        "bos_token_id": spec.bos_token_id,
        "eos_token_id": spec.eos_token_id,
    }


# -- tensors -----------------------------------------------------------------------------------------------


def _rules(spec: DecoderSpec, prefix: str) -> list[Rule]:
    """zoo <-> HF names; q/k rows de-interleaved (complex rotary pairs -> rotate-half), the expert tensors'
    layouts changed by `hf_to_zoo` / `zoo_to_hf`."""
    stack = spec.stacks()["decoder"]
    attention, ffn = stack.attention, stack.ffn
    assert isinstance(ffn, MoESpec)
    H, K = attention.num_heads, attention.kv_heads
    D = attention.resolved_head_dim(spec.d_model)
    sizes = (H * D, K * D, K * D)
    # every head of q and k de-interleaved (a no-rope layer too: q·k is unchanged when both permute alike)
    rows = (*rope_rows(D, D, repeats=H + K), *range((H + K) * D, (H + 2 * K) * D))
    bias = attention.bias
    rules = [
        rename("embed.tokens.weight", f"{prefix}embed_tokens.weight"),
        *layernorm("decoder.final_norm", f"{prefix}norm", bias=False),
    ]
    for i in range(stack.num_layers):
        zoo, hf = f"decoder.layers.{i}", f"{prefix}layers.{i}"
        attn, mlp = f"{hf}.self_attn", f"{hf}.feed_forward"
        rules += [
            Rule(f"{zoo}.self_attn.qkv_proj.weight", tuple(f"{attn}.{n}_proj.weight" for n in "qkv"), sizes=sizes, rows=rows),
            *([Rule(f"{zoo}.self_attn.qkv_proj.bias", tuple(f"{attn}.{n}_proj.bias" for n in "qkv"), sizes=sizes, rows=rows)] if bias else []),
            *linear(f"{zoo}.self_attn.out_proj", f"{attn}.o_proj", bias=attention.has_out_bias),
            *layernorm(f"{zoo}.self_attn_norm", f"{hf}.input_layernorm", bias=False),
            *layernorm(f"{zoo}.ffn_norm", f"{hf}.post_attention_layernorm", bias=False),
        ]  # fmt: skip
        if ffn.is_sparse(i):
            S = ffn.shared_d_ff or ffn.d_ff
            shared = f"{mlp}.shared_expert"
            rules += [
                Rule(f"{zoo}.ffn.router.weight", (f"{mlp}.router.weight",)),
                rename(f"{zoo}.ffn.experts.up_proj.weight", f"{mlp}.experts.gate_up_proj"),
                rename(f"{zoo}.ffn.experts.down_proj.weight", f"{mlp}.experts.down_proj"),
                *fused_linear(f"{zoo}.ffn.shared.up_proj", [f"{shared}.gate_proj", f"{shared}.up_proj"], (S, S), bias=False),
                *linear(f"{zoo}.ffn.shared.down_proj", f"{shared}.down_proj", bias=False),
            ]  # fmt: skip
        else:
            F = ffn.dense_spec().d_ff
            rules += [
                *fused_linear(f"{zoo}.ffn.up_proj", [f"{mlp}.gate_proj", f"{mlp}.up_proj"], (F, F), bias=False),
                *linear(f"{zoo}.ffn.down_proj", f"{mlp}.down_proj", bias=False),
            ]  # fmt: skip
    if spec.lm_head is not None and not spec.lm_head.tied:
        rules.append(rename("lm_head.weight", "lm_head.weight"))
    return rules


def _experts_layout(tensors: StateDict) -> StateDict:
    """HF's (E, C, 2F) / (E, F, C) expert tensors <-> zoo's (E, 2F, C) / (E, C, F): a transpose of the last
    two dims each way (gate columns come first in HF as gate rows do in zoo)."""
    if isinstance(tensors, NamesOnly):
        return tensors
    out = dict(tensors)
    for name in list(out):
        if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            out[name] = out[name].transpose(1, 2).contiguous()
    return out


def _mapping() -> FamilyMapping:
    rules_to_zoo, rules_to_hf = decoder_converters(_rules, prefix=PREFIX)

    def hf_to_zoo(tensors: StateDict, spec: ModelSpec) -> StateDict:
        return rules_to_zoo(_experts_layout(tensors), spec)

    def zoo_to_hf(tensors: StateDict, spec: ModelSpec) -> StateDict:
        return _experts_layout(rules_to_hf(tensors, spec))

    return FamilyMapping(
        model_types=("llama4_text",),
        config_to_spec=config_to_spec,
        spec_to_config=spec_to_config,
        hf_to_zoo=hf_to_zoo,
        zoo_to_hf=zoo_to_hf,
        ffn_kinds=("moe",),
    )


MAPPING = _mapping()
