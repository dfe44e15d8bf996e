"""Hugging Face BART and Marian <-> zoo: ``BartForConditionalGeneration`` and ``MarianMTModel`` checkpoints.

Both are the post-norm 2017 Transformer with biases everywhere; they differ only around the embeddings:

                        BART (Lewis et al. 2020)                 Marian (Junczys-Dowmunt et al. 2018)
    positions           learned, offset 2: (max_pos + 2, C)      sinusoidal, sines then cosines ("half")
    embedding norm      layernorm_embedding                      none
    scale_embedding     usually false                            usually true
    vocabularies        one (``shared``)                         one, or source/target apart when
                                                                 share_encoder_decoder_embeddings is false

    HF name (s = encoder | decoder; base model under ``model.``)   zoo name
    model.shared.weight (= model.{s}.embed_tokens.weight)            embed.tokens.weight
    model.encoder.embed_tokens.weight (Marian, separate vocabs)      source_embed.tokens.weight
    model.decoder.embed_tokens.weight (Marian, separate vocabs)      embed.tokens.weight
    model.{s}.embed_positions.weight (BART)                          {s}.positions.weight
    model.{s}.layernorm_embedding.* (BART)                           {s}.embed_norm.*
    model.{s}.layers.{i}.self_attn.{q,k,v}_proj.*                    {s}.layers.{i}.self_attn.qkv_proj.*  fused [q; k; v]
    model.{s}.layers.{i}.self_attn.out_proj.*                        {s}.layers.{i}.self_attn.out_proj.*
    model.{s}.layers.{i}.self_attn_layer_norm.*                      {s}.layers.{i}.self_attn_norm.*
    model.decoder.layers.{i}.encoder_attn.q_proj.*                   decoder.layers.{i}.cross_attn.q_proj.*
    model.decoder.layers.{i}.encoder_attn.{k,v}_proj.*               decoder.layers.{i}.cross_attn.kv_proj.*  fused [k; v]
    model.decoder.layers.{i}.encoder_attn.out_proj.*                 decoder.layers.{i}.cross_attn.out_proj.*
    model.decoder.layers.{i}.encoder_attn_layer_norm.*               decoder.layers.{i}.cross_attn_norm.*
    model.{s}.layers.{i}.fc1.* / fc2.*                               {s}.layers.{i}.ffn.up_proj.* / down_proj.*
    model.{s}.layers.{i}.final_layer_norm.*                          {s}.layers.{i}.ffn_norm.*
    final_logits_bias (1, V)                                         lm_head.final_logits_bias
    lm_head.weight (untied only)                                     lm_head.weight

A headless ``BartModel`` checkpoint (no ``model.`` prefix, no final_logits_bias) imports too: its logits bias
is zero. Marian's sinusoid table is not trained: none is written on export (transformers recomputes it), and
a stored one is read on import only to check that it is the sinusoids (transformers would use it as stored:
`check_stored_sinusoids`). transformers counts BART/Marian positions from 0 with ``arange``; zoo
counts them over the attention mask, which is the same for right-padded batches.

The paper's Transformer (``transformer-*`` presets: sinusoids in the "interleaved" layout, sin/cos
alternating) exports as Marian exactly. Marian's table is the same sines and cosines with the columns in
another order, ``half[:, k] = interleaved[:, perm[k]]`` with ``perm = [0, 2, 4, ..., 1, 3, 5, ...]``, and
renaming the residual stream's coordinates the same way gives the same network: every tensor along the
stream (d_model) takes that order, nothing else changes.

    embeddings, lm_head (V, C)                       columns permuted
    q/k/v, cross q/kv, fc1 weights (out, C)          columns permuted (they read the stream)
    out_proj, fc2 weights (C, in) and biases (C,)    rows permuted (they write to it)
    LayerNorm weights and biases (C,)                permuted (mean and variance ignore the order)
    q/k/v and fc1 biases, final_logits_bias         unchanged (heads and FFN units keep their order)

A re-import (`zoo.from_hf`) reads Marian's layout: a "half" model with the same logits whose residual
coordinates are the permuted ones.
"""

from __future__ import annotations

import re
from typing import Any

import torch

