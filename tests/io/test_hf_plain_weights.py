"""`zoo.to_hf` writes plain floating-point weights only: a model still wrapped in LoRA adapters or holding
quantised matrices is refused by name, before anything is written."""

from __future__ import annotations

from pathlib import Path

import pytest

import zoo
import zoo.lora


def _tiny() -> zoo.ZooModel:
    return zoo.build(zoo.preset("gpt2-tiny", dropout=0.0)).eval()


def test_a_model_with_adapters_is_refused_and_its_merged_form_exports(tmp_path: Path) -> None:
    model = zoo.lora.apply(_tiny(), r=2)
    with pytest.raises(ValueError, match=r"LoRA adapters: export them with zoo\.lora\.to_peft"):
        zoo.to_hf(model, tmp_path / "adapted")
    assert not (tmp_path / "adapted").exists()
    zoo.to_hf(zoo.lora.merge_and_unload(model), tmp_path / "merged")
    assert (tmp_path / "merged" / "model.safetensors").is_file()


def test_a_quantised_model_is_refused(tmp_path: Path) -> None:
    pytest.importorskip("torchao")
    from zoo.quant import quantize

    with pytest.raises(ValueError, match=r"to_hf: the model's weights are quantised \(int8 weight-only"):
        zoo.to_hf(quantize(_tiny()), tmp_path / "q")
    assert not (tmp_path / "q").exists()
