"""Hugging Face Whisper <-> zoo: ``WhisperForConditionalGeneration`` and ``WhisperModel`` checkpoints.

Whisper (Radford et al. 2022, "Robust Speech Recognition via Large-Scale Weak Supervision"; transformers'
``models/whisper/modeling_whisper.py``) is a pre-norm encoder-decoder with BART's tensor names. Its encoder
reads log-mel frames through two convolutions and a fixed sinusoid table: zoo's audio front-end
(``encoder.embedding: {kind: audio}``, `zoo.blocks.audio`), with no positions in the encoder stack itself.
The decoder embeds tokens with a learned table (``max_target_positions`` rows, from 0) and its head is tied.

    HF name (s = encoder | decoder; under ``model.`` with the head)   zoo name
    model.encoder.conv1.* / conv2.*                                    source_embed.conv1.* / conv2.*
    model.encoder.embed_positions.weight (frozen sinusoids)            source_embed.positions
    model.decoder.embed_tokens.weight (= proj_out.weight)              embed.tokens.weight
    model.decoder.embed_positions.weight                               decoder.positions.weight
    model.{s}.layers.{i}.*                                             {s}.layers.{i}.*, as `zoo.io.hf.bart`
    model.{s}.layers.{i}.self_attn.{q,k,v}_proj.weight                 {s}.layers.{i}.self_attn.qkv_proj.weight
    model.{s}.layers.{i}.self_attn.{q,v}_proj.bias                     {s}.layers.{i}.self_attn.qv_bias
    model.decoder.layers.{i}.encoder_attn.{k,v}_proj.weight            decoder.layers.{i}.cross_attn.kv_proj.weight
    model.decoder.layers.{i}.encoder_attn.v_proj.bias                  decoder.layers.{i}.cross_attn.v_bias
    model.{s}.layer_norm.*                                             {s}.final_norm.*

Whisper's key projections have no bias (``k_proj`` in self- and cross-attention): ``attention.key_bias:
false``, where zoo's fused projections have no bias and the query and value biases are a parameter of their
own (``self_attn.qv_bias`` = [q_proj.bias; v_proj.bias], ``cross_attn.v_bias`` = v_proj.bias).
``scale_embedding`` is read nowhere in transformers' forward: it is ignored on import and written false. LayerDrop and SpecAugment
(``*_layerdrop``, ``apply_spec_augment``, ``mask_*``) are training-only: ignored on import, written off.

The generation settings (``suppress_tokens``, the language/task prompt) live in ``generation_config.json``:
`zoo.io.hf.generation_config` reads them into a `zoo.generation.GenerationConfig`; the file travels with the
model through `zoo.save`, `zoo.load` and `zoo.to_hf` (`zoo.io.generation_file`).
"""

from __future__ import annotations

from typing import Any

from zoo.io.hf import bart
from zoo.io.hf.common import (
    FamilyMapping,
    HFError,
    Rule,
    StateDict,
    TypedConfig,
    activation_from_hf,
    fused,
    fused_linear,
    layernorm,
    linear,
    reject,
    rename,
    require,
    rules_to_hf,
    rules_to_zoo,
    token_id,
)
from zoo.spec import EncoderDecoderSpec, ModelSpec, parse_spec

# WhisperConfig's defaults (openai/whisper-tiny's sizes), for configs that leave a field out
_DEFAULTS: dict[str, Any] = {
    "vocab_size": 51865,
    "num_mel_bins": 80,
    "encoder_layers": 4,
    "encoder_attention_heads": 6,
    "decoder_layers": 4,
    "decoder_attention_heads": 6,
    "decoder_ffn_dim": 1536,
    "encoder_ffn_dim": 1536,
    "activation_function": "gelu",
    "d_model": 384,
    "dropout": 0.0,
    "attention_dropout": 0.0,
    "activation_dropout": 0.0,
    "init_std": 0.02,
    "max_source_positions": 1500,
    "max_target_positions": 448,
    "pad_token_id": 50256,
    "bos_token_id": 50256,
    "eos_token_id": 50256,
    "decoder_start_token_id": 50257,
}
_LAYERNORM_EPS = 1e-5  # nn.LayerNorm's default: Whisper's config has no eps field
_IGNORED = (r"model\.(encoder|decoder)\.version",)
_TOP_LEVEL = ("proj_out.weight",)  # the tied head, outside the ``model.`` base model