from zoo.blocks.position import sinusoidal_table
from zoo.io.hf.common import (
    ACTIVATIONS_TO_HF,
    FamilyMapping,
    HFError,
    NamesOnly,
    Rule,
    StateDict,
    activation_from_hf,
    fused_linear,
    layernorm,
    linear,
    rename,
    require,
    rules_to_hf,
    rules_to_zoo,
    token_id,
    with_logits_bias,
)
from zoo.spec import EncoderDecoderSpec, ModelSpec, SinusoidalPositions, parse_spec

_LAYERNORM_EPS = 1e-5  # nn.LayerNorm's default; BART and Marian configs have no eps field
_TOP_LEVEL = ("final_logits_bias", "lm_head.weight")  # outside the ``model.`` base model
_IGNORED = (r"model\.(encoder|decoder)\.version",)
_SINUSOIDS = r"model\.(encoder|decoder)\.embed_positions\.weight"  # Marian's fixed table
# every field of the spec (model_dump compares all of them): the paper's frequencies, no row offset
_HALF = SinusoidalPositions(layout="half").model_dump()
_INTERLEAVED = SinusoidalPositions(layout="interleaved").model_dump()  # exported as _HALF, permuted
# Which axis of each zoo tensor of a BART/Marian-shaped model runs along the residual stream (d_model);
# None: the tensor does not touch it. Every tensor must match one row: a new one cannot be left unpermuted.
_RESIDUAL_AXIS: tuple[tuple[re.Pattern[str], int | None], ...] = tuple(
    (re.compile(pattern), axis)
    for pattern, axis in (
        (r"(source_)?embed\.tokens\.weight|lm_head\.weight", 1),  # (V, C)
        (r".+\.(qkv_proj|q_proj|kv_proj|up_proj)\.weight", 1),  # (out, C): reads the stream
        (r".+\.(out_proj|down_proj)\.(weight|bias)", 0),  # (C, in), (C,): writes to it
        (r".+_norm\.(weight|bias)", 0),  # (C,)
        (r".+\.(qkv_proj|q_proj|kv_proj|up_proj)\.bias|lm_head\.final_logits_bias", None),
    )
)


# -- config <-> spec ------------------------------------------------------------------------------------


def config_to_spec(config: dict[str, Any], names: set[str], *, marian: bool) -> ModelSpec:
    activation = activation_from_hf(config.get("activation_function", "gelu"), field="activation_function")

    def stack(side: str) -> dict[str, Any]:
        return {
            "num_layers": config.get(f"{side}_layers", 12),
            "attention": {
                "num_heads": config.get(f"{side}_attention_heads", 16),
                "dropout": config.get("attention_dropout", 0.0),
            },
            "ffn": {
                "d_ff": config.get(f"{side}_ffn_dim", 4096),
                "activation": activation,
                "dropout": config.get("activation_dropout", 0.0),
            },
        }

    # model-level blocks from the encoder; the decoder overrides only what differs (a small spec stays small)
    encoder, decoder = stack("encoder"), stack("decoder")
    source_vocab = config.get("vocab_size", 58101 if marian else 50265)
    separate = marian and config.get("share_encoder_decoder_embeddings", True) is False
    # apart, vocab_size is the source's and decoder_vocab_size the target's (decoder embeddings and head)
    vocab = (config.get("decoder_vocab_size") or source_vocab) if separate else source_vocab
    position = _HALF if marian else {"kind": "learned", "offset": 2}
    return parse_spec({
        "family": "encoder-decoder",
        "vocab_size": vocab,
        "source_vocab_size": source_vocab if separate else None,
        "d_model": config.get("d_model", 1024),
        "max_positions": config.get("max_position_embeddings", 1024),
        **encoder,
        "decoder": {key: value for key, value in decoder.items() if value != encoder[key]},
        "norm": {"kind": "layernorm", "eps": _LAYERNORM_EPS, "placement": "post"},
        "position": position,
        "embedding": {"scale": bool(config.get("scale_embedding", False)), "norm": not marian},
        "lm_head": {"tied": config.get("tie_word_embeddings", True) is not False, "logits_bias": True},
        "dropout": config.get("dropout", 0.1),
        "init": {"scheme": "normal", "std": config.get("init_std", 0.02)},
        "pad_token_id": token_id(config, "pad_token_id", vocab, 58100 if marian else 1),
        "bos_token_id": token_id(config, "bos_token_id", vocab, None if marian else 0),
        "eos_token_id": token_id(config, "eos_token_id", vocab, 0 if marian else 2),
        "decoder_start_token_id": token_id(config, "decoder_start_token_id", vocab, 58100 if marian else 2),
    })  # fmt: skip


