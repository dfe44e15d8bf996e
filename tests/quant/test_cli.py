"""``zoo quantize`` end to end: a checkpoint, a preset and a Hugging Face folder in; a quantised zoo run out
that `zoo translate`, `zoo generate` and `zoo show` read like any other."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from generation.conftest import liven

import zoo
from zoo.cli import main
from zoo.io.tokenizer import train_tokenizer
from zoo.quant import quantization_of, quantize

pytest.importorskip("torchao")

CORPUS = ["the cat sat on the mat", "the dog sat on the log", "a cat and a dog met on the mat"] * 5


@pytest.fixture(scope="module")
def tokenizer():  # type: ignore[no-untyped-def]
    return train_tokenizer(iter(CORPUS), kind="bpe", vocab_size=60, min_frequency=1)


def _saved(directory: Path, spec: zoo.ModelSpec, tokenizer, seed: int = 0) -> zoo.ZooModel:  # type: ignore[no-untyped-def]
    torch.manual_seed(seed)
    model = liven(zoo.build(spec).eval())  # the greedy tokens differ from step to step
    zoo.save(model, directory, tokenizer=tokenizer)
    return model


def _one_line(text: str) -> str:
    return " ".join(text.split())  # rich wraps long lines


def test_zoo_quantize_writes_a_run_that_zoo_translate_reads(tmp_path: Path, tokenizer, capsys) -> None:  # type: ignore[no-untyped-def]
    spec = zoo.preset("transformer-tiny").override(vocab_size=64, num_layers=2, max_positions=64)
    model = _saved(tmp_path / "mt", spec, tokenizer, seed=4)
    assert main(["quantize", str(tmp_path / "mt"), "--out", str(tmp_path / "mt8")]) == 0
    out = _one_line(capsys.readouterr().out)
    assert "int8 weight-only (per output row), 22 tensors, torchao" in out and "mt8" in out
    assert (tmp_path / "mt8" / "tokenizer.json").is_file()  # carried over: translate needs it

    source = tokenizer.encode("the cat sat", add_eos=True)
    expected = quantize(model).generate(torch.tensor([source]), max_new_tokens=7)[0, 1:].tolist()
    assert main(["translate", str(tmp_path / "mt8"), "the cat sat", "--max-new-tokens", "7"]) == 0
    printed = _one_line(capsys.readouterr().out)
    assert printed and printed == _one_line(tokenizer.decode(expected))


def test_zoo_generate_runs_an_int4_run_in_bfloat16(tmp_path: Path, tokenizer, capsys) -> None:  # type: ignore[no-untyped-def]
    model = _saved(tmp_path / "gpt", zoo.preset("llama-tiny").override(vocab_size=64), tokenizer)
    argv = ["quantize", str(tmp_path / "gpt"), "--out", str(tmp_path / "gpt4"), "--weights", "int4"]
    assert main([*argv, "--dtype", "bf16", "--group-size", "64"]) == 0
    loaded = zoo.load(tmp_path / "gpt4")
    record = quantization_of(loaded)
    assert record is not None and (record.weights, record.group_size) == ("int4", 64)
    assert loaded.embed.tokens.weight.dtype == torch.bfloat16
    capsys.readouterr()

    prompt = tokenizer.encode("the cat", add_bos=True, add_eos=False)
    reference = quantize(model.to(torch.bfloat16), "int4", group_size=64)
    new = reference.generate(torch.tensor([prompt]), max_new_tokens=6)[0, len(prompt) :].tolist()
    assert main(["generate", str(tmp_path / "gpt4"), "--prompt", "the cat", "--max-new-tokens", "6"]) == 0
    out = capsys.readouterr().out
    assert _one_line(out[len("the cat") :]) == _one_line(tokenizer.decode(new))


def test_zoo_show_says_the_weights_are_int8(tmp_path: Path, tokenizer, capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["quantize", "gpt2-tiny", "--out", str(tmp_path / "q")]) == 0  # a preset: seed-0 weights
    capsys.readouterr()
    assert main(["show", str(tmp_path / "q"), "--depth", "1"]) == 0
    assert "quantised: int8 weight-only (per output row), 8 tensors" in _one_line(capsys.readouterr().out)
    assert main(["show", str(tmp_path / "q"), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["quantization"]["weights"] == "int8" and len(shown["quantization"]["tensors"]) == 8
    assert main(["show", "gpt2-tiny", "--json"]) == 0
    assert "quantization" not in json.loads(capsys.readouterr().out)


def test_zoo_quantize_takes_a_hugging_face_folder(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("transformers")
    torch.manual_seed(0)
    zoo.to_hf(zoo.build("llama-tiny").eval(), tmp_path / "hf")
    assert main(["quantize", str(tmp_path / "hf"), "--out", str(tmp_path / "q")]) == 0
    record = quantization_of(zoo.load(tmp_path / "q"))
    assert record is not None and "lm_head.weight" in record.tensors


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--weights", "int4", "--group-size", "48"], "group_size 48: int4 takes 32, 64, 128"),
        (["--group-size", "32"], "group_size 32: int8 weights have one scale per output row"),
    ],
)
def test_zoo_quantize_reports_a_bad_setting_in_one_line(
    tmp_path: Path, capsys, argv: list[str], message: str
) -> None:  # type: ignore[no-untyped-def]
    assert main(["quantize", "gpt2-tiny", "--out", str(tmp_path / "q"), *argv]) == 2
    err = _one_line(capsys.readouterr().err)
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "q").exists()


def test_zoo_quantize_refuses_its_source_as_out(tmp_path: Path, tokenizer, capsys) -> None:  # type: ignore[no-untyped-def]
    _saved(tmp_path / "gpt", zoo.preset("gpt2-tiny"), tokenizer)
    assert main(["quantize", str(tmp_path / "gpt"), "--out", str(tmp_path / "gpt")]) == 2
    assert "quantising in place would replace the weights" in _one_line(capsys.readouterr().err)
