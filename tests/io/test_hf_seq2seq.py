"""Hugging Face interop for the encoder-decoder families: T5 v1.0 / v1.1, BART, Marian.

Small random transformers models are saved with ``save_pretrained``, imported into zoo and compared logit by
logit on right-padded source and decoder batches; zoo models go back out with ``to_hf`` and must load in
transformers with nothing missing or unexpected and give the same logits. Nothing is downloaded.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import load_file
from support import padded_batch
from torch import nn
from transformers import (
    AutoModelForSeq2SeqLM,
    BartConfig,
    BartForConditionalGeneration,
    MarianConfig,
    MarianMTModel,
    T5Config,
    T5ForConditionalGeneration,
)

import zoo
from zoo.io.hf import bart, t5
from zoo.io.hf.faithful import faithful_config

transformers.logging.set_verbosity_error()  # the "not tied, values differ" notice for T5 v1.1 is expected

VOCAB = 96
BART_SIZES = dict(
    d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
    encoder_ffn_dim=64, decoder_ffn_dim=48, max_position_embeddings=64,
)  # fmt: skip
T5_SIZES = dict(
    vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
    relative_attention_num_buckets=8, relative_attention_max_distance=20,
)  # fmt: skip


def _t5_v10() -> nn.Module:
    return T5ForConditionalGeneration(T5Config(**T5_SIZES, decoder_start_token_id=0))


def _t5_v11() -> nn.Module:
    config = T5Config(
        **T5_SIZES, feed_forward_proj="gated-gelu", tie_word_embeddings=False, decoder_start_token_id=0
    )
    model = T5ForConditionalGeneration(config)
    model.lm_head.weight = nn.Parameter(torch.randn(VOCAB, 32))  # v1.1: an lm_head of its own
    return model


def _bart() -> nn.Module:
    return BartForConditionalGeneration(
        BartConfig(vocab_size=VOCAB, **BART_SIZES, activation_function="gelu")
    )


def _marian(target_vocab: int = VOCAB, **extra: object) -> nn.Module:
    # pad = decoder start = the last target id, as in the opus-mt checkpoints
    config = MarianConfig(
        vocab_size=VOCAB, **BART_SIZES, activation_function="swish", scale_embedding=True,
        pad_token_id=target_vocab - 1, decoder_start_token_id=target_vocab - 1, eos_token_id=0, **extra,
    )  # fmt: skip
    return MarianMTModel(config)


def _marian_separate_vocab() -> nn.Module:
    # vocab_size is the source vocabulary, decoder_vocab_size the target's (embeddings and head)
    return _marian(80, share_encoder_decoder_embeddings=False, decoder_vocab_size=80)


HF_MODELS: dict[str, Callable[[], nn.Module]] = {
    "t5-v1.0": _t5_v10,
    "t5-v1.1": _t5_v11,
    "bart": _bart,
    "marian": _marian,
    "marian-separate-vocab": _marian_separate_vocab,
}
ARCHITECTURES = {
    "t5": "T5ForConditionalGeneration",
    "bart": "BartForConditionalGeneration",
    "marian": "MarianMTModel",
}
MAPPINGS = {m.model_types[0]: m for m in t5.MAPPINGS + bart.MAPPINGS}


@torch.no_grad()
def _randomise(model: nn.Module) -> nn.Module:
    """Random norms, biases and logits bias too, so a swapped or dropped vector cannot hide behind 1s and 0s."""
    for name, param in model.named_parameters():
        if param.dim() == 1:
            param.uniform_(0.5, 1.5) if "norm" in name else param.normal_(0.0, 0.2)
    for name, buffer in model.named_buffers():
        if name.endswith("final_logits_bias"):
            buffer.normal_(0.0, 0.5)
    return model.eval()


def _save_hf(name: str, path: Path) -> nn.Module:
    model = _randomise(HF_MODELS[name]())
    model.save_pretrained(path)
    return model


def _batches(source_vocab: int, target_vocab: int) -> tuple[torch.Tensor, ...]:
    """Right-padded source (lengths 7, 4) and decoder inputs (lengths 5, 3)."""
    src, src_mask = padded_batch(source_vocab, [7, 4], low=2)
    tgt, tgt_mask = padded_batch(target_vocab, [5, 3], low=2)
    return src, src_mask, tgt, tgt_mask


def _assert_same_at_real_positions(ours: torch.Tensor, theirs: torch.Tensor, mask: torch.Tensor) -> None:
    for row, n in enumerate(mask.sum(dim=1).tolist()):
        torch.testing.assert_close(ours[row, :n], theirs[row, :n], atol=1e-4, rtol=1e-4)


def _target_vocab(hf_model: nn.Module) -> int:
    return hf_model.get_output_embeddings().weight.shape[0]


@pytest.mark.parametrize("name", list(HF_MODELS))
def test_imported_model_gives_transformers_logits_on_padded_batches(name: str, tmp_path: Path) -> None:
    hf_model = _save_hf(name, tmp_path)
    model = zoo.from_hf(tmp_path)
    src, src_mask, tgt, tgt_mask = _batches(hf_model.config.vocab_size, _target_vocab(hf_model))
    with torch.no_grad():
        theirs = hf_model(
            input_ids=src, attention_mask=src_mask, decoder_input_ids=tgt, decoder_attention_mask=tgt_mask
        )
        ours = model(src, attention_mask=src_mask, decoder_input_ids=tgt, decoder_attention_mask=tgt_mask)
    _assert_same_at_real_positions(ours.encoder_last_hidden_state, theirs.encoder_last_hidden_state, src_mask)
    _assert_same_at_real_positions(ours.logits, theirs.logits, tgt_mask)


@pytest.mark.parametrize("name", list(HF_MODELS))
def test_to_hf_loads_in_transformers_with_nothing_missing_and_same_logits(name: str, tmp_path: Path) -> None:
    # a zoo model with its own random weights, built from the spec the import derives
    source = _save_hf(name, tmp_path / "source")
    spec = zoo.from_hf(tmp_path / "source").spec
    model = _randomise(zoo.build(spec))
    zoo.to_hf(model, tmp_path / "export")
    config = json.loads((tmp_path / "export" / "config.json").read_text())
    assert config["architectures"] == [ARCHITECTURES[name.split("-")[0]]]
    for key in ("pad_token_id", "eos_token_id", "decoder_start_token_id"):
        assert config[key] == getattr(source.config, key), key
    hf_model, info = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "export", output_loading_info=True)
    problems = [sorted(info[kind]) for kind in ("missing_keys", "unexpected_keys", "mismatched_keys")]
    assert problems == [[], [], []]
    hf_model.eval()
    src, src_mask, tgt, tgt_mask = _batches(spec.source_vocab_size or spec.vocab_size, spec.vocab_size)
    with torch.no_grad():
        theirs = hf_model(
            input_ids=src, attention_mask=src_mask, decoder_input_ids=tgt, decoder_attention_mask=tgt_mask
        )
        ours = model(src, attention_mask=src_mask, decoder_input_ids=tgt, decoder_attention_mask=tgt_mask)
    _assert_same_at_real_positions(ours.logits, theirs.logits, tgt_mask)


@pytest.mark.parametrize("model_type", ["bart", "marian", "m2m_100"])
def test_own_head_export_writes_each_stacks_table_so_nothing_is_missing(
    model_type: str, tmp_path: Path
) -> None:
    # transformers 5.x unties encoder/decoder embed_tokens from shared too when tie_word_embeddings is false
    spec = zoo.preset("bart-tiny").override(lm_head={"tied": False})
    if model_type == "marian":
        spec = spec.override(
            embedding={"norm": False}, position={"kind": "sinusoidal", "layout": "half", "offset": 0}
        )
    elif model_type == "m2m_100":
        spec = spec.override(
            embedding={"norm": False},
            norm={"placement": "pre"},
            lm_head={"logits_bias": False},
            position={"kind": "sinusoidal", "layout": "half", "frequencies": "fairseq", "offset": 2},
        )
    model = _randomise(zoo.build(spec))
    zoo.to_hf(model, tmp_path, model_type=model_type)
    hf_model, info = AutoModelForSeq2SeqLM.from_pretrained(tmp_path, output_loading_info=True)
    assert [sorted(info[kind]) for kind in ("missing_keys", "unexpected_keys")] == [[], []]
    src, src_mask, tgt, tgt_mask = _batches(spec.vocab_size, spec.vocab_size)
    with torch.no_grad():
        theirs = hf_model.eval()(
            input_ids=src, attention_mask=src_mask, decoder_input_ids=tgt, decoder_attention_mask=tgt_mask
        )
        ours = model(src, attention_mask=src_mask, decoder_input_ids=tgt, decoder_attention_mask=tgt_mask)
    _assert_same_at_real_positions(ours.logits, theirs.logits, tgt_mask)
    assert zoo.from_hf(tmp_path).spec.lm_head.tied is False  # and it reads back


def test_t5_tied_head_without_rescale_exports_and_loads_with_same_logits(tmp_path: Path) -> None:
    model = _randomise(
        zoo.build(zoo.preset("t5-tiny").override(lm_head={"tied": True, "rescale_tied": False}))
    )
    zoo.to_hf(model, tmp_path)
    hf_model, info = AutoModelForSeq2SeqLM.from_pretrained(tmp_path, output_loading_info=True)
    assert [sorted(info[kind]) for kind in ("missing_keys", "unexpected_keys")] == [[], []]
    src, src_mask, tgt, tgt_mask = _batches(model.spec.vocab_size, model.spec.vocab_size)
    with torch.no_grad():
        theirs = hf_model.eval()(
            input_ids=src, attention_mask=src_mask, decoder_input_ids=tgt, decoder_attention_mask=tgt_mask
        )
        ours = model(src, attention_mask=src_mask, decoder_input_ids=tgt, decoder_attention_mask=tgt_mask)
    _assert_same_at_real_positions(ours.logits, theirs.logits, tgt_mask)


@pytest.mark.parametrize("name", ["t5-v1.0", "bart", "marian"])
def test_source_padding_does_not_change_real_encoder_outputs(name: str, tmp_path: Path) -> None:
    _save_hf(name, tmp_path)
    model = zoo.from_hf(tmp_path)
    src, src_mask, _, _ = _batches(model.spec.vocab_size, model.spec.vocab_size)
    padded = torch.cat([src, torch.full((2, 3), 5)], dim=1)  # 3 more pad slots, with non-pad ids
    padded_mask = torch.cat([src_mask, torch.zeros(2, 3, dtype=src_mask.dtype)], dim=1)
    with torch.no_grad():
        short = model.encode(src[1:, :4], src_mask[1:, :4]).hidden
        long = model.encode(padded, padded_mask).hidden
    torch.testing.assert_close(long[1, :4], short[0], atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    ("preset", "model_type"),
    [
        ("t5-small", "t5"),
        ("t5-tiny", "t5"),
        ("bart-base", "bart"),
        ("bart-tiny", "bart"),
        ("marian-en-de", "marian"),
    ],
)
def test_family_presets_survive_spec_to_config_and_back(preset: str, model_type: str) -> None:
    spec = zoo.preset(preset)
    mapping = MAPPINGS[model_type]
    names = set(mapping.zoo_to_hf(zoo.build(spec, device="meta", init=False).state_dict(), spec))
    back = mapping.config_to_spec(mapping.spec_to_config(spec), names)
    # T5 has one dropout_rate for residuals, attention weights and the FFN: only the residual one is in presets
    unsaid = {"source": True, "name": True}
    if model_type == "t5":
        unsaid |= {"attention": {"dropout"}, "ffn": {"dropout"}}
    assert back.model_dump(exclude=unsaid) == spec.model_dump(exclude=unsaid)


def test_t5_specs_say_which_version_they_are(tmp_path: Path) -> None:
    _save_hf("t5-v1.0", tmp_path / "v10")
    _save_hf("t5-v1.1", tmp_path / "v11")
    v10, v11 = zoo.from_hf(tmp_path / "v10").spec, zoo.from_hf(tmp_path / "v11").spec
    assert (v10.ffn.activation, v10.ffn.gated, v10.lm_head.tied, v10.lm_head.rescale_tied) == (
        "relu",
        False,
        True,
        True,
    )
    assert (v11.ffn.activation, v11.ffn.gated, v11.lm_head.tied, v11.lm_head.rescale_tied) == (
        "gelu_tanh", True, False, False
    )  # fmt: skip
    assert (v10.attention.scaled, v10.attention.head_dim, v10.start_token_id) == (False, 8, 0)


def test_marian_sinusoids_equal_transformers_table_and_stored_copy_is_ignored(tmp_path: Path) -> None:
    hf_model = _save_hf("marian", tmp_path)
    model = zoo.from_hf(tmp_path)
    table = hf_model.model.encoder.embed_positions.weight
    torch.testing.assert_close(model.encoder.positions.table[: table.shape[0]], table, atol=1e-6, rtol=0)
    tensors = {f"model.{k}": v for k, v in hf_model.model.state_dict().items()}  # with embed_positions
    tensors |= {"final_logits_bias": hf_model.final_logits_bias}
    assert "model.encoder.embed_positions.weight" in tensors
    converted = MAPPINGS["marian"].hf_to_zoo(tensors, model.spec)
    assert not any("positions" in key for key in converted)
    model.load_state_dict(converted, strict=True)


def test_headless_bart_checkpoint_imports_with_zero_logits_bias(tmp_path: Path) -> None:
    hf_model = _randomise(_bart())
    hf_model.model.save_pretrained(tmp_path)  # a BartModel: no "model." prefix, no final_logits_bias
    tensors = load_file(tmp_path / "model.safetensors")
    assert not any(k.startswith("model.") for k in tensors)
    spec = MAPPINGS["bart"].config_to_spec(json.loads((tmp_path / "config.json").read_text()), set(tensors))
    converted = MAPPINGS["bart"].hf_to_zoo(tensors, spec)
    assert torch.equal(converted["lm_head.final_logits_bias"], torch.zeros(1, VOCAB))
    assert torch.equal(converted["embed.tokens.weight"], hf_model.model.shared.weight)


def test_t5_config_claiming_tied_head_rejects_a_different_lm_head(tmp_path: Path) -> None:
    hf_model = _save_hf("t5-v1.1", tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    config = hf_model.config.to_dict() | {"scale_decoder_outputs": True}  # v1.0 config, v1.1 weights
    spec = MAPPINGS["t5"].config_to_spec(config, set(tensors))
    with pytest.raises(ValueError, match=r"lm_head\.weight differs from shared\.weight"):
        MAPPINGS["t5"].hf_to_zoo(tensors, spec)


def test_missing_hf_tensor_is_named(tmp_path: Path) -> None:
    _save_hf("bart", tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    config = json.loads((tmp_path / "config.json").read_text())
    spec = MAPPINGS["bart"].config_to_spec(config, set(tensors))
    del tensors["model.decoder.layers.1.encoder_attn.v_proj.bias"]
    with pytest.raises(
        ValueError, match=r"lacks tensors: model\.decoder\.layers\.1\.encoder_attn\.v_proj\.bias"
    ):
        MAPPINGS["bart"].hf_to_zoo(tensors, spec)


@pytest.mark.parametrize(
    ("model_type", "preset", "change", "field"),
    [
        ("t5", "t5-tiny", {"attention.bias": True}, "attention.bias"),
        ("t5", "t5-tiny", {"norm.placement": "post"}, "norm.placement"),
        (
            "t5",
            "t5-tiny",
            {"decoder.ffn": {"d_ff": 32, "activation": "gelu_tanh", "gated": True, "bias": False}},
            "decoder.ffn.d_ff",
        ),
        ("bart", "bart-tiny", {"ffn.gated": True}, "ffn.gated"),
        ("bart", "bart-tiny", {"encoder.position": {"kind": "sinusoidal"}}, "encoder.position.kind"),
        ("marian", "bart-tiny", {}, "position.kind"),
        ("bart", "bart-tiny", {"source_vocab_size": 300}, "source_vocab_size"),
    ],
)
def test_to_hf_names_the_spec_field_the_family_cannot_express(model_type, preset, change, field) -> None:
    spec = zoo.preset(preset).override(**change)
    with pytest.raises(ValueError, match=rf"{model_type} cannot express {re.escape(field)}="):
        faithful_config(MAPPINGS[model_type], spec)
