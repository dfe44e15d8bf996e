"""GPT-NeoX / Pythia (``model_type: gpt_neox``): ``GPTNeoXForCausalLM`` and the headless ``GPTNeoXModel``.

After transformers' ``models/gpt_neox/modeling_gpt_neox.py``: pre-norm LayerNorm, rotary positions on the
first ``partial_rotary_factor`` (formerly ``rotary_pct``, default 0.25) of each head's dims in the
rotate-half layout, exact GELU, biases on every projection (``attention_bias``), an untied head, and with
``use_parallel_residual`` (the default) both branches reading the layer's input:

    parallel:    x + attention(input_layernorm(x)) + mlp(post_attention_layernorm(x))
    sequential:  h = x + attention(input_layernorm(x));  h + mlp(post_attention_layernorm(h))

zoo's ``norm.residual`` says which. The fused ``query_key_value`` interleaves the heads' rows
([q k v] of head 0, of head 1, ...) where zoo's ``qkv_proj`` stacks [q of every head; k; v]: the rule
regroups the rows both ways (`common.interleaved_linear`).

The head: published checkpoints (Pythia) store it as ``embed_out.weight``; transformers 5 names the module
``lm_head`` and renames on load. Both names are read; the export writes ``embed_out`` (what every
transformers version loads). The legacy ``rotary_emb_base`` / ``rotary_pct`` keys are read, and written
beside ``rope_parameters``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from zoo.io.hf.common import (
    ACTIVATIONS_TO_HF,
    FamilyMapping,
    HFError,
    Rule,
    StateDict,
    activation_from_hf,
    decoder_converters,
    has_lm_head,
    interleaved_linear,
    json_kind,
    layernorm,
    linear,
    rename,
    require,
    token_id,
)
from zoo.io.hf.rope import as_rotary, rope_from_config, rope_to_config
from zoo.spec import DecoderSpec, ModelSpec, parse_spec

PREFIX = "gpt_neox."
HEADED = "GPTNeoXForCausalLM"
HEAD = "embed_out.weight"  # the published name; transformers 5's module is lm_head
# Causal-mask buffers of old checkpoints (transformers' _keys_to_ignore_on_load_unexpected).
_OLD_BUFFERS = (r"layers\.\d+\.attention\.(bias|masked_bias)",)
_DEFAULTS: dict[str, Any] = {  # GPTNeoXConfig's (gpt-neox-20b's shape)
    "vocab_size": 50432, "hidden_size": 6144, "num_hidden_layers": 44, "num_attention_heads": 64,
    "intermediate_size": 24576, "max_position_embeddings": 2048, "layer_norm_eps": 1e-5,
}  # fmt: skip


def config_to_spec(config: dict[str, Any], names: set[str]) -> ModelSpec:
    def get(key: str) -> Any:
        return config.get(key, _DEFAULTS[key])

    has_head = has_lm_head(config, names, headed=HEADED, prefix=PREFIX) or HEAD in names
    vocab, bias = get("vocab_size"), config.get("attention_bias", True)
    # transformers' GPTNeoXConfig.convert_rope_params_to_dict: rope_scaling or rope_parameters, their theta
    # and factor first, then the legacy rotary_emb_base / rotary_pct, then 10000 / 0.25.
    raw = config.get("rope_scaling") or config.get("rope_parameters") or {}
    if not isinstance(raw, Mapping):
        raise HFError(f"config.json rope_parameters must be a mapping, got {json_kind(raw)}")
    rope = dict(raw)
    rope.setdefault("rope_theta", config.get("rotary_emb_base", 10000.0))
    rope.setdefault("partial_rotary_factor", config.get("rotary_pct", 0.25))
    rotary = {**config, "rope_parameters": rope, "rope_scaling": None}
    return parse_spec({
        "family": "decoder",
        "vocab_size": vocab,
        "d_model": get("hidden_size"),
        "num_layers": get("num_hidden_layers"),
        "max_positions": get("max_position_embeddings"),
        "attention": {
            "num_heads": get("num_attention_heads"),
            "bias": bias,
            "dropout": config.get("attention_dropout", 0.0),
        },
        "ffn": {
            "d_ff": get("intermediate_size"),
            "activation": activation_from_hf(config.get("hidden_act", "gelu"), field="hidden_act"),
        },
        "norm": {
            "kind": "layernorm",
            "eps": get("layer_norm_eps"),
            "placement": "pre",
            "residual": "parallel" if config.get("use_parallel_residual", True) else "sequential",
        },
        "position": rope_from_config(rotary, partial=True),
        "lm_head": {"tied": config.get("tie_word_embeddings", False)} if has_head else None,
        "dropout": config.get("hidden_dropout", 0.0),
        "init": {"std": config.get("initializer_range", 0.02)},
        "pad_token_id": token_id(config, "pad_token_id", vocab, padding_idx=False),  # embed_in has none
        "bos_token_id": token_id(config, "bos_token_id", vocab, 0),
        "eos_token_id": token_id(config, "eos_token_id", vocab, 2),
    })  # fmt: skip


def spec_to_config(spec: ModelSpec) -> dict[str, Any]:
    require("gpt_neox", [("family", spec.family, "decoder")])
    assert isinstance(spec, DecoderSpec)
    stack = spec.stacks()["decoder"]
    attention, ffn, norm, head = stack.attention, stack.ffn, stack.norm, spec.lm_head
    position = as_rotary(stack.position)
    rope = rope_to_config(position, partial=True)
    rope["rope_parameters"]["partial_rotary_factor"] = position.fraction  # NeoX's default is 0.25, not 1
    rope.pop("partial_rotary_factor", None)  # NeoX reads it from rope_parameters (or rotary_pct) only
    return {
        "model_type": "gpt_neox",
        "architectures": [HEADED if head else "GPTNeoXModel"],
        "vocab_size": spec.vocab_size,
        "hidden_size": spec.d_model,
        "num_hidden_layers": stack.num_layers,
        "num_attention_heads": attention.num_heads,
        "intermediate_size": ffn.d_ff,
        "hidden_act": ACTIVATIONS_TO_HF[ffn.activation],
        "max_position_embeddings": spec.max_positions,
        "layer_norm_eps": norm.eps,
        "use_parallel_residual": norm.residual == "parallel",
        "attention_bias": attention.bias,
        **rope,
        "rotary_emb_base": position.theta,  # transformers 4.x
        "rotary_pct": position.fraction,
        "attention_dropout": attention.dropout,
        "hidden_dropout": spec.dropout,
        "initializer_range": spec.init.std,
        "tie_word_embeddings": head.tied if head else False,
        "pad_token_id": spec.pad_token_id,
        "bos_token_id": spec.bos_token_id,
        "eos_token_id": spec.eos_token_id,
    }


def _rules(spec: DecoderSpec, prefix: str) -> list[Rule]:
    """zoo <-> HF names; body names carry ``prefix`` (``gpt_neox.`` under the LM head class)."""
    stack = spec.stacks()["decoder"]
    bias, H = stack.attention.bias, stack.attention.num_heads
    rules = [
        rename("embed.tokens.weight", f"{prefix}embed_in.weight"),
        *layernorm("decoder.final_norm", f"{prefix}final_layer_norm"),
    ]
    for i in range(stack.num_layers):
        zoo, hf = f"decoder.layers.{i}", f"{prefix}layers.{i}"
        rules += [
            *layernorm(f"{zoo}.self_attn_norm", f"{hf}.input_layernorm"),
            # (H, 3, D) rows in HF, (3, H, D) in zoo
            *interleaved_linear(
                f"{zoo}.self_attn.qkv_proj", f"{hf}.attention.query_key_value", groups=H, parts=3, bias=bias
            ),
            *linear(f"{zoo}.self_attn.out_proj", f"{hf}.attention.dense", bias=bias),
            *layernorm(f"{zoo}.ffn_norm", f"{hf}.post_attention_layernorm"),
            *linear(f"{zoo}.ffn.up_proj", f"{hf}.mlp.dense_h_to_4h"),
            *linear(f"{zoo}.ffn.down_proj", f"{hf}.mlp.dense_4h_to_h"),
        ]
    if spec.lm_head is not None and not spec.lm_head.tied:
        rules.append(rename("lm_head.weight", HEAD))
    return rules


_hf_to_zoo, zoo_to_hf = decoder_converters(
    _rules,
    prefix=PREFIX,
    ignore=_OLD_BUFFERS,
    heads=("lm_head.weight", HEAD),  # a tied head may store either
)


def hf_to_zoo(tensors: StateDict, spec: ModelSpec) -> StateDict:
    """As `decoder_converters`', reading a head saved under transformers 5's name ``lm_head`` as well."""
    head = getattr(spec, "lm_head", None)
    if head is not None and not head.tied and HEAD not in tensors and "lm_head.weight" in tensors:
        tensors = {(HEAD if name == "lm_head.weight" else name): t for name, t in tensors.items()}
    return _hf_to_zoo(tensors, spec)


MAPPING = FamilyMapping(
    model_types=("gpt_neox",),
    config_to_spec=config_to_spec,
    spec_to_config=spec_to_config,
    hf_to_zoo=hf_to_zoo,
    zoo_to_hf=zoo_to_hf,
)
