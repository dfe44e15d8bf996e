"""Hugging Face interop for the pre-norm BARTs: mBART and Pegasus.

Small random transformers models, every option off its default (more decoder layers, another FFN width
per stack, the activation, scaled embeddings, a tied or an own head, the token ids), are saved with
``save_pretrained`` and imported with `zoo.from_hf`: logits equal on right-padded source and decoder
batches, greedy ``generate`` token for token (mBART with its target language forced first). zoo models go
back out with `zoo.to_hf` and must load in transformers with nothing missing or unexpected and the same
logits. Nothing is downloaded.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

import zoo
from zoo.io.hf import mbart
from zoo.io.hf.faithful import faithful_config

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

V, LANGUAGE = 96, 90  # mBART keeps its language tokens (en_XX, ...) at the end of the vocabulary
SIZES = dict(
    vocab_size=V, d_model=32, encoder_layers=2, decoder_layers=3, encoder_attention_heads=4,
    decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=48, max_position_embeddings=40,
    dropout=0.2, attention_dropout=0.1, activation_dropout=0.1, init_std=0.05,
)  # fmt: skip
MAPPINGS = {m.model_types[0]: m for m in mbart.MAPPINGS}


def _mbart(**extra: object) -> nn.Module:
    config = transformers.MBartConfig(**SIZES, scale_embedding=True, **extra)
    return transformers.MBartForConditionalGeneration(config)


def _pegasus(**extra: object) -> nn.Module:
    config = transformers.PegasusConfig(**SIZES, scale_embedding=True, **extra)
    return transformers.PegasusForConditionalGeneration(config)


# name -> (transformers model; the tokens: pad, eos, decoder start or None, forced first token or None)
HF_MODELS: dict[str, tuple[Callable[[], nn.Module], tuple[int, int, int | None, int | None]]] = {
    "mbart": (lambda: _mbart(activation_function="gelu"), (1, 2, None, LANGUAGE)),
    "mbart-own-head": (
        lambda: _mbart(activation_function="relu", tie_word_embeddings=False, decoder_start_token_id=2),
        (1, 2, 2, LANGUAGE),
    ),
    "pegasus": (lambda: _pegasus(activation_function="relu"), (0, 1, 0, None)),
    "pegasus-own-head": (
        lambda: _pegasus(
            activation_function="silu",
            tie_word_embeddings=False,
            pad_token_id=3,
            eos_token_id=4,
            decoder_start_token_id=3,
        ),
        (3, 4, 3, None),
    ),
}


@torch.no_grad()
def lively(model: nn.Module) -> nn.Module:
    """Weights large enough that outputs depend on the context; norms, biases and the logits bias off their
    1s and 0s; an untied head its own values; fixed tables as they are."""
    torch.manual_seed(0)
    for name, param in model.named_parameters():
        if not param.requires_grad:  # Pegasus's fixed sinusoids: stored, never trained
            continue
        if param.dim() >= 2:
            # cross-attention weaker: its output is nearly the same at every target position, and a strong
            # one makes greedy decoding repeat one token whatever came before
            std = 0.2 if "embed" in name or "shared" in name else 1.0 if "encoder_attn" in name else 3.0
            param.normal_(0.0, std if std == 0.2 else std / math.sqrt(32))
        else:
            param.add_(torch.randn_like(param) * 0.2)
    model.final_logits_bias.normal_(0.0, 0.1)
    base = model.get_encoder().embed_tokens.weight, model.get_decoder().embed_tokens.weight
    for table in base:  # with tie_word_embeddings false transformers 5.x unties them from ``shared`` too;
        table.copy_(model.model.shared.weight)  # checkpoints hold one table (only the head apart)
    return model.eval()


def save(name: str, path: Path) -> nn.Module:
    model = lively(HF_MODELS[name][0]())
    model.save_pretrained(path)
    return model


def batches(pad: int) -> tuple[torch.Tensor, ...]:
    """Right-padded sources (lengths 7, 4) and decoder inputs (5, 3), padded with the pad id."""
    g = torch.Generator().manual_seed(3)
    src_mask = torch.tensor([[1] * 7, [1] * 4 + [0] * 3])
    tgt_mask = torch.tensor([[1] * 5, [1] * 3 + [0] * 2])
    src = torch.randint(3, V, (2, 7), generator=g).masked_fill(src_mask == 0, pad)
    tgt = torch.randint(3, V, (2, 5), generator=g).masked_fill(tgt_mask == 0, pad)
    return src, src_mask, tgt, tgt_mask


@torch.no_grad()
def assert_same_logits(model: zoo.ZooModel, hf: nn.Module) -> None:
    src, src_mask, tgt, tgt_mask = batches(model.spec.pad_token_id)
    theirs = hf(
        input_ids=src, attention_mask=src_mask, decoder_input_ids=tgt, decoder_attention_mask=tgt_mask
    )
    ours = model(src, attention_mask=src_mask, decoder_input_ids=tgt, decoder_attention_mask=tgt_mask)
    for mine, reference, mask in (
        (ours.encoder_last_hidden_state, theirs.encoder_last_hidden_state, src_mask),
        (ours.logits, theirs.logits, tgt_mask),
    ):
        real = mask.bool()
        assert reference[real].abs().max() > 1e-2  # a real signal
        torch.testing.assert_close(mine[real], reference[real], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("name", list(HF_MODELS))
def test_imported_model_gives_transformers_logits_and_greedy_tokens(name: str, tmp_path: Path) -> None:
    hf = save(name, tmp_path)
    model = zoo.from_hf(tmp_path)
    assert_same_logits(model, hf)
    pad, eos, start, forced = HF_MODELS[name][1]
    src, src_mask, _, _ = batches(pad)
    config = transformers.GenerationConfig(
        do_sample=False, num_beams=1, max_new_tokens=8, min_new_tokens=0, eos_token_id=eos, pad_token_id=pad,
        bos_token_id=getattr(hf.config, "bos_token_id", None), decoder_start_token_id=start, forced_bos_token_id=forced,
        forced_eos_token_id=None, no_repeat_ngram_size=0, repetition_penalty=1.0,
        use_cache=False,  # transformers sizes its cache by the encoder's depth: 2 layers, the decoder has 3
    )  # fmt: skip
    hf.generation_config = config  # no saved default can leak in
    with torch.no_grad():
        theirs = hf.generate(src, attention_mask=src_mask, generation_config=config)
    ours = model.generate(src, attention_mask=src_mask, max_new_tokens=8, forced_bos_token_id=forced)
    first = start if start is not None else hf.config.bos_token_id  # mBART without a start token
    assert (ours[:, 0] == first).all()
    assert len(set(ours[:, 2:].flatten().tolist())) >= 3  # the context matters: not one token repeated
    assert torch.equal(ours, theirs)


def test_mbart_import_reads_pre_norm_bart_wiring(tmp_path: Path) -> None:
    save("mbart", tmp_path)
    spec = zoo.from_hf(tmp_path).spec
    assert (spec.norm.placement, spec.norm.has_final, spec.embedding.scale, spec.embedding.norm) == (
        "pre", True, True, True,
    )  # fmt: skip
    assert spec.position.model_dump() == {"kind": "learned", "offset": 2, "relative_bias": None}
    assert spec.lm_head.tied and spec.lm_head.logits_bias
    # MBartConfig has no decoder start: generation starts from bos, as in transformers
    assert (spec.decoder_start_token_id, spec.start_token_id, spec.pad_token_id) == (None, 0, 1)


def test_pegasus_import_reads_sinusoids_and_ignores_the_stored_table(tmp_path: Path) -> None:
    hf = save("pegasus", tmp_path)
    model = zoo.from_hf(tmp_path)
    spec = model.spec
    assert (spec.norm.placement, spec.norm.has_final, spec.embedding.scale, spec.embedding.norm) == (
        "pre", True, True, False,
    )  # fmt: skip
    assert spec.position.model_dump() == {
        "kind": "sinusoidal",
        "layout": "half",
        "offset": 0,
        "frequencies": "paper",
    }
    assert (spec.start_token_id, spec.pad_token_id, spec.eos_token_id) == (0, 0, 1)
    table = hf.model.encoder.embed_positions.weight  # transformers' (sines | cosines) table, also stored
    torch.testing.assert_close(model.encoder.positions.table, table, atol=1e-6, rtol=0)


@pytest.mark.parametrize("name", list(HF_MODELS))
def test_to_hf_loads_in_transformers_with_nothing_missing_and_same_logits(name: str, tmp_path: Path) -> None:
    source = save(name, tmp_path / "source")
    spec = zoo.from_hf(tmp_path / "source").spec
    model = zoo.build(spec)
    with torch.no_grad():  # its own weights: norms, biases and the logits bias off their defaults
        for param in model.parameters():
            param.add_(torch.randn_like(param) * (0.1 if param.dim() == 1 else 0.5))
        model.lm_head.final_logits_bias.normal_(0.0, 0.5)
    model_type = name.split("-")[0]
    zoo.to_hf(model.eval(), tmp_path / "export", model_type=model_type)
    config = json.loads((tmp_path / "export" / "config.json").read_text())
    assert (config["model_type"], config["architectures"]) == (model_type, [type(source).__name__])
    for key in ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id", "scale_embedding"):
        assert config[key] == getattr(source.config, key, None), key  # PegasusConfig has no bos
    hf, info = transformers.AutoModelForSeq2SeqLM.from_pretrained(
        tmp_path / "export", output_loading_info=True
    )
    assert [sorted(info[k]) for k in ("missing_keys", "unexpected_keys", "mismatched_keys")] == [[], [], []]
    assert type(hf) is type(source)
    assert_same_logits(model, hf.eval())


def test_to_hf_without_model_type_writes_a_pre_norm_bart_as_mbart(tmp_path: Path) -> None:
    model = zoo.build(zoo.preset("bart-tiny").override(norm={"placement": "pre"}))
    zoo.to_hf(model, tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "mbart"


@pytest.mark.parametrize(
    ("model_type", "change", "field"),
    [
        ("mbart", {"norm.placement": "post"}, "norm.placement"),
        ("mbart", {"norm.final": False}, "norm.final"),
        ("mbart", {"embedding.norm": False}, "embedding.norm"),
        ("mbart", {"position": {"kind": "learned", "offset": 0}}, "position.offset"),
        ("mbart", {"decoder.position": {"kind": "sinusoidal", "layout": "half"}}, "decoder.position.kind"),
        ("mbart", {"ffn.gated": True}, "ffn.gated"),
        ("mbart", {"source_vocab_size": 300}, "source_vocab_size"),
        ("mbart", {"norm.eps": 1e-6}, "norm.eps"),
        ("pegasus", {"embedding.norm": True}, "embedding.norm"),
        ("pegasus", {"position": {"kind": "sinusoidal", "layout": "interleaved"}}, "position.layout"),
        ("pegasus", {"position": {"kind": "sinusoidal", "layout": "half", "offset": 2}}, "position.offset"),
        ("pegasus", {"norm.kind": "rmsnorm"}, "norm.kind"),
    ],
)
def test_to_hf_names_the_spec_field_the_variant_cannot_express(model_type, change, field) -> None:
    preset = {"mbart": "mbart-large-cc25", "pegasus": "pegasus-large"}[model_type]
    spec = zoo.preset(preset).override(vocab_size=512, **change)
    with pytest.raises(ValueError, match=rf"{model_type} cannot express {field}="):
        faithful_config(MAPPINGS[model_type], spec)


@pytest.mark.parametrize(
    ("preset", "config_class", "count"),
    [("mbart-large-cc25", "MBartConfig", 610_851_840)],
)
def test_preset_has_the_published_shape_and_parameter_count(
    preset: str, config_class: str, count: int
) -> None:
    """transformers' model from the published config.json (facebook/mbart-large-cc25), built on the meta
    device, has zoo's tensor names and parameter count (``final_logits_bias`` is a buffer in both)."""
    spec = zoo.preset(preset)
    mapping = MAPPINGS[preset.split("-")[0]]
    config = getattr(transformers, config_class)(**mapping.spec_to_config(spec))
    with torch.device("meta"):
        hf = transformers.AutoModelForSeq2SeqLM.from_config(config)
    assert zoo.build(spec, device="meta").num_parameters() == hf.num_parameters() == count
    names = set(mapping.zoo_to_hf(zoo.build(spec, device="meta", init=False).state_dict(), spec))
    assert names == {n for n in hf.state_dict() if n != "lm_head.weight" and "embed_tokens" not in n}
    back = mapping.config_to_spec(mapping.spec_to_config(spec), names)
    unsaid = {"source": True, "name": True}
    assert back.model_dump(exclude=unsaid) == spec.model_dump(exclude=unsaid)
