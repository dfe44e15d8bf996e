"""Hugging Face T5 (v1.0 and v1.1) <-> zoo: ``T5ForConditionalGeneration`` checkpoints (Raffel et al. 2020).

    HF name (s = encoder | decoder)                          zoo name
    shared.weight (= {s}.embed_tokens.weight)                embed.tokens.weight
    {s}.block.0.layer.0.SelfAttention.relative_attention_bias.weight
                                                             {s}.positions.weight          (buckets, H)
    {s}.block.{i}.layer.0.SelfAttention.{q,k,v}.weight       {s}.layers.{i}.self_attn.qkv_proj.weight  fused [q; k; v]
    {s}.block.{i}.layer.0.SelfAttention.o.weight             {s}.layers.{i}.self_attn.out_proj.weight
    {s}.block.{i}.layer.0.layer_norm.weight                  {s}.layers.{i}.self_attn_norm.weight
    decoder.block.{i}.layer.1.EncDecAttention.q.weight       decoder.layers.{i}.cross_attn.q_proj.weight
    decoder.block.{i}.layer.1.EncDecAttention.{k,v}.weight   decoder.layers.{i}.cross_attn.kv_proj.weight  fused [k; v]
    decoder.block.{i}.layer.1.EncDecAttention.o.weight       decoder.layers.{i}.cross_attn.out_proj.weight
    decoder.block.{i}.layer.1.layer_norm.weight              decoder.layers.{i}.cross_attn_norm.weight
    {s}.block.{i}.layer.{f}.DenseReluDense.wi.weight         {s}.layers.{i}.ffn.up_proj.weight    (f = 1 enc, 2 dec)
    {s}.block.{i}.layer.{f}.DenseReluDense.wi_{0,1}.weight   {s}.layers.{i}.ffn.up_proj.weight    fused [gate; up]
    {s}.block.{i}.layer.{f}.DenseReluDense.wo.weight         {s}.layers.{i}.ffn.down_proj.weight
    {s}.block.{i}.layer.{f}.layer_norm.weight                {s}.layers.{i}.ffn_norm.weight
    {s}.final_layer_norm.weight                              {s}.final_norm.weight
    lm_head.weight (v1.1 only)                               lm_head.weight

v1.0 and v1.1 differ in the FFN (ReLU vs gated-GELU with ``gelu_new`` = our ``gelu_tanh``) and the head:
v1.0 ties it to ``shared`` and scales the last hidden state by d_model**-0.5 (our ``lm_head.rescale_tied``);
v1.1 has its own ``lm_head`` and no rescale. transformers 5.x always ties T5 in the config and records the
rescale as ``scale_decoder_outputs`` (from ``tie_word_embeddings`` in older configs); whether the head is its
own tensor is read from the checkpoint. T5 does not scale attention logits (``attention.scaled: false``) and
its ``d_kv`` is independent of d_model / num_heads. Only layer 0 of each stack holds the relative bias table.

mT5 (Xue et al. 2021, ``model_type: mt5``) is T5 v1.1's layout and wiring under another name, with larger
defaults (a 250k vocabulary, gated GELU). transformers 5.x never rescales mT5's output, whatever the config
says (4.x rescaled a tied one), so an mT5 import has ``rescale_tied: false`` and an export with the rescale is
refused; its head is tied only when the checkpoint stores none (or an equal copy). umT5 (Chung et al. 2023,
``model_type: umt5``) is mT5 with a relative bias table in every layer's self-attention, not only layer 0's
(``position.per_layer: true``):

    {s}.block.{i}.layer.0.SelfAttention.relative_attention_bias.weight (each i)
                                                             {s}.positions.weight[i]       (L, buckets, H)

The rows that differ:

    model_type   defaults for fields left out                    tied head rescaled   bias tables   architecture
    t5           32k vocab, relu, 6 layers, 8 heads, d_ff 2048   as the config says   one/stack     T5ForConditionalGeneration
    mt5          250k vocab, gated-gelu, 8 layers, 6 heads, 1024 never                one/stack     MT5ForConditionalGeneration
    umt5         as mt5                                          as the config says   one/layer     UMT5ForConditionalGeneration
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from zoo.io.hf.common import (
    FamilyMapping,
    HFError,
    Rule,
    StateDict,
    activation_from_hf,
    fused,
    fused_linear,
    layernorm,
    linear,
    rename,
    require,
    rules_to_hf,
    rules_to_zoo,
    token_id,
)
from zoo.spec import EncoderDecoderSpec, ModelSpec, RelativeBiasPositions, parse_spec

# ours -> feed_forward_proj. "gated-gelu" means gelu_new (tanh) in transformers, so exact GELU is gelu_python.
_PLAIN_FFN = {"relu": "relu", "gelu": "gelu", "gelu_tanh": "gelu_new", "silu": "silu"}
_GATED_FFN = {
    "relu": "gated-relu",
    "gelu": "gated-gelu_python",
    "gelu_tanh": "gated-gelu",
    "silu": "gated-silu",
}
_ALIASES = {"gelu_python": "gelu", "gelu_fast": "gelu_new"}  # same functions as these, other kernels

_EMBED_ALIASES = ("shared.weight", "encoder.embed_tokens.weight", "decoder.embed_tokens.weight")
# Present in some old checkpoints, never read by transformers either.
_UNUSED = (r"decoder\.block\.0\.layer\.1\.EncDecAttention\.relative_attention_bias\.weight",)


@dataclass(frozen=True)
class Variant:
    """One Hugging Face model type with T5's tensor layout (a row of the module docstring's table)."""

    model_type: str
    architecture: str
    defaults: dict[str, Any]  # the config class's defaults, for the fields a config.json leaves out
    rescales: bool  # the config decides whether a tied head is rescaled by d_model**-0.5 (else: never)
    per_layer_bias: bool = False  # every layer's self-attention has its own relative bias table


_T5_DEFAULTS = {
    "vocab_size": 32128, "d_ff": 2048, "num_layers": 6, "num_heads": 8, "feed_forward_proj": "relu",
}  # fmt: skip
_MT5_DEFAULTS = {
    "vocab_size": 250112, "d_ff": 1024, "num_layers": 8, "num_heads": 6, "feed_forward_proj": "gated-gelu",
}  # fmt: skip
T5 = Variant("t5", "T5ForConditionalGeneration", _T5_DEFAULTS, rescales=True)
MT5 = Variant("mt5", "MT5ForConditionalGeneration", _MT5_DEFAULTS, rescales=False)
UMT5 = Variant("umt5", "UMT5ForConditionalGeneration", _MT5_DEFAULTS, rescales=True, per_layer_bias=True)


# -- config <-> spec ------------------------------------------------------------------------------------


def _activation(config: dict[str, Any], default: str) -> tuple[str, bool]:
    proj = config.get("feed_forward_proj", default)
    parts = proj.split("-")
    gated = parts[0] == "gated"
    if len(parts) > 2 or (len(parts) == 2 and not gated):
        raise HFError(f"config.json feed_forward_proj={proj!r} is not '<act>' or 'gated-<act>'")
    name = "gelu_new" if proj == "gated-gelu" else parts[-1]  # transformers' own special case
    return activation_from_hf(_ALIASES.get(name, name), field="feed_forward_proj"), gated


def config_to_spec(config: dict[str, Any], names: set[str], variant: Variant = T5) -> ModelSpec:
    """A T5 ``config.json`` (v1.0 or v1.1, or another `Variant`'s) -> an encoder-decoder spec."""
    defaults = variant.defaults
    activation, gated = _activation(config, defaults["feed_forward_proj"])
    dropout = config.get("dropout_rate", 0.1)
    vocab = config.get("vocab_size", defaults["vocab_size"])
    # transformers: rescale unless the config says tie_word_embeddings=false (5.x saves the result).
    rescale = variant.rescales and config.get(
        "scale_decoder_outputs", config.get("tie_word_embeddings", True) is not False
    )
    num_layers = config.get("num_layers", defaults["num_layers"])
    decoder_layers = config.get("num_decoder_layers") or num_layers
    return parse_spec({
        "family": "encoder-decoder",
        "vocab_size": vocab,
        "d_model": config.get("d_model", 512),
        "num_layers": num_layers,
        "decoder": {"num_layers": decoder_layers} if decoder_layers != num_layers else {},
        "max_positions": config.get("n_positions", 512),
        "attention": {
            "num_heads": config.get("num_heads", defaults["num_heads"]),
            "head_dim": config.get("d_kv", 64),
            "bias": False,
            "scaled": False,
            "dropout": dropout,
        },
        "ffn": {
            "d_ff": config.get("d_ff", defaults["d_ff"]),
            "activation": activation,
            "gated": gated,
            "bias": False,
            "dropout": dropout,
        },
        "norm": {"kind": "rmsnorm", "eps": config.get("layer_norm_epsilon", 1e-6), "placement": "pre"},
        "position": {
            "kind": "relative_bias",
            "num_buckets": config.get("relative_attention_num_buckets", 32),
            "max_distance": config.get("relative_attention_max_distance", 128),
            "per_layer": variant.per_layer_bias,
        },
        # an lm_head tensor of its own means untied (v1.1); a v1.0 copy must equal shared (checked on load)
        "lm_head": {"tied": rescale or "lm_head.weight" not in names, "rescale_tied": rescale},
        "dropout": dropout,
        "init": {"scheme": "t5"},
        "pad_token_id": token_id(config, "pad_token_id", vocab, 0, padding_idx=False),  # shared has none
        "eos_token_id": token_id(config, "eos_token_id", vocab, 1),
        "decoder_start_token_id": token_id(config, "decoder_start_token_id", vocab, 0),
    })  # fmt: skip


def spec_to_config(spec: ModelSpec, variant: Variant = T5) -> dict[str, Any]:
    """A zoo spec with T5's wiring -> a ``T5ForConditionalGeneration`` (or the variant's) config.json dict.

    Writes the encoder's blocks: HF T5 has one of each for both stacks (and one ``dropout_rate``: the spec's
    top-level ``dropout`` is written); what it cannot hold the export guard names (`zoo.io.hf.faithful`).
    """
    family = variant.model_type
    require(family, [("family", spec.family, "encoder-decoder")])
    assert isinstance(spec, EncoderDecoderSpec)
    encoder, decoder = spec.stacks().values()
    ffn, attention, head = encoder.ffn, encoder.attention, spec.lm_head
    # another kind of positions is written as T5's buckets, which the read-back then names
    position = (
        encoder.position if isinstance(encoder.position, RelativeBiasPositions) else RelativeBiasPositions()
    )
    config: dict[str, Any] = {
        "architectures": [variant.architecture],
        "model_type": family,
        "vocab_size": spec.vocab_size,
        "d_model": spec.d_model,
        "d_kv": attention.resolved_head_dim(spec.d_model),
        "d_ff": ffn.d_ff,
        "num_layers": encoder.num_layers,
        "num_decoder_layers": decoder.num_layers,
        "num_heads": attention.num_heads,
        "relative_attention_num_buckets": position.num_buckets,
        "relative_attention_max_distance": position.max_distance,
        "dropout_rate": spec.dropout,
        "layer_norm_epsilon": encoder.norm.eps,
        "feed_forward_proj": (_GATED_FFN if ffn.gated else _PLAIN_FFN)[ffn.activation],
        # transformers 4.x reads the rescale from tie_word_embeddings, 5.x from scale_decoder_outputs. mT5
        # writes false (its rescale is refused): 4.x then reads an own head, which `zoo_to_hf` always stores.
        "tie_word_embeddings": head.rescale_tied,
        "is_encoder_decoder": True,
        "n_positions": spec.max_positions,
        "pad_token_id": spec.pad_token_id,
        "eos_token_id": spec.eos_token_id,
        "decoder_start_token_id": spec.start_token_id,
    }
    if variant.rescales:
        config["scale_decoder_outputs"] = head.rescale_tied
    return config


# -- tensors ------------------------------------------------------------------------------------------


def _rules(spec: EncoderDecoderSpec) -> list[Rule]:
    """One row per zoo tensor: the HF tensor(s) it is made of."""
    rules = [rename("embed.tokens.weight", "shared.weight")]
    for name, stack in spec.stacks().items():
        H, K = stack.attention.num_heads, stack.attention.kv_heads
        D, F = stack.attention.resolved_head_dim(spec.d_model), stack.ffn.d_ff
        bias_table = "{}.block.{}.layer.0.SelfAttention.relative_attention_bias.weight".format
        position = stack.position
        if isinstance(position, RelativeBiasPositions) and position.per_layer:  # umT5: every layer's table
            tables = [
                bias_table(name, i) for i in range(stack.num_layers)
            ]  # stacked as (L * buckets, H) rows
            rules += [fused(f"{name}.positions.weight", tables, [position.num_buckets] * stack.num_layers)]
        elif isinstance(position, RelativeBiasPositions):
            rules += [rename(f"{name}.positions.weight", bias_table(name, 0))]
        rules += layernorm(f"{name}.final_norm", f"{name}.final_layer_norm", bias=False)
        for i in range(stack.num_layers):
            hf, zoo = f"{name}.block.{i}.layer", f"{name}.layers.{i}"
            attn = f"{hf}.0.SelfAttention"
            rules += fused_linear(
                f"{zoo}.self_attn.qkv_proj", [f"{attn}.{x}" for x in "qkv"], (H * D, K * D, K * D), bias=False
            )
            rules += linear(f"{zoo}.self_attn.out_proj", f"{attn}.o", bias=False)
            rules += layernorm(f"{zoo}.self_attn_norm", f"{hf}.0.layer_norm", bias=False)
            ffn_index = 1
            if stack.cross_attention is not None:
                cross = f"{hf}.1.EncDecAttention"
                rules += linear(f"{zoo}.cross_attn.q_proj", f"{cross}.q", bias=False)
                rules += fused_linear(
                    f"{zoo}.cross_attn.kv_proj", [f"{cross}.k", f"{cross}.v"], (K * D, K * D), bias=False
                )
                rules += linear(f"{zoo}.cross_attn.out_proj", f"{cross}.o", bias=False)
                rules += layernorm(f"{zoo}.cross_attn_norm", f"{hf}.1.layer_norm", bias=False)
                ffn_index = 2
            ff = f"{hf}.{ffn_index}.DenseReluDense"
            if stack.ffn.gated:  # zoo's up_proj rows: [gate (wi_0); up (wi_1)]
                rules += fused_linear(f"{zoo}.ffn.up_proj", [f"{ff}.wi_0", f"{ff}.wi_1"], (F, F), bias=False)
            else:
                rules += linear(f"{zoo}.ffn.up_proj", f"{ff}.wi", bias=False)
            rules += linear(f"{zoo}.ffn.down_proj", f"{ff}.wo", bias=False)
            rules += layernorm(f"{zoo}.ffn_norm", f"{hf}.{ffn_index}.layer_norm", bias=False)
    if not spec.lm_head.tied:
        rules += linear("lm_head", "lm_head", bias=False)
    return rules


def hf_to_zoo(tensors: StateDict, spec: ModelSpec) -> StateDict:
    """A T5 state dict -> zoo's. Raises naming a missing, unexpected or inconsistent tensor."""
    assert isinstance(spec, EncoderDecoderSpec)
    present = [name for name in _EMBED_ALIASES if name in tensors]
    if not present:
        raise HFError(f"the checkpoint has no token embedding (expected one of {', '.join(_EMBED_ALIASES)})")
    tensors = dict(tensors)
    embed = tensors["shared.weight"] = tensors[present[0]]
    # copies of the one table: the stacks' aliases, and a tied head's (older files store it)
    copies = [*_EMBED_ALIASES[1:], *(["lm_head.weight"] if spec.lm_head.tied else [])]
    for name in copies:
        if name in tensors and not torch.equal(tensors.pop(name), embed):
            raise HFError(
                f"{name} differs from {present[0]}, but config.json describes one shared table "
                "(a v1.1 model with its own lm_head needs tie_word_embeddings: false)"
            )
    out = rules_to_zoo(_rules(spec), tensors, ignore=_UNUSED)
    for name, stack in spec.stacks().items():  # per-layer tables: (L * buckets, H) -> (L, buckets, H)
        table = out[f"{name}.positions.weight"]
        if getattr(stack.position, "per_layer", False):
            out[f"{name}.positions.weight"] = table.reshape(stack.num_layers, -1, table.shape[-1])
    return out


def zoo_to_hf(tensors: StateDict, spec: ModelSpec) -> StateDict:
    """zoo's state dict -> what ``T5ForConditionalGeneration.from_pretrained`` loads with nothing missing."""
    assert isinstance(spec, EncoderDecoderSpec)
    tensors = tensors.copy()  # a NamesOnly copy stays one
    for name in spec.stacks():  # per-layer tables (L, buckets, H) -> (L * buckets, H), split by `_rules`
        if (table := tensors.get(f"{name}.positions.weight")) is not None:  # none: a spec T5 cannot hold
            tensors[f"{name}.positions.weight"] = table.reshape(-1, table.shape[-1])
    out = rules_to_hf(_rules(spec), tensors)
    if spec.lm_head.tied and not spec.lm_head.rescale_tied:
        # A tied head without the rescale is tie_word_embeddings=false in the config, which transformers 4.x
        # reads as untied: store the head too (equal values, so 5.x ties it again).
        out["lm_head.weight"] = out["shared.weight"].clone()
    return out


def _stored_head(spec: ModelSpec) -> ModelSpec:
    """What an export describes: a tied head without the rescale is stored as its own copy of the table
    (`zoo_to_hf`), which reads back untied: the same logits."""
    head = getattr(spec, "lm_head", None)
    if head is not None and head.tied and not head.rescale_tied:
        return spec.override(**{"lm_head.tied": False})
    return spec


def _mapping(variant: Variant) -> FamilyMapping:
    return FamilyMapping(
        model_types=(variant.model_type,),
        config_to_spec=lambda config, names: config_to_spec(config, names, variant),
        spec_to_config=lambda spec: spec_to_config(spec, variant),
        hf_to_zoo=hf_to_zoo,
        zoo_to_hf=zoo_to_hf,
        exported_as=_stored_head,
    )


MAPPINGS: list[FamilyMapping] = [_mapping(T5), _mapping(MT5), _mapping(UMT5)]