# -- config <-> spec ------------------------------------------------------------------------------------


def _config_to_spec(config: dict[str, Any], names: set[str]) -> ModelSpec:
    config = TypedConfig({**_DEFAULTS, **config})
    reject(config, "use_weighted_layer_sum", False, why="audio classification's weighted layer sum")
    activation = activation_from_hf(config["activation_function"], field="activation_function")
    vocab = config["vocab_size"]

    def stack(side: str) -> dict[str, Any]:
        return {
            "num_layers": config[f"{side}_layers"],
            "attention": {
                "num_heads": config[f"{side}_attention_heads"],
                "key_bias": False,
                "dropout": config["attention_dropout"],
            },
            "ffn": {
                "d_ff": config[f"{side}_ffn_dim"],
                "activation": activation,
                "dropout": config["activation_dropout"],
            },
        }

    encoder, decoder = stack("encoder"), stack("decoder")
    front_end = {
        "kind": "audio",
        "num_mel_bins": config["num_mel_bins"],
        "max_positions": config["max_source_positions"],
    }
    return parse_spec({
        "family": "encoder-decoder",
        "vocab_size": vocab,
        "d_model": config["d_model"],
        "max_positions": config["max_target_positions"],
        **encoder,
        "encoder": {"embedding": front_end, "position": {"kind": "none"}},
        "decoder": {key: value for key, value in decoder.items() if value != encoder[key]},
        "norm": {"kind": "layernorm", "eps": _LAYERNORM_EPS, "placement": "pre"},
        "position": {"kind": "learned"},
        "lm_head": {"tied": True},
        "dropout": config["dropout"],
        "init": {"scheme": "normal", "std": config["init_std"]},
        "pad_token_id": token_id(config, "pad_token_id", vocab, None),
        "bos_token_id": token_id(config, "bos_token_id", vocab, None),
        "eos_token_id": token_id(config, "eos_token_id", vocab, None),
        "decoder_start_token_id": token_id(config, "decoder_start_token_id", vocab, None),
    })  # fmt: skip


def _spec_to_config(spec: ModelSpec) -> dict[str, Any]:
    family = "whisper"
    require(family, [("family", spec.family, "encoder-decoder")])
    assert isinstance(spec, EncoderDecoderSpec)
    encoder, decoder = spec.stacks().values()
    front = encoder.embedding
    if front is None:
        raise HFError("whisper cannot express encoder.embedding=None: Whisper's encoder reads audio features")
    require(family, [("lm_head.tied", spec.lm_head.tied, True)])
    for stack in (encoder, decoder):
        bart.check_eps(family, f"{stack.sources['norm']}.eps", stack.norm.eps)
    config = {
        "architectures": ["WhisperForConditionalGeneration"],
        "model_type": family,
        "vocab_size": spec.vocab_size,
        "num_mel_bins": front.num_mel_bins,
        "max_source_positions": front.max_positions,
        **bart.stack_config(spec),
        "max_target_positions": spec.max_positions,
        "encoder_layerdrop": 0.0,  # zoo trains without LayerDrop or SpecAugment
        "decoder_layerdrop": 0.0,
        "apply_spec_augment": False,
        "init_std": spec.init.std,
        "scale_embedding": False,  # transformers' Whisper reads it nowhere
        "tie_word_embeddings": True,
        "is_encoder_decoder": True,
        "pad_token_id": spec.pad_token_id,
        "bos_token_id": spec.bos_token_id,
        "eos_token_id": spec.eos_token_id,
        "decoder_start_token_id": spec.start_token_id,
    }
    del config["max_position_embeddings"]  # BART's name; Whisper has one per side
    return config


