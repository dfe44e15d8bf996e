"""Hugging Face M2M-100 <-> zoo: ``M2M100ForConditionalGeneration`` checkpoints (``model_type: m2m_100``).

M2M-100 (Fan et al. 2021, "Beyond English-Centric Multilingual Machine Translation"; transformers'
``models/m2m_100/modeling_m2m_100.py``) is fairseq's pre-norm Transformer. Its tensors carry BART's names, so
the table is `zoo.io.hf.bart`'s (Marian's rows: no stored positions, no embedding norm) plus one row per
stack for the final norm; what differs is the wiring around them:

                        BART / Marian                      M2M-100
    residuals           post-norm, no final norm           pre-norm, final LayerNorm in each stack
    positions           learned (+2) / paper sinusoids     fairseq sinusoids (below), not stored
    embeddings          scaled or not                      scaled by sqrt(d_model), shared by both stacks
    logits              + final_logits_bias                tied head, no bias

    HF name (s = encoder | decoder)                 zoo name
    model.shared.weight (= model.{s}.embed_tokens)  embed.tokens.weight (tied to the head)
    model.{s}.layers.{i}.*                          {s}.layers.{i}.*, as in `zoo.io.hf.bart`
    model.{s}.layer_norm.*                          {s}.final_norm.*
    lm_head.weight (untied only)                    lm_head.weight

fairseq's sinusoids (``SinusoidalPositionalEmbedding.get_embedding``) are zoo's ``SinusoidalPositions`` with
``layout: half`` (all sines, then all cosines), ``frequencies: fairseq`` (rates exp(-k ln 10000 / (C/2 - 1))
rather than the paper's C/2 in the denominator) and ``offset: pad_token_id + 1`` (the first token reads row
2). transformers numbers tokens by ``input_ids != pad_token_id``, zoo by the attention mask: the same
wherever the mask marks exactly the pad tokens (right-padded batches, generated tokens other than pad).

The target language is not in the config: generation forces it as the first generated token
(``forced_bos_token_id``, the language's id from the tokenizer). LayerDrop (``encoder_layerdrop``,
``decoder_layerdrop``) is training-only and zoo has none: it is ignored on import and written as 0.0.
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
    layernorm,
    require,
    rules_to_hf,
    rules_to_zoo,
)
from zoo.spec import EncoderDecoderSpec, ModelSpec

# M2M100Config's defaults (= facebook/m2m100_418M), for configs that leave a field out
_DEFAULTS: dict[str, Any] = {
    "vocab_size": 128112,
    "d_model": 1024,
    "max_position_embeddings": 1024,
    "encoder_layers": 12,
    "decoder_layers": 12,
    "encoder_attention_heads": 16,
    "decoder_attention_heads": 16,
    "encoder_ffn_dim": 4096,
    "decoder_ffn_dim": 4096,
    "activation_function": "relu",
    "dropout": 0.1,
    "attention_dropout": 0.1,
    "activation_dropout": 0.0,
    "init_std": 0.02,
    "scale_embedding": True,
    "pad_token_id": 1,
    "bos_token_id": 0,
    "eos_token_id": 2,
    "decoder_start_token_id": 2,
}
_IGNORED = (
    r"model\.(encoder|decoder)\.version",
    r"model\.(encoder|decoder)\.embed_positions\.(weights|_float_tensor)",  # fixed sinusoids, recomputed
)


def _fairseq_positions(pad_token_id: int) -> dict[str, Any]:
    """The position spec of fairseq's sinusoids for a model whose padding index is ``pad_token_id``."""
    return {"kind": "sinusoidal", "layout": "half", "frequencies": "fairseq", "offset": pad_token_id + 1}


# -- config <-> spec ------------------------------------------------------------------------------------


def _config_to_spec(config: dict[str, Any], names: set[str]) -> ModelSpec:
    config = TypedConfig({**_DEFAULTS, **config})
    pad, vocab = config["pad_token_id"], config.get("vocab_size", _DEFAULTS["vocab_size"])
    if not isinstance(pad, int) or isinstance(pad, bool) or not 0 <= pad < vocab:
        raise HFError(
            f"config.json pad_token_id={pad!r} is not a token id: M2M-100 numbers positions from "
            "pad_token_id + 1, so it needs one"
        )
    # BART's reading of the sizes, dropouts and token ids (Marian's rows: no embedding norm), then M2M-100's
    # wiring on top
    spec = bart.config_to_spec(config, names, marian=True)
    return spec.override(
        norm={"placement": "pre"},  # with a final norm, as pre-norm has by default
        position=_fairseq_positions(pad),
        lm_head={"logits_bias": False},
    )


def _spec_to_config(spec: ModelSpec) -> dict[str, Any]:
    family = "m2m_100"
    require(family, [("family", spec.family, "encoder-decoder")])
    assert isinstance(spec, EncoderDecoderSpec)
    if spec.pad_token_id is None:
        raise HFError(
            f"{family} cannot express pad_token_id=None: M2M-100 numbers positions from pad_token_id + 1"
        )
    emb = spec.embedding
    return {
        "architectures": ["M2M100ForConditionalGeneration"],
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
        "decoder_start_token_id": spec.start_token_id,
    }


# -- tensors ------------------------------------------------------------------------------------------


def _rules(spec: EncoderDecoderSpec) -> list[Rule]:
    """BART's table in Marian's shape (no stored positions, no embedding norm) plus the final norms."""
    rules = bart.tensor_rules(spec, marian=True)
    for name in spec.stacks():
        rules += layernorm(f"{name}.final_norm", f"model.{name}.layer_norm")
    return rules


def _hf_to_zoo(tensors: StateDict, spec: ModelSpec) -> StateDict:
    assert isinstance(spec, EncoderDecoderSpec)
    # full names, also for a headless checkpoint (M2M100Model) saved without the ``model.`` prefix
    tensors = {
        k if k.startswith("model.") or k == "lm_head.weight" else f"model.{k}": v for k, v in tensors.items()
    }
    bart.drop_copies(tensors, spec)  # the per-stack aliases of ``shared`` and a tied head
    return rules_to_zoo(_rules(spec), tensors, ignore=_IGNORED)


def _zoo_to_hf(tensors: StateDict, spec: ModelSpec) -> StateDict:
    assert isinstance(spec, EncoderDecoderSpec)
    out = rules_to_hf(_rules(spec), tensors)
    bart.write_stack_copies(out, spec)  # an own head: transformers 5.x unties the stacks' tables too
    return out


MAPPING = FamilyMapping(
    model_types=("m2m_100",),
    config_to_spec=_config_to_spec,
    spec_to_config=_spec_to_config,
    hf_to_zoo=_hf_to_zoo,
    zoo_to_hf=_zoo_to_hf,
)