def spec_to_config(spec: ModelSpec, *, marian: bool) -> dict[str, Any]:
    family = "marian" if marian else "bart"
    require(family, [("family", spec.family, "encoder-decoder")])
    assert isinstance(spec, EncoderDecoderSpec)
    encoder, decoder = spec.stacks().values()
    if marian:  # the export reorders the one residual stream by the encoder's sinusoids (`_to_half_layout`)
        require(
            family,
            [(decoder.sources["position"], decoder.position.model_dump(), encoder.position.model_dump())],
        )
    for stack in (encoder, decoder):
        check_eps(family, f"{stack.sources['norm']}.eps", stack.norm.eps)
    emb = spec.embedding
    config: dict[str, Any] = {
        "architectures": ["MarianMTModel" if marian else "BartForConditionalGeneration"],
        "model_type": family,
        "vocab_size": spec.source_vocab_size or spec.vocab_size if marian else spec.vocab_size,
        **stack_config(spec),
        "init_std": spec.init.std,
        "scale_embedding": emb.scale,
        "tie_word_embeddings": spec.lm_head.tied,
        "is_encoder_decoder": True,
        "pad_token_id": spec.pad_token_id,
        "bos_token_id": spec.bos_token_id,
        "eos_token_id": spec.eos_token_id,
        "decoder_start_token_id": spec.start_token_id,
    }
    if marian:
        config["decoder_vocab_size"] = spec.vocab_size
        config["share_encoder_decoder_embeddings"] = spec.source_vocab_size is None
    return config


def stack_config(spec: EncoderDecoderSpec) -> dict[str, Any]:
    """The config.json fields BART, Marian and M2M-100 share: widths, depths, heads, activation, dropout.

    Hugging Face has one activation and one rate of each kind for both stacks: the encoder's is written.
    """
    stacks = spec.stacks()
    encoder, decoder = stacks["encoder"], stacks["decoder"]
    return {
        "d_model": spec.d_model,
        "max_position_embeddings": spec.max_positions,
        "encoder_layers": encoder.num_layers,
        "decoder_layers": decoder.num_layers,
        "encoder_attention_heads": encoder.attention.num_heads,
        "decoder_attention_heads": decoder.attention.num_heads,
        "encoder_ffn_dim": encoder.ffn.d_ff,
        "decoder_ffn_dim": decoder.ffn.d_ff,
        "activation_function": ACTIVATIONS_TO_HF[encoder.ffn.activation],
        "dropout": spec.dropout,
        "attention_dropout": encoder.attention.dropout,
        "activation_dropout": encoder.ffn.dropout,
    }


def check_eps(family: str, field: str, eps: float) -> None:
    """transformers builds BART's and Marian's norms as ``nn.LayerNorm(d_model)``: eps 1e-5, which
    config.json cannot change; another eps would give other logits, so it is refused, not rounded."""
    if eps != _LAYERNORM_EPS:
        raise HFError(
            f"{family} cannot express {field}={eps!r}: Hugging Face {family} hard-codes LayerNorm eps "
            f"{_LAYERNORM_EPS!r} (config.json has no field for it) and another eps gives other logits; "
            f"train with {field}: {_LAYERNORM_EPS!r} to export exactly"
        )


# -- tensors ------------------------------------------------------------------------------------------


