"""The canonical Transformer (the ``transformer-*`` presets) exports to Hugging Face as ``MarianMTModel``.

The paper's interleaved sinusoids become Marian's half layout by re-ordering the residual stream's
coordinates (`zoo.io.hf.bart`): transformers must load the export with nothing missing or unexpected and
give zoo's logits on padded batches and zoo's greedy tokens; ``zoo convert --to-hf`` does the same from a
preset name and from a saved run with its tokenizer. Nothing is downloaded.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from support import padded_batch

import zoo
from zoo.blocks.position import sinusoidal_table
from zoo.cli import main
from zoo.io.hf import HFError, bart
from zoo.io.tokenizer import train_tokenizer

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

MARIAN = next(m for m in bart.MAPPINGS if m.model_types == ("marian",))


@torch.no_grad()
def _liven(model: zoo.ZooModel) -> zoo.ZooModel:
    """Every tensor random (norms, biases, a logits bias too), large enough that greedy decoding depends on
    the source: a coordinate left out of the permutation cannot hide behind 1s and 0s."""
    torch.manual_seed(0)
    for name, param in model.named_parameters():
        if param.dim() == 1:
            param.uniform_(0.5, 1.5) if "norm" in name else param.normal_(0.0, 0.2)
        else:
            std = 0.3 if "tokens" in name else 2.0 / math.sqrt(model.spec.d_model)
            param.normal_(0.0, std)
    return model.eval()


def _load_marian(path: Path) -> torch.nn.Module:
    hf, info = transformers.MarianMTModel.from_pretrained(path, output_loading_info=True)
    problems = {kind: sorted(info[kind]) for kind in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    assert problems == {"missing_keys": [], "unexpected_keys": [], "mismatched_keys": []}
    return hf.eval()


def _batches(spec: zoo.ModelSpec) -> tuple[torch.Tensor, ...]:
    """Right-padded sources (lengths 7, 4) and decoder inputs (5, 3)."""
    torch.manual_seed(1)
    src, src_mask = padded_batch(spec.source_vocab_size or spec.vocab_size, [7, 4])
    tgt, tgt_mask = padded_batch(spec.vocab_size, [5, 3])
    return src, src_mask, tgt, tgt_mask


def _same_at_real_positions(ours: torch.Tensor, theirs: torch.Tensor, mask: torch.Tensor) -> None:
    torch.testing.assert_close(ours[mask.bool()], theirs[mask.bool()], atol=1e-4, rtol=1e-4)


def _both(model: zoo.ZooModel, hf: torch.nn.Module) -> tuple:
    src, src_mask, tgt, tgt_mask = _batches(model.spec)
    with torch.no_grad():
        ours = model(src, attention_mask=src_mask, decoder_input_ids=tgt, decoder_attention_mask=tgt_mask)
        theirs = hf(
            input_ids=src, attention_mask=src_mask, decoder_input_ids=tgt, decoder_attention_mask=tgt_mask
        )
    return ours, theirs, src_mask, tgt_mask


def _hf_greedy(
    hf: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, **settings: object
) -> torch.Tensor:
    """transformers' greedy search with the start, pad and eos ids the exported config gives it."""
    assert hf.generation_config.decoder_start_token_id == hf.config.decoder_start_token_id
    with torch.no_grad():
        return hf.generate(
            ids, attention_mask=mask, min_new_tokens=0, do_sample=False, num_beams=1, repetition_penalty=1.0,
            no_repeat_ngram_size=0, bad_words_ids=None, forced_eos_token_id=None, **settings,
        )  # fmt: skip


# a source vocabulary of its own and an untied head: the other tensors the permutation must reach
SEPARATE = {"vocab_size": 400, "source_vocab_size": 300, "num_layers": 2, "lm_head": {"tied": False}}
VARIANTS = {"transformer-tiny": {}, "separate-vocab-untied": SEPARATE}


