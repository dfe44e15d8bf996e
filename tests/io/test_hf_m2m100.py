"""Hugging Face interop for M2M-100: parity with transformers both ways, greedy generation with the target
language forced first, fairseq's sinusoids, and what an M2M-100 export refuses.

Small random ``M2M100ForConditionalGeneration`` models are saved with ``save_pretrained`` and imported with
`zoo.from_hf`; zoo models go out with `zoo.to_hf` and back in with ``from_pretrained``. Every parameter is
perturbed before saving. Nothing is downloaded.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import zoo
from zoo.io.hf import m2m100
from zoo.io.hf.faithful import faithful_config
from zoo.spec import SpecError, buffer_count

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

V, PAD, EOS = 96, 1, 2
SIZES = dict(
    vocab_size=V, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
    decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=48, max_position_embeddings=64,
)  # fmt: skip
LANGUAGE = 90  # a "__xx__" language token: M2M-100 keeps them at the end of its vocabulary


@torch.no_grad()
def lively(model: torch.nn.Module) -> torch.nn.Module:
    """Weights large enough that outputs depend on the context, norms and biases off their 1s and 0s, and
    the pad row zero (as M2M-100's ``padding_idx`` keeps it): no greedy step can pick pad, which
    transformers would then number as padding (it counts positions over ``input_ids != pad``)."""
    torch.manual_seed(0)
    for name, param in model.named_parameters():
        if param.dim() >= 2:
            param.normal_(0.0, 0.3 if "shared" in name or "embed" in name else 2.0 / math.sqrt(32))
        else:
            param.add_(torch.randn_like(param) * 0.1)
    model.get_input_embeddings().weight[PAD] = 0.0
    return model.eval()


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[torch.nn.Module, zoo.ZooModel]:
    """(transformers' model, the same model imported into zoo)."""
    hf = lively(transformers.M2M100ForConditionalGeneration(transformers.M2M100Config(**SIZES)))
    path = tmp_path_factory.mktemp("m2m100")
    hf.save_pretrained(path)
    return hf, zoo.from_hf(path)


def batches() -> tuple[torch.Tensor, ...]:
    """Right-padded sources (lengths 7, 4) and decoder inputs (5, 3), padded with the pad id."""
    g = torch.Generator().manual_seed(3)
    src_mask = torch.tensor([[1] * 7, [1] * 4 + [0] * 3])
    tgt_mask = torch.tensor([[1] * 5, [1] * 3 + [0] * 2])
    src = torch.randint(3, V, (2, 7), generator=g).masked_fill(src_mask == 0, PAD)
    tgt = torch.randint(3, V, (2, 5), generator=g).masked_fill(tgt_mask == 0, PAD)
    return src, src_mask, tgt, tgt_mask


@torch.no_grad()
def assert_same_logits(model: zoo.ZooModel, hf: torch.nn.Module) -> None:
    src, src_mask, tgt, tgt_mask = batches()
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


def test_imported_model_reads_fairseq_wiring_from_the_config(pair) -> None:
    spec = pair[1].spec
    assert (spec.norm.placement, spec.norm.has_final, spec.embedding.scale, spec.embedding.norm) == (
        "pre", True, True, False,
    )  # fmt: skip
    assert spec.position.model_dump() == {
        "kind": "sinusoidal", "layout": "half", "offset": PAD + 1, "frequencies": "fairseq",
    }  # fmt: skip
    assert spec.lm_head.tied and not spec.lm_head.logits_bias and spec.start_token_id == EOS


def test_imported_model_gives_transformers_logits_on_padded_batches(pair) -> None:
    hf, model = pair
    assert_same_logits(model, hf)


def test_greedy_generate_with_forced_target_language_equals_transformers(pair) -> None:
    hf, model = pair
    src, src_mask, _, _ = batches()
    config = transformers.GenerationConfig(
        do_sample=False, num_beams=1, max_new_tokens=10, min_new_tokens=0, eos_token_id=EOS,
        pad_token_id=PAD, decoder_start_token_id=EOS, forced_bos_token_id=LANGUAGE, forced_eos_token_id=None,
        repetition_penalty=1.0, no_repeat_ngram_size=0, bad_words_ids=None,
    )  # fmt: skip
    hf.generation_config = config  # no saved default can leak in
    with torch.no_grad():
        theirs = hf.generate(src, attention_mask=src_mask, generation_config=config)
    ours = model.generate(src, attention_mask=src_mask, max_new_tokens=10, forced_bos_token_id=LANGUAGE)
    assert (ours[:, 0] == EOS).all() and (ours[:, 1] == LANGUAGE).all()  # start = eos, then the language
    assert len(set(ours[:, 2:].flatten().tolist())) > 3  # the context matters: not one token repeated
    assert torch.equal(ours, theirs)


def test_to_hf_writes_m2m_100_that_transformers_loads_with_same_logits(pair, tmp_path) -> None:
    model = zoo.build(pair[1].spec)
    with torch.no_grad():  # its own weights: norms and biases off their defaults
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.1)
    zoo.to_hf(model.eval(), tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert (config["model_type"], config["architectures"]) == ("m2m_100", ["M2M100ForConditionalGeneration"])
    assert (config["scale_embedding"], config["pad_token_id"], config["decoder_start_token_id"]) == (
        True,
        PAD,
        EOS,
    )
    assert not any("embed_positions" in name for name in load_file(tmp_path / "model.safetensors"))
    hf, info = transformers.AutoModelForSeq2SeqLM.from_pretrained(tmp_path, output_loading_info=True)
    assert [sorted(info[k]) for k in ("missing_keys", "unexpected_keys", "mismatched_keys")] == [[], [], []]
    assert_same_logits(model, hf.eval())


def test_fairseq_sinusoids_equal_transformers_table() -> None:
    get_embedding = (
        transformers.models.m2m_100.modeling_m2m_100.M2M100SinusoidalPositionalEmbedding.get_embedding
    )
    model = zoo.build(zoo.preset("m2m100-418m"), device="meta")
    positions = type(model.encoder.positions)(
        layout="half", max_positions=1024, dim=1024, offset=PAD + 1, frequencies="fairseq"
    )
    theirs = get_embedding(1024 + 2, 1024, padding_idx=PAD)  # transformers' table: max positions + 2 rows
    ours = positions.table
    assert ours.shape == theirs.shape and ours.dtype == torch.float32
    # Rows from the offset on are read. transformers computes the angles row * rate in float32 (rounding
    # error up to ~row * 2^-24), zoo in float64 rounded once: the tables differ by that much and no more.
    rows = torch.arange(PAD + 1, 1024 + 2)[:, None]
    difference = (ours[PAD + 1 :] - theirs[PAD + 1 :]).abs()
    assert (difference <= 2 * rows * 2.0**-24 + 1e-7).all() and difference.max() < 1e-4
    ids = torch.tensor([[0, 5]])  # the first token reads row pad + 1
    torch.testing.assert_close(positions(ids)[0], theirs[[PAD + 1, PAD + 6]], atol=1e-6, rtol=0)


def test_offset_sizes_the_fixed_table() -> None:
    spec = zoo.preset("m2m100-418m")
    model = zoo.build(spec, device="meta")
    assert model.encoder.positions.table.shape == (spec.max_positions + 2, spec.d_model)
    assert buffer_count(spec) == sum(b.numel() for b in model.buffers())


def test_fairseq_frequencies_need_the_half_layout() -> None:
    with pytest.raises(SpecError, match=r"encoder\.position.*frequencies 'fairseq' needs layout 'half'"):
        zoo.preset("transformer-tiny").override(
            encoder={"position": {"kind": "sinusoidal", "frequencies": "fairseq"}}
        )


def test_preset_has_the_published_shape_and_parameter_count() -> None:
    """facebook/m2m100_418M's config.json is transformers' M2M100Config defaults."""
    with torch.device("meta"):
        hf = transformers.M2M100ForConditionalGeneration(transformers.M2M100Config())
    spec = zoo.preset("m2m100-418m")
    assert zoo.build(spec, device="meta").num_parameters() == hf.num_parameters() == 483_905_536
    names = set(m2m100.MAPPING.zoo_to_hf(zoo.build(spec, device="meta", init=False).state_dict(), spec))
    assert names == {n for n in hf.state_dict() if n not in ("lm_head.weight",) and "embed_tokens" not in n}
    back = m2m100.MAPPING.config_to_spec(m2m100.MAPPING.spec_to_config(spec), names)
    unsaid = {"source": True, "name": True}
    assert back.model_dump(exclude=unsaid) == spec.model_dump(exclude=unsaid)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"norm.placement": "post"}, "norm.placement"),
        ({"norm.final": False}, "norm.final"),
        ({"position": {"offset": 0}}, "position.offset"),
        (
            {"decoder.position": {"kind": "sinusoidal", "layout": "half", "offset": 2}},
            "decoder.position.frequencies",
        ),
        ({"lm_head.logits_bias": True}, "lm_head.logits_bias"),
        ({"embedding.norm": True}, "embedding.norm"),
        ({"source_vocab_size": 300}, "source_vocab_size"),
        ({"pad_token_id": None}, "pad_token_id"),
    ],
)
def test_to_hf_names_the_spec_field_m2m_100_cannot_express(change, field) -> None:
    spec = zoo.preset("m2m100-418m").override(vocab_size=512, **change)
    with pytest.raises(ValueError, match=rf"m2m_100 cannot express {field}="):
        faithful_config(m2m100.MAPPING, spec)


def test_config_without_pad_token_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"pad_token_id=None .*numbers positions from pad_token_id \+ 1"):
        m2m100.MAPPING.config_to_spec({**SIZES, "model_type": "m2m_100", "pad_token_id": None}, set())
