"""OPT (``model_type: opt``; Zhang et al. 2022): ``OPTForCausalLM`` and the headless ``OPTModel``.

transformers' ``models/opt/modeling_opt.py``: BART's decoder without cross-attention. Learned positions with
a fixed offset of 2 (the table has max_position_embeddings + 2 rows), counted over the attention mask so left
padding is skipped (zoo counts them the same way); ReLU; separate q/k/v (zoo fuses them, rows [q; k; v]).
``do_layer_norm_before`` picks pre-norm with a final layer norm (125m, 1.3b and up) or post-norm without one
(350m). ``word_embed_proj_dim`` below ``hidden_size`` (350m) is zoo's `EmbeddingSpec.projection_dim`:

    HF name (under ``model.`` in OPTForCausalLM)          zoo name
    decoder.embed_tokens.weight  (V, E)                   embed.tokens.weight
    decoder.project_in.weight    (C, E), no bias          project_in.weight
    decoder.embed_positions.weight (max_pos + 2, C)       decoder.positions.weight
    decoder.layers.{i}.self_attn.{q,k,v}_proj.*           decoder.layers.{i}.self_attn.qkv_proj.*  fused
    decoder.layers.{i}.self_attn.out_proj.*               decoder.layers.{i}.self_attn.out_proj.*
    decoder.layers.{i}.self_attn_layer_norm.*             decoder.layers.{i}.self_attn_norm.*
    decoder.layers.{i}.fc1.* / fc2.*                      decoder.layers.{i}.ffn.up_proj.* / down_proj.*
    decoder.layers.{i}.final_layer_norm.*  (the FFN's)    decoder.layers.{i}.ffn_norm.*
    decoder.final_layer_norm.*   (pre-norm only)          decoder.final_norm.*
    decoder.project_out.weight   (E, C), no bias          project_out.weight
    lm_head.weight (untied only; tied: the token table)   lm_head.weight

Mapped config fields: ``enable_bias`` (attention and FFN biases together), ``_remove_final_layer_norm``
(pre-norm without the final norm). Refused: ``layer_norm_elementwise_affine: false`` (zoo's LayerNorm always
has a weight and bias) and ``layerdrop`` (zoo has no LayerDrop). Deviation, training only: transformers'
OPT applies no dropout to the embeddings; zoo's one ``dropout`` also covers them.
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
    reject,
    rename,
    require,
    token_id,
)
from zoo.spec import DecoderSpec, ModelSpec, parse_spec

PREFIX = "model."
HEADED = "OPTForCausalLM"
POSITION_OFFSET = 2  # OPTLearnedPositionalEmbedding's fixed offset
_LAYERNORM_EPS = 1e-5  # nn.LayerNorm's default; OPT configs have no eps field


def config_to_spec(config: dict[str, Any], names: set[str]) -> ModelSpec:
    reject(config, "layer_norm_elementwise_affine", True, why="zoo's LayerNorm always has a weight and bias")
    reject(config, "layerdrop", 0.0, why="zoo has no LayerDrop")
    has_head = has_lm_head(config, names, headed=HEADED, prefix=PREFIX)
    d_model, vocab = config.get("hidden_size", 768), config.get("vocab_size", 50272)
    projection = config.get("word_embed_proj_dim") or d_model
    pre_norm = config.get("do_layer_norm_before", True) is not False
    bias = config.get("enable_bias", True) is not False
    activation = activation_from_hf(config.get("activation_function", "relu"), field="activation_function")
    return parse_spec({
        "family": "decoder",
        "vocab_size": vocab,
        "d_model": d_model,
        "num_layers": config.get("num_hidden_layers", 12),
        "max_positions": config.get("max_position_embeddings", 2048),
        "attention": {
            "num_heads": config.get("num_attention_heads", 12),
            "bias": bias,
            "dropout": config.get("attention_dropout", 0.0),
        },
        "ffn": {"d_ff": config.get("ffn_dim", 3072), "activation": activation, "bias": bias},
        "norm": {
            "kind": "layernorm",
            "eps": _LAYERNORM_EPS,
            "placement": "pre" if pre_norm else "post",
            "final": pre_norm and not config.get("_remove_final_layer_norm", False),
        },
        "position": {"kind": "learned", "offset": POSITION_OFFSET},
        "embedding": {"projection_dim": projection if projection != d_model else None},
        "lm_head": {"tied": config.get("tie_word_embeddings", True) is not False} if has_head else None,
        "dropout": config.get("dropout", 0.1),
        "init": {"std": config.get("init_std", 0.02)},
        "pad_token_id": token_id(config, "pad_token_id", vocab, 1),
        "bos_token_id": token_id(config, "bos_token_id", vocab, 2),
        "eos_token_id": token_id(config, "eos_token_id", vocab, 2),
    })  # fmt: skip


def spec_to_config(spec: ModelSpec) -> dict[str, Any]:
    require("opt", [("family", spec.family, "decoder")])
    assert isinstance(spec, DecoderSpec)
    stack = spec.stacks()["decoder"]
    attention, ffn, norm, head = stack.attention, stack.ffn, stack.norm, spec.lm_head
    return {
        "model_type": "opt",
        "architectures": [HEADED if head else "OPTModel"],
        "vocab_size": spec.vocab_size,
        "hidden_size": spec.d_model,
        "word_embed_proj_dim": spec.embedding_dim,
        "num_hidden_layers": stack.num_layers,
        "num_attention_heads": attention.num_heads,
        "ffn_dim": ffn.d_ff,
        "max_position_embeddings": spec.max_positions,
        "activation_function": ACTIVATIONS_TO_HF[ffn.activation],
        "do_layer_norm_before": norm.placement == "pre",
        "_remove_final_layer_norm": norm.placement == "pre" and not norm.has_final,
        "enable_bias": attention.bias,
        "layer_norm_elementwise_affine": True,
        "dropout": spec.dropout,
        "attention_dropout": attention.dropout,
        "layerdrop": 0.0,
        "init_std": spec.init.std,
        "tie_word_embeddings": head.tied if head else True,
        "pad_token_id": spec.pad_token_id,
        "bos_token_id": spec.bos_token_id,
        "eos_token_id": spec.eos_token_id,
    }


def _rules(spec: DecoderSpec, prefix: str) -> list[Rule]:
    """zoo <-> HF names; body names carry ``prefix`` (``model.`` under ``OPTForCausalLM``)."""
    stack = spec.stacks()["decoder"]
    width, bias = spec.d_model, stack.attention.bias
    body = f"{prefix}decoder"
    rules = [
        rename("embed.tokens.weight", f"{body}.embed_tokens.weight"),
        rename("decoder.positions.weight", f"{body}.embed_positions.weight"),
    ]
    if spec.embedding.projection_dim is not None:
        rules += linear("project_in", f"{body}.project_in", bias=False)
        rules += linear("project_out", f"{body}.project_out", bias=False)
    if stack.norm.has_final:
        rules += layernorm("decoder.final_norm", f"{body}.final_layer_norm")
    for i in range(stack.num_layers):
        zoo, hf = f"decoder.layers.{i}", f"{body}.layers.{i}"
        qkv = [f"{hf}.self_attn.{x}_proj" for x in "qkv"]
        rules += fused_linear(f"{zoo}.self_attn.qkv_proj", qkv, (width, width, width), bias=bias)
        rules += linear(f"{zoo}.self_attn.out_proj", f"{hf}.self_attn.out_proj", bias=bias)
        rules += layernorm(f"{zoo}.self_attn_norm", f"{hf}.self_attn_layer_norm")
        rules += linear(f"{zoo}.ffn.up_proj", f"{hf}.fc1", bias=bias)
        rules += linear(f"{zoo}.ffn.down_proj", f"{hf}.fc2", bias=bias)
        rules += layernorm(f"{zoo}.ffn_norm", f"{hf}.final_layer_norm")
    if spec.lm_head is not None and not spec.lm_head.tied:
        rules.append(rename("lm_head.weight", "lm_head.weight"))
    return rules


# OPTForCausalLM saves the body under ``model.``; facebook's original files and OPTModel do not
hf_to_zoo, zoo_to_hf = decoder_converters(_rules, prefix=PREFIX)


MAPPING = FamilyMapping(
    model_types=("opt",),
    config_to_spec=config_to_spec,
    spec_to_config=spec_to_config,
    hf_to_zoo=hf_to_zoo,
    zoo_to_hf=zoo_to_hf,
)
