"""``zoo convert --to-peft``: a LoRA run's adapters, put back on the base their file names, in PEFT's format;
peft loads them onto the transformers model ``zoo convert --to-hf`` makes of that base, with zoo's logits."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from lora.lora_support import batch, liven, logits, tiny

import zoo
import zoo.lora
from zoo.cli import main

peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")


def test_a_lora_runs_adapters_export_for_peft_from_the_command_line(tmp_path: Path) -> None:
    base = tiny("llama-tiny")
    zoo.save(base, tmp_path / "base")
    model = zoo.lora.load(zoo.load(tmp_path / "base"), _adapter(tmp_path, base))  # as a run leaves it
    run = tmp_path / "run"
    assert main(["convert", "--to-peft", str(run), "--out", str(tmp_path / "peft")]) == 0
    assert main(["convert", "--to-hf", str(tmp_path / "base"), "--out", str(tmp_path / "hf")]) == 0
    hf = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "hf").eval()
    theirs = peft.PeftModel.from_pretrained(hf, tmp_path / "peft").eval()
    inputs = batch(model)
    real = inputs["attention_mask"].bool()
    with torch.no_grad():
        assert (logits(model, inputs)[real] - theirs(**inputs).logits[real]).abs().max() < 1e-4


def test_a_missing_base_or_adapter_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = tiny("gpt2-tiny")
    zoo.save(base, tmp_path / "base")
    _adapter(tmp_path, base)
    (tmp_path / "base" / "model.safetensors").rename(tmp_path / "moved.safetensors")
    (tmp_path / "base" / "spec.json").unlink()
    (tmp_path / "base").rmdir()
    assert main(["convert", "--to-peft", str(tmp_path / "run"), "--out", str(tmp_path / "peft")]) == 2
    assert f"its base {tmp_path / 'base'} is not here; give the base checkpoint with --base" in _err(capsys)
    assert main(["convert", "--to-peft", str(tmp_path), "--out", str(tmp_path / "peft")]) == 2
    assert "no adapter.safetensors here (is it a LoRA training run?)" in _err(capsys)
    assert main(["convert", "--to-hf", "gpt2-tiny", "--base", "x", "--out", str(tmp_path / "o")]) == 2
    assert "--base applies to --to-peft only" in _err(capsys)


def _adapter(tmp_path: Path, base: zoo.ZooModel) -> Path:
    """run/adapter.safetensors: trained-looking adapters on ``base``, naming tmp_path/base as their base."""
    model = zoo.lora.apply(base, r=4, targets=["qkv", "out", "ffn_in", "ffn_out"])
    liven(model)
    (tmp_path / "run").mkdir()
    return zoo.lora.save(model, tmp_path / "run" / "adapter.safetensors", base_id=str(tmp_path / "base"))


def _err(capsys: pytest.CaptureFixture[str]) -> str:
    return " ".join(capsys.readouterr().err.split())