def tensor_rules(spec: EncoderDecoderSpec, *, marian: bool) -> list[Rule]:
    """One row per zoo tensor: the HF tensor(s) it is made of (full ``*ForConditionalGeneration`` names)."""
    if spec.source_vocab_size:
        rules = [
            rename("source_embed.tokens.weight", "model.encoder.embed_tokens.weight"),
            rename("embed.tokens.weight", "model.decoder.embed_tokens.weight"),
        ]
    else:
        rules = [rename("embed.tokens.weight", "model.shared.weight")]
    for name, stack in spec.stacks().items():
        width = stack.attention.num_heads * stack.attention.resolved_head_dim(spec.d_model)
        if not marian:
            rules += [rename(f"{name}.positions.weight", f"model.{name}.embed_positions.weight")]
            rules += layernorm(f"{name}.embed_norm", f"model.{name}.layernorm_embedding")
        for i in range(stack.num_layers):
            hf, zoo = f"model.{name}.layers.{i}", f"{name}.layers.{i}"
            qkv = [f"{hf}.self_attn.{x}_proj" for x in "qkv"]
            rules += fused_linear(f"{zoo}.self_attn.qkv_proj", qkv, (width, width, width))
            rules += linear(f"{zoo}.self_attn.out_proj", f"{hf}.self_attn.out_proj")
            rules += layernorm(f"{zoo}.self_attn_norm", f"{hf}.self_attn_layer_norm")
            if stack.cross_attention is not None:
                kv = [f"{hf}.encoder_attn.{x}_proj" for x in "kv"]
                rules += linear(f"{zoo}.cross_attn.q_proj", f"{hf}.encoder_attn.q_proj")
                rules += fused_linear(f"{zoo}.cross_attn.kv_proj", kv, (width, width))
                rules += linear(f"{zoo}.cross_attn.out_proj", f"{hf}.encoder_attn.out_proj")
                rules += layernorm(f"{zoo}.cross_attn_norm", f"{hf}.encoder_attn_layer_norm")
            rules += linear(f"{zoo}.ffn.up_proj", f"{hf}.fc1")
            rules += linear(f"{zoo}.ffn.down_proj", f"{hf}.fc2")
            rules += layernorm(f"{zoo}.ffn_norm", f"{hf}.final_layer_norm")
    if spec.lm_head.logits_bias:
        rules += [rename("lm_head.final_logits_bias", "final_logits_bias")]
    if not spec.lm_head.tied:
        rules += linear("lm_head", "lm_head", bias=False)
    return rules


def drop_copies(tensors: StateDict, spec: EncoderDecoderSpec) -> None:
    """Check and drop the copies of the target table: a shared table's per-stack aliases (some files keep
    only those, then one stands in for it) and a tied head. A copy that differs is an error."""
    separate = bool(spec.source_vocab_size)
    table = "model.decoder.embed_tokens.weight" if separate else "model.shared.weight"
    aliases = [] if separate else [f"model.{side}.embed_tokens.weight" for side in ("encoder", "decoder")]
    copies = [name for name in aliases if name in tensors]
    if table not in tensors and copies:
        tensors[table] = tensors[copies[0]]
    if spec.lm_head.tied and "lm_head.weight" in tensors:
        copies.append("lm_head.weight")
    for name in copies:
        if table in tensors and not torch.equal(tensors.pop(name), tensors[table]):
            raise HFError(
                f"{name} differs from {table}, but config.json ties them "
                "(set tie_word_embeddings / share_encoder_decoder_embeddings to false if they are separate)"
            )


def check_stored_sinusoids(tensors: StateDict, spec: EncoderDecoderSpec) -> None:
    """A stored ``model.{s}.embed_positions.weight`` (Marian's and Pegasus's fixed table: transformers
    reads it as stored when a file holds one) must be the sines and cosines zoo computes, to the stored
    dtype's rounding; any other table is refused, naming it (zoo's positions are computed, never read)."""
    for side in spec.stacks():
        name = f"model.{side}.embed_positions.weight"
        if name not in tensors:
            continue
        stored = tensors[name]
        expected = sinusoidal_table(spec.max_positions, spec.d_model, layout="half")  # (P, C)
        if stored.shape != expected.shape:
            raise HFError(
                f"{name} has shape {tuple(stored.shape)}; the sinusoid table for max_position_embeddings="
                f"{spec.max_positions} and d_model={spec.d_model} is {tuple(expected.shape)}"
            )
        if not stored.is_floating_point():
            raise HFError(f"{name} is {str(stored.dtype).removeprefix('torch.')}: a float table is expected")
        gap = (stored.float() - expected.to(stored.dtype).float()).abs().max().item()
        if gap > 2 * torch.finfo(stored.dtype).eps:
            raise HFError(
                f"{name} is not the sinusoid table (max difference {gap:.3g}); transformers would use the "
                "stored table as it is, and zoo computes the sinusoids: refusing rather than ignore it"
            )


def write_stack_copies(out: StateDict, spec: EncoderDecoderSpec) -> None:
    """An own head (``tie_word_embeddings: false``) unties each stack's ``embed_tokens`` from ``shared`` too
    in transformers 5.x: write them, copies of the one table, so that nothing is missing on load (4.x ties
    them again). A separate source vocabulary writes both already."""
    if not spec.lm_head.tied and not spec.source_vocab_size:
        for side in spec.stacks():
            out[f"model.{side}.embed_tokens.weight"] = out["model.shared.weight"].clone()


