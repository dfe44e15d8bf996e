"""CTRL (``model_type: ctrl``; Keskar et al. 2019): ``CTRLLMHeadModel`` and the headless ``CTRLModel``.

transformers' ``models/ctrl/modeling_ctrl.py``: token embeddings scaled by sqrt(d_model) plus fixed sinusoids
in the half layout (all sines, then all cosines, angle rates 10000^(-2i/d): zoo's ``layout: half``), pre-norm
LayerNorm with a final norm, ReLU, separate q/k/v (zoo fuses them, rows [q; k; v]) and an LM head tied to the
embeddings with a learned bias of its own (zoo's ``lm_head.bias``). The sinusoid table is not stored.

    HF name (under ``transformer.`` in CTRLLMHeadModel)   zoo name
    w.weight                                              embed.tokens.weight
    h.{i}.multi_head_attention.W{q,k,v}.*                 decoder.layers.{i}.self_attn.qkv_proj.*  fused
    h.{i}.multi_head_attention.dense.*                    decoder.layers.{i}.self_attn.out_proj.*
    h.{i}.layernorm1.* / layernorm2.*                     decoder.layers.{i}.self_attn_norm.* / ffn_norm.*
    h.{i}.ffn.0.* / ffn.2.*                               decoder.layers.{i}.ffn.up_proj.* / down_proj.*
    layernorm.*                                           decoder.final_norm.*
    lm_head.bias                                          lm_head.bias
    lm_head.weight (untied only)                          lm_head.weight

transformers' CTRL layers use a fixed LayerNorm eps of 1e-6 and only its final norm reads
``layer_norm_epsilon``; zoo has one eps per stack, so any other ``layer_norm_epsilon`` is refused.
Positions: ``CTRLModel.forward`` counts them 0, 1, ... (``arange``) unless ``position_ids`` are passed, while
transformers' ``generate`` passes them counted over the attention mask, as zoo always counts them. Both agree
on right-padded batches and in generation; a left-padded forward call to transformers without
``position_ids`` shifts the real tokens' positions. Attention dropout: transformers' CTRL has none.
"""

from __future__ import annotations

from typing import Any

from zoo.io.hf.common import (
    FamilyMapping,
    Rule,
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

PREFIX = "transformer."
HEADED = "CTRLLMHeadModel"
_LAYERNORM_EPS = 1e-6  # hard-coded in transformers' CTRL EncoderLayer
_IGNORED = (r"pos_encoding",)  # the sinusoid buffer, if an old file stored it: recomputed, never read


def config_to_spec(config: dict[str, Any], names: set[str]) -> ModelSpec:
    reject(
        config, "layer_norm_epsilon", _LAYERNORM_EPS,
        why="CTRL's layer norms use a fixed 1e-6 and only its final norm reads layer_norm_epsilon; "
        "zoo has one eps per stack",
    )  # fmt: skip
    has_head = has_lm_head(config, names, headed=HEADED, prefix=PREFIX) or "lm_head.bias" in names
    vocab = config.get("vocab_size", 246534)
    return parse_spec({
        "family": "decoder",
        "vocab_size": vocab,
        "d_model": config.get("n_embd", 1280),
        "num_layers": config.get("n_layer", 48),
        "max_positions": config.get("n_positions", 256),
        "attention": {"num_heads": config.get("n_head", 16)},
        "ffn": {"d_ff": config.get("dff", 8192), "activation": "relu"},
        "norm": {"kind": "layernorm", "eps": _LAYERNORM_EPS, "placement": "pre"},
        "position": {"kind": "sinusoidal", "layout": "half"},
        "embedding": {"scale": True},
        "lm_head": {"tied": config.get("tie_word_embeddings", True) is not False, "bias": True} if has_head else None,
        "dropout": config.get("resid_pdrop", 0.1),
        "init": {"std": config.get("initializer_range", 0.02)},
        "pad_token_id": token_id(config, "pad_token_id", vocab, padding_idx=False),  # w has none
        "bos_token_id": token_id(config, "bos_token_id", vocab),
        "eos_token_id": token_id(config, "eos_token_id", vocab),
    })  # fmt: skip


def spec_to_config(spec: ModelSpec) -> dict[str, Any]:
    require("ctrl", [("family", spec.family, "decoder")])
    assert isinstance(spec, DecoderSpec)
    stack = spec.stacks()["decoder"]
    attention, ffn, head = stack.attention, stack.ffn, spec.lm_head
    return {
        "model_type": "ctrl",
        "architectures": [HEADED if head else "CTRLModel"],
        "vocab_size": spec.vocab_size,
        "n_embd": spec.d_model,
        "n_layer": stack.num_layers,
        "n_head": attention.num_heads,
        "dff": ffn.d_ff,
        "n_positions": spec.max_positions,
        "layer_norm_epsilon": _LAYERNORM_EPS,  # CTRL's only eps: another norm.eps reads back as this
        "resid_pdrop": spec.dropout,
        "embd_pdrop": spec.dropout,
        "initializer_range": spec.init.std,
        "tie_word_embeddings": head.tied if head else True,
        "pad_token_id": spec.pad_token_id,
        "bos_token_id": spec.bos_token_id,
        "eos_token_id": spec.eos_token_id,
    }


def _rules(spec: DecoderSpec, prefix: str) -> list[Rule]:
    """zoo <-> HF names; body names carry ``prefix`` (``transformer.`` under ``CTRLLMHeadModel``)."""
    stack = spec.stacks()["decoder"]
    width = spec.d_model
    rules = [
        rename("embed.tokens.weight", f"{prefix}w.weight"),
        *layernorm("decoder.final_norm", f"{prefix}layernorm"),
    ]
    for i in range(stack.num_layers):
        zoo, hf = f"decoder.layers.{i}", f"{prefix}h.{i}"
        attn = f"{hf}.multi_head_attention"
        rules += fused_linear(f"{zoo}.self_attn.qkv_proj", [f"{attn}.W{x}" for x in "qkv"], (width,) * 3)
        rules += linear(f"{zoo}.self_attn.out_proj", f"{attn}.dense")
        rules += layernorm(f"{zoo}.self_attn_norm", f"{hf}.layernorm1")
        rules += layernorm(f"{zoo}.ffn_norm", f"{hf}.layernorm2")
        rules += linear(f"{zoo}.ffn.up_proj", f"{hf}.ffn.0")  # nn.Sequential(Linear, ReLU, Linear)
        rules += linear(f"{zoo}.ffn.down_proj", f"{hf}.ffn.2")
    if spec.lm_head is not None:
        rules.append(rename("lm_head.bias", "lm_head.bias"))
        if not spec.lm_head.tied:
            rules.append(rename("lm_head.weight", "lm_head.weight"))
    return rules


hf_to_zoo, zoo_to_hf = decoder_converters(_rules, prefix=PREFIX, ignore=_IGNORED)


MAPPING = FamilyMapping(
    model_types=("ctrl",),
    config_to_spec=config_to_spec,
    spec_to_config=spec_to_config,
    hf_to_zoo=hf_to_zoo,
    zoo_to_hf=zoo_to_hf,
)
