"""``zoo convert``: zoo -> zoo re-saves, Hugging Face round trips, and clean errors."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import torch
from support import TINY_PRESETS

import zoo
from zoo.cli import main
from zoo.io.tokenizer import train_tokenizer


def saved_model(path: Path, name: str = "gpt2-tiny", *, tokenizer: bool = False) -> zoo.ZooModel:
    model = zoo.build(name).eval()
    with torch.no_grad():
        for tensor in model.state_dict().values():
            tensor.normal_(0.0, 0.05)  # every tensor distinct, biases and norms included
    tok = None
    if tokenizer:
        tok = train_tokenizer(
            iter(["a cat sat", "a dog sat"] * 4), kind="bpe", vocab_size=30, min_frequency=1
        )
    zoo.save(model, path, tokenizer=tok)
    return model


def assert_same(loaded: zoo.ZooModel, expected: dict[str, torch.Tensor]) -> None:
    state = loaded.state_dict()
    assert state.keys() == expected.keys()
    for name, tensor in state.items():
        assert tensor.dtype == expected[name].dtype and torch.equal(tensor, expected[name]), name


def test_convert_from_zoo_reshards_casts_and_carries_the_tokenizer(tmp_path: Path) -> None:
    model = saved_model(tmp_path / "a", tokenizer=True)
    argv = ["convert", "--from-zoo", str(tmp_path / "a"), "--out", str(tmp_path / "b")]
    assert main([*argv, "--dtype", "bfloat16", "--max-shard-size", "100kB"]) == 0
    assert (tmp_path / "b" / "model.safetensors.index.json").is_file()
    assert_same(zoo.load(tmp_path / "b"), {k: v.bfloat16() for k, v in model.state_dict().items()})
    assert zoo.load_tokenizer(tmp_path / "b").encode("a cat") == zoo.load_tokenizer(tmp_path / "a").encode(
        "a cat"
    )

    assert main(["convert", "--from-zoo", str(tmp_path / "a"), "--out", str(tmp_path / "c")]) == 0
    assert_same(zoo.load(tmp_path / "c"), model.state_dict())  # no options: bit-exact


def test_convert_reports_a_bad_source_without_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    assert main(["convert", "--from-zoo", str(tmp_path / "nope"), "--out", str(tmp_path / "out")]) == 2
    err = " ".join(capsys.readouterr().err.split())  # rich wraps long lines
    assert "no such checkpoint" in err and "nope" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_convert_rejects_a_shard_size_for_hugging_face_output(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    saved_model(tmp_path / "a")
    argv = [
        "convert",
        "--to-hf",
        str(tmp_path / "a"),
        "--out",
        str(tmp_path / "hf"),
        "--max-shard-size",
        "1GB",
    ]
    assert main(argv) == 2
    assert "--max-shard-size applies to zoo output" in " ".join(capsys.readouterr().err.split())


def test_convert_needs_exactly_one_source(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        main(["convert", "--out", str(tmp_path)])
    with pytest.raises(SystemExit):
        main(["convert", "--from-hf", "a", "--to-hf", "b", "--out", str(tmp_path)])


def _hf() -> object:
    hf = importlib.import_module("zoo.io.hf")
    if not (hasattr(hf, "from_hf") and hasattr(hf, "to_hf")):
        pytest.skip("zoo.io.hf does not provide from_hf / to_hf yet")
    return hf


@pytest.mark.parametrize("name", [name for name in TINY_PRESETS if name != "transformer-tiny"])
def test_convert_to_hugging_face_and_back_is_bit_exact(tmp_path: Path, name: str) -> None:
    _hf()
    model = saved_model(tmp_path / "zoo", name, tokenizer=True)
    assert main(["convert", "--to-hf", str(tmp_path / "zoo"), "--out", str(tmp_path / "hf")]) == 0
    assert (tmp_path / "hf" / "config.json").is_file() and (tmp_path / "hf" / "tokenizer.json").is_file()
    assert main(["convert", "--from-hf", str(tmp_path / "hf"), "--out", str(tmp_path / "back")]) == 0
    back = zoo.load(tmp_path / "back")
    assert_same(back, model.state_dict())
    ids = torch.arange(3, 17).view(2, 7)
    with torch.no_grad():
        if model.spec.family == "encoder-decoder":
            assert torch.equal(
                back(ids, decoder_input_ids=ids[:, :4]).logits,
                model(ids, decoder_input_ids=ids[:, :4]).logits,
            )
        else:
            assert torch.equal(back(ids).logits, model(ids).logits)
    assert zoo.load_tokenizer(tmp_path / "back").vocab_size == zoo.load_tokenizer(tmp_path / "zoo").vocab_size
