"""Hugging Face mBART and Pegasus <-> zoo: ``MBartForConditionalGeneration``, ``PegasusForConditionalGeneration``.

Both are BART made pre-norm (transformers' ``models/mbart`` and ``models/pegasus`` are BART's code with the
norms moved): each sublayer reads a LayerNorm of its input, and each stack ends with one more LayerNorm
(``model.{s}.layer_norm``). Their tensors carry BART's names, so the table is `zoo.io.hf.bart`'s plus the
final norms, as in `zoo.io.hf.m2m100`; the rows that differ:

                      mBART (Liu et al. 2020)                  Pegasus (Zhang et al. 2020)
    positions         learned, offset 2 (as BART)              sinusoids, sines then cosines ("half", the
                                                               paper's rates, as Marian), row p for position p
    embedding norm    layernorm_embedding (as BART)            none
    tokens            pad 1, bos 0, eos 2, no decoder start    pad 0, eos 1, decoder start 0 (= pad)
    architecture      MBartForConditionalGeneration            PegasusForConditionalGeneration

    HF name (s = encoder | decoder)                 zoo name
    model.{s}.layer_norm.*                          {s}.final_norm.*
    everything else                                 as in `zoo.io.hf.bart` (mBART: BART's rows; Pegasus:
                                                    Marian's, no stored positions, no embedding norm)

Both keep BART's ``final_logits_bias`` and tie the head to the shared table unless the config says
``tie_word_embeddings: false``. transformers 5.x then unties the stacks' ``embed_tokens`` from ``shared`` as
well; zoo keeps one table for both stacks, so their copies must equal it (as in every published file and in
what transformers 4.x wrote; one that differs is refused, named), and an export with its own head writes the
copies. Pegasus stores its sinusoid table although it is never trained: zoo recomputes it on import, after
checking that the stored one is the sinusoids (transformers reads it as stored: another table is refused), and
writes it on export, since transformers lists it as missing otherwise.
transformers numbers positions with ``arange`` and zoo over the attention mask: the same for right-padded
batches, as for BART.

mBART has no ``decoder_start_token_id`` by default: generation then starts from ``bos_token_id``, in zoo as in
transformers (published fine-tunes set it, and the target language is forced as the first generated token
with ``forced_bos_token_id``). One difference is left: transformers' mBART turns ``labels`` into decoder
inputs by rotating each row's last real token (the language id) to the front, zoo by prepending the start
token; pass ``decoder_input_ids`` to train on mBART's layout. LayerDrop is training-only: ignored on import,
written as 0.0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from zoo.blocks.position import sinusoidal_table
from zoo.io.hf import bart
from zoo.io.hf.common import (
    FamilyMapping,
    Rule,
    StateDict,
    TypedConfig,
    layernorm,
    require,
    rules_to_hf,
    rules_to_zoo,
    with_logits_bias,
)
from zoo.spec import EncoderDecoderSpec, LearnedPositions, ModelSpec, SinusoidalPositions

# MBartConfig's and PegasusConfig's shared defaults (= BartConfig's), for configs that leave a field out
_DEFAULTS: dict[str, Any] = {
    "vocab_size": 50265,
    "d_model": 1024,
    "max_position_embeddings": 1024,
    "encoder_layers": 12,
    "decoder_layers": 12,
    "encoder_attention_heads": 16,
    "decoder_attention_heads": 16,
    "encoder_ffn_dim": 4096,
    "decoder_ffn_dim": 4096,
    "activation_function": "gelu",
    "dropout": 0.1,
    "attention_dropout": 0.0,
    "activation_dropout": 0.0,
    "init_std": 0.02,
    "scale_embedding": False,
}
_IGNORED = (r"model\.(encoder|decoder)\.version",)
_SINUSOIDS = r"model\.(encoder|decoder)\.embed_positions\.weight"  # Pegasus's fixed table
_TOP_LEVEL = ("final_logits_bias", "lm_head.weight")  # outside the ``model.`` base model


@dataclass(frozen=True)
class Variant:
    """One pre-norm BART (a column of the module docstring's table)."""

    model_type: str
    architecture: str
    sinusoids: bool  # fixed "half" sinusoids and no embedding norm (Marian's rows), else BART's
    tokens: dict[str, int | None]  # the config class's token ids, for configs that leave one out

    @property
    def position(self) -> dict[str, Any]:
        spec = SinusoidalPositions(layout="half") if self.sinusoids else LearnedPositions(offset=2)
        return spec.model_dump()


MBART = Variant(
    "mbart",
    "MBartForConditionalGeneration",
    sinusoids=False,
    tokens={"pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2, "decoder_start_token_id": None},
)
PEGASUS = Variant(
    "pegasus",
    "PegasusForConditionalGeneration",
    sinusoids=True,
    tokens={"pad_token_id": 0, "bos_token_id": None, "eos_token_id": 1, "decoder_start_token_id": 0},
)


# -- config <-> spec ------------------------------------------------------------------------------------


def config_to_spec(config: dict[str, Any], names: set[str], variant: Variant) -> ModelSpec:
    """An mBART or Pegasus ``config.json`` -> an encoder-decoder spec: BART's reading (Marian's rows for
    Pegasus: sinusoids, no embedding norm), then pre-norm with a final norm in each stack."""
    config = TypedConfig({**_DEFAULTS, **variant.tokens, **config})
    spec = bart.config_to_spec(config, names, marian=variant.sinusoids)
    return spec.override(
        norm={"placement": "pre"},  # with a final norm, as pre-norm has by default
        position=variant.position,
        lm_head={"logits_bias": True},
    )


def spec_to_config(spec: ModelSpec, variant: Variant) -> dict[str, Any]:
    """A zoo spec with the variant's wiring -> its config.json dict (what it cannot hold, the export guard
    names: `zoo.io.hf.faithful`)."""
    family = variant.model_type
    require(family, [("family", spec.family, "encoder-decoder")])
    assert isinstance(spec, EncoderDecoderSpec)
    for stack in spec.stacks().values():
        bart.check_eps(family, f"{stack.sources['norm']}.eps", stack.norm.eps)
    emb = spec.embedding
    return {
        "architectures": [variant.architecture],
        "model_type": family,
        "vocab_size": spec.vocab_size,
        **bart.stack_config(spec),
        "encoder_layerdrop": 0.0,  # zoo trains without LayerDrop
        "decoder_layerdrop": 0.0,
        "init_std": spec.init.std,
        "scale_embedding": emb.scale,
        "tie_word_embeddings": spec.lm_head.tied,
        "is_encoder_decoder": True,
        "pad_token_id": spec.pad_token_id,
        "bos_token_id": spec.bos_token_id,
        "eos_token_id": spec.eos_token_id,
        "decoder_start_token_id": spec.decoder_start_token_id,  # None: generation starts from bos
    }


# -- tensors ------------------------------------------------------------------------------------------


def _rules(spec: EncoderDecoderSpec, variant: Variant) -> list[Rule]:
    """BART's table (Marian's shape for Pegasus) plus the final norms."""
    rules = bart.tensor_rules(spec, marian=variant.sinusoids)
    for name in spec.stacks():
        rules += layernorm(f"{name}.final_norm", f"model.{name}.layer_norm")
    return rules


def hf_to_zoo(tensors: StateDict, spec: ModelSpec, variant: Variant) -> StateDict:
    """An mBART / Pegasus state dict -> zoo's (a headless ``*Model`` file too: zero logits bias)."""
    assert isinstance(spec, EncoderDecoderSpec)
    # full names, also for a headless checkpoint saved without the ``model.`` prefix
    tensors = {
        k if k.startswith("model.") or k in _TOP_LEVEL else f"model.{k}": v for k, v in tensors.items()
    }
    if "final_logits_bias" not in tensors:
        dtype = next((t.dtype for t in tensors.values() if t.is_floating_point()), torch.float32)
        tensors["final_logits_bias"] = torch.zeros(1, spec.vocab_size, dtype=dtype)  # transformers' start
    bart.drop_copies(tensors, spec)  # the per-stack aliases of ``shared`` and a tied head
    if variant.sinusoids:
        bart.check_stored_sinusoids(tensors, spec)
    ignore = (*_IGNORED, _SINUSOIDS) if variant.sinusoids else _IGNORED  # recomputed (checked above)
    return rules_to_zoo(_rules(spec, variant), tensors, ignore=ignore)


def zoo_to_hf(tensors: StateDict, spec: ModelSpec, variant: Variant) -> StateDict:
    """zoo's state dict -> what ``from_pretrained`` loads with nothing missing (Pegasus: with its table)."""
    assert isinstance(spec, EncoderDecoderSpec)
    out = rules_to_hf(_rules(spec, variant), tensors)
    table = out["model.decoder.embed_tokens.weight" if spec.source_vocab_size else "model.shared.weight"]
    out.setdefault("final_logits_bias", table.new_zeros(1, spec.vocab_size))  # HF's head always has one
    bart.write_stack_copies(out, spec)  # an own head: transformers 5.x unties the stacks' tables too
    if variant.sinusoids:
        sinusoids = sinusoidal_table(spec.max_positions, spec.d_model, layout="half").to(table)
        for name in spec.stacks():
            out[f"model.{name}.embed_positions.weight"] = sinusoids.clone()
    return out


def _mapping(variant: Variant) -> FamilyMapping:
    return FamilyMapping(
        model_types=(variant.model_type,),
        config_to_spec=lambda config, names: config_to_spec(config, names, variant),
        spec_to_config=lambda spec: spec_to_config(spec, variant),
        hf_to_zoo=lambda tensors, spec: hf_to_zoo(tensors, spec, variant),
        zoo_to_hf=lambda tensors, spec: zoo_to_hf(tensors, spec, variant),
        exported_as=with_logits_bias,
    )


MAPPINGS: list[FamilyMapping] = [_mapping(MBART), _mapping(PEGASUS)]