def _hf_to_zoo(tensors: StateDict, spec: ModelSpec, *, marian: bool) -> StateDict:
    assert isinstance(spec, EncoderDecoderSpec)
    # full names, also for a headless checkpoint (BartModel) saved without the ``model.`` prefix
    tensors = {
        k if k.startswith("model.") or k in _TOP_LEVEL else f"model.{k}": v for k, v in tensors.items()
    }
    if spec.lm_head.logits_bias and "final_logits_bias" not in tensors:
        dtype = next((t.dtype for t in tensors.values() if t.is_floating_point()), torch.float32)
        tensors["final_logits_bias"] = torch.zeros(1, spec.vocab_size, dtype=dtype)  # transformers' start
    drop_copies(tensors, spec)
    if marian:
        check_stored_sinusoids(tensors, spec)
    ignore = (*_IGNORED, _SINUSOIDS) if marian else _IGNORED  # the sinusoids are recomputed (checked above)
    return rules_to_zoo(tensor_rules(spec, marian=marian), tensors, ignore=ignore)


def _zoo_to_hf(tensors: StateDict, spec: ModelSpec, *, marian: bool) -> StateDict:
    assert isinstance(spec, EncoderDecoderSpec)
    interleaved = spec.stacks()["encoder"].position.model_dump() == _INTERLEAVED  # one layout: checked
    if marian and interleaved and not isinstance(tensors, NamesOnly):  # names alone keep their order
        tensors = _to_half_layout(tensors, spec.d_model)
    out = rules_to_hf(tensor_rules(spec, marian=marian), tensors)
    table = out["model.decoder.embed_tokens.weight" if spec.source_vocab_size else "model.shared.weight"]
    out.setdefault("final_logits_bias", table.new_zeros(1, spec.vocab_size))  # HF's head always has one
    write_stack_copies(out, spec)
    return out


def half_layout_order(d_model: int) -> torch.Tensor:
    """``perm`` with ``sinusoidal_table(P, C, layout="half") == sinusoidal_table(P, C)[:, perm]``: the even
    (sine) coordinates, then the odd (cosine) ones."""
    return torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])


def _to_half_layout(tensors: StateDict, d_model: int) -> StateDict:
    """The same network with its residual coordinates re-ordered by `half_layout_order`, so that the
    interleaved sinusoids it adds become Marian's half layout (table in the module docstring)."""
    perm = half_layout_order(d_model)
    out: StateDict = {}
    for name, tensor in tensors.items():
        axis = next((axis for pattern, axis in _RESIDUAL_AXIS if pattern.fullmatch(name)), -1)
        if axis == -1:
            raise HFError(
                f"marian export: no rule says how {name} meets the residual stream; cannot permute it"
            )
        if axis is not None and tensor.shape[axis] != d_model:
            raise HFError(
                f"marian export: {name} has {tensor.shape[axis]} along axis {axis}, not d_model {d_model}"
            )
        out[name] = tensor if axis is None else tensor.index_select(axis, perm.to(tensor.device))
    return out


def _as_half_layout(spec: ModelSpec) -> ModelSpec:
    """What a Marian export describes: the paper's interleaved sinusoids written in the half layout, the
    residual stream reordered (`_to_half_layout`); any other spec as it is."""
    interleaved = [s for s in spec.stacks().values() if s.position.model_dump() == _INTERLEAVED]
    return spec.override(**{s.sources["position"]: _HALF for s in interleaved}) if interleaved else spec


def _mapping(model_type: str, *, marian: bool) -> FamilyMapping:
    return FamilyMapping(
        model_types=(model_type,),
        config_to_spec=lambda config, names: config_to_spec(config, names, marian=marian),
        spec_to_config=lambda spec: spec_to_config(spec, marian=marian),
        hf_to_zoo=lambda tensors, spec: _hf_to_zoo(tensors, spec, marian=marian),
        zoo_to_hf=lambda tensors, spec: _zoo_to_hf(tensors, spec, marian=marian),
        exported_as=(lambda spec: _as_half_layout(with_logits_bias(spec))) if marian else with_logits_bias,
    )


MAPPINGS: list[FamilyMapping] = [_mapping("bart", marian=False), _mapping("marian", marian=True)]