# -- tensors ------------------------------------------------------------------------------------------


def _rules(spec: EncoderDecoderSpec, prefix: str) -> list[Rule]:
    """One row per zoo tensor: the HF tensor(s) it is made of, the base model under ``prefix``."""
    m = prefix
    rules = [
        *linear("source_embed.conv1", f"{m}encoder.conv1"),
        *linear("source_embed.conv2", f"{m}encoder.conv2"),
        rename("source_embed.positions", f"{m}encoder.embed_positions.weight"),
        rename("embed.tokens.weight", f"{m}decoder.embed_tokens.weight"),
        rename("decoder.positions.weight", f"{m}decoder.embed_positions.weight"),
    ]
    for name, stack in spec.stacks().items():
        width = stack.attention.num_heads * stack.attention.resolved_head_dim(spec.d_model)
        for i in range(stack.num_layers):
            hf, zoo = f"{m}{name}.layers.{i}", f"{name}.layers.{i}"
            qkv = [f"{hf}.self_attn.{x}_proj" for x in "qkv"]
            rules += fused_linear(f"{zoo}.self_attn.qkv_proj", qkv, (width,) * 3, bias=False)
            rules.append(
                fused(f"{zoo}.self_attn.qv_bias", [f"{qkv[0]}.bias", f"{qkv[2]}.bias"], (width,) * 2)
            )
            rules += linear(f"{zoo}.self_attn.out_proj", f"{hf}.self_attn.out_proj")
            rules += layernorm(f"{zoo}.self_attn_norm", f"{hf}.self_attn_layer_norm")
            if stack.cross_attention is not None:
                kv = [f"{hf}.encoder_attn.{x}_proj" for x in "kv"]
                rules += linear(f"{zoo}.cross_attn.q_proj", f"{hf}.encoder_attn.q_proj")
                rules += fused_linear(f"{zoo}.cross_attn.kv_proj", kv, (width,) * 2, bias=False)
                rules.append(rename(f"{zoo}.cross_attn.v_bias", f"{kv[1]}.bias"))
                rules += linear(f"{zoo}.cross_attn.out_proj", f"{hf}.encoder_attn.out_proj")
                rules += layernorm(f"{zoo}.cross_attn_norm", f"{hf}.encoder_attn_layer_norm")
            rules += linear(f"{zoo}.ffn.up_proj", f"{hf}.fc1")
            rules += linear(f"{zoo}.ffn.down_proj", f"{hf}.fc2")
            rules += layernorm(f"{zoo}.ffn_norm", f"{hf}.final_layer_norm")
        rules += layernorm(f"{name}.final_norm", f"{m}{name}.layer_norm")
    return rules


def _hf_to_zoo(tensors: StateDict, spec: ModelSpec) -> StateDict:
    assert isinstance(spec, EncoderDecoderSpec)
    # full names, also for a headless checkpoint (WhisperModel) saved without the ``model.`` prefix
    tensors = {
        k if k.startswith("model.") or k in _TOP_LEVEL else f"model.{k}": v for k, v in tensors.items()
    }
    tied = {"proj_out.weight": "embed.tokens.weight"}
    return rules_to_zoo(_rules(spec, "model."), tensors, ignore=_IGNORED, tied=tied)


def _zoo_to_hf(tensors: StateDict, spec: ModelSpec) -> StateDict:
    assert isinstance(spec, EncoderDecoderSpec)
    return rules_to_hf(_rules(spec, "model."), tensors)


MAPPING = FamilyMapping(
    model_types=("whisper",),
    config_to_spec=_config_to_spec,
    spec_to_config=_spec_to_config,
    hf_to_zoo=_hf_to_zoo,
    zoo_to_hf=_zoo_to_hf,
)