@pytest.fixture(scope="module", params=list(VARIANTS))
def exported(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """(zoo model, its export folder, transformers' MarianMTModel loaded from it)."""
    model = _liven(zoo.build(zoo.preset("transformer-tiny", **VARIANTS[request.param])))
    folder = zoo.to_hf(model, tmp_path_factory.mktemp(request.param) / "hf")
    return model, folder, _load_marian(folder)


def test_half_layout_order_maps_the_papers_sinusoids_onto_marians() -> None:
    for dim in (8, 128, 512):
        order = bart.half_layout_order(dim)
        assert torch.equal(sinusoidal_table(64, dim)[:, order], sinusoidal_table(64, dim, layout="half"))


def test_canonical_export_is_a_marian_checkpoint(exported) -> None:
    model, folder, _ = exported
    config = json.loads((folder / "config.json").read_text())
    spec = model.spec
    assert config["architectures"] == ["MarianMTModel"] and config["model_type"] == "marian"
    assert (config["d_model"], config["scale_embedding"], config["activation_function"]) == (
        128,
        True,
        "relu",
    )
    assert (config["pad_token_id"], config["eos_token_id"], config["decoder_start_token_id"]) == (0, 2, 1)
    assert config["share_encoder_decoder_embeddings"] is (spec.source_vocab_size is None)
    assert config["max_position_embeddings"] == spec.max_positions


def test_transformers_gives_zoos_logits_on_padded_batches(exported) -> None:
    model, _, hf = exported
    ours, theirs, src_mask, tgt_mask = _both(model, hf)
    _same_at_real_positions(ours.logits, theirs.logits, tgt_mask)
    # the encoder's states are zoo's with the residual coordinates in Marian's order
    order = bart.half_layout_order(model.spec.d_model)
    _same_at_real_positions(
        ours.encoder_last_hidden_state[..., order], theirs.encoder_last_hidden_state, src_mask
    )


def test_transformers_greedy_tokens_equal_zoos(exported) -> None:
    model, _, hf = exported
    src, src_mask, _, _ = _batches(model.spec)
    free = model.generate(src, attention_mask=src_mask, max_new_tokens=8, eos_token_id=[])
    # the configured eos (rarely produced by random weights), then one that row 0 produces: rows end apart
    for eos in (model.spec.eos_token_id, int(free[0, 2])):
        ours = model.generate(src, attention_mask=src_mask, max_new_tokens=8, eos_token_id=eos)
        theirs = _hf_greedy(hf, src, src_mask, max_new_tokens=8, eos_token_id=eos)
        assert torch.equal(ours, theirs), (eos, ours, theirs)
    assert (ours[:, 0] == 1).all()  # both start from the spec's start token (bos), as the config says


def test_reimport_reads_the_half_layout_with_the_same_logits(exported) -> None:
    model, folder, _ = exported
    back = zoo.from_hf(folder)
    assert back.spec.position.layout == "half"
    assert back.spec.norm.eps == model.spec.norm.eps == 1e-5
    src, src_mask, tgt, tgt_mask = _batches(model.spec)
    with torch.no_grad():
        ours = model(src, attention_mask=src_mask, decoder_input_ids=tgt, decoder_attention_mask=tgt_mask)
        again = back(src, attention_mask=src_mask, decoder_input_ids=tgt, decoder_attention_mask=tgt_mask)
    _same_at_real_positions(again.logits, ours.logits, tgt_mask)


@pytest.mark.parametrize("name", ["transformer-base", "transformer-big"])
def test_full_size_presets_map_onto_marians_tensors_exactly(name: str) -> None:
    """Config and tensor names/shapes only, on the meta device: no weights are made."""
    spec = zoo.preset(name)
    config = MARIAN.spec_to_config(spec)
    state = zoo.build(spec, device="meta", init=False).state_dict()
    ours = {key: tuple(t.shape) for key, t in MARIAN.zoo_to_hf(state, spec).items()}
    with torch.device("meta"):
        hf = transformers.MarianMTModel(transformers.MarianConfig(**config))
    # what transformers writes: no fixed sinusoids, and the tied copies of the shared table once
    skipped = {*hf._keys_to_ignore_on_save, "lm_head.weight"}
    skipped |= {f"model.{side}.embed_tokens.weight" for side in ("encoder", "decoder")}
    theirs = {key: tuple(t.shape) for key, t in hf.state_dict().items() if key not in skipped}
    assert ours == theirs
    assert (config["d_model"], config["encoder_layers"], config["vocab_size"]) == (
        spec.d_model, spec.num_layers, spec.vocab_size,
    )  # fmt: skip


def test_another_layernorm_eps_is_refused_naming_the_field() -> None:
    model = zoo.build(zoo.preset("transformer-tiny", **{"norm.eps": 1e-6}), device="meta", init=False)
    with pytest.raises(
        HFError, match=r"marian cannot express norm\.eps=1e-06: .*hard-codes LayerNorm eps 1e-05"
    ):
        zoo.to_hf(model, "unused")


def test_stacks_with_different_sinusoid_layouts_are_refused() -> None:
    spec = zoo.preset("transformer-tiny").override(
        decoder={"position": {"kind": "sinusoidal", "layout": "half"}}
    )
    with pytest.raises(HFError, match=r"marian cannot express decoder\.position="):
        MARIAN.spec_to_config(spec)


# -- zoo convert --to-hf ------------------------------------------------------------------------------------


def test_convert_builds_a_preset_name_with_initial_weights(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)  # no folder named transformer-tiny here
    assert main(["convert", "--to-hf", "transformer-tiny", "--out", "hf"]) == 0
    assert "random initial weights" in capsys.readouterr().out
    hf = _load_marian(tmp_path / "hf")
    ours, theirs, _, tgt_mask = _both(zoo.from_hf(tmp_path / "hf"), hf)
    _same_at_real_positions(ours.logits, theirs.logits, tgt_mask)


def test_convert_exports_a_trained_run_with_its_tokenizer(tmp_path: Path) -> None:
    """A run folder as `zoo demo` leaves it (model.safetensors, spec.json, tokenizer.json), small."""
    sentences = ["the cat eats fish", "the big dog chased three cats in the park", "she will cook fish"]
    tok = train_tokenizer(iter(sentences * 4), kind="bpe", vocab_size=60, min_frequency=1)
    spec = zoo.preset("transformer-tiny", vocab_size=tok.vocab_size, num_layers=2)
    model = _liven(zoo.build(spec))
    zoo.save(model, tmp_path / "run", tokenizer=tok)
    assert main(["convert", "--to-hf", str(tmp_path / "run"), "--out", str(tmp_path / "hf")]) == 0

    hf = _load_marian(tmp_path / "hf")
    hf_tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    batch = hf_tok(sentences[:2], padding=True, return_tensors="pt")
    for row, text in enumerate(sentences[:2]):
        real = batch["input_ids"][row][batch["attention_mask"][row].bool()]
        assert real.tolist() == tok.encode(text)
    ours = model.generate(batch["input_ids"], attention_mask=batch["attention_mask"], max_new_tokens=6)
    theirs = _hf_greedy(hf, batch["input_ids"], batch["attention_mask"], max_new_tokens=6)
    assert torch.equal(ours, theirs)
    assert hf_tok.batch_decode(theirs, skip_special_tokens=True) == tok.decode_batch(ours.tolist())
