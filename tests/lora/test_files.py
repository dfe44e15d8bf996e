"""Adapter files: only the adapters are written, with the base's spec and fingerprint; loading refuses the
wrong base, a file that is not an adapter, a truncated one, and tensors that do not fit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from lora.lora_support import batch, liven, logits, tiny
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import zoo
from zoo.lora import LoraError, LoraSpec


def _adapted(name: str = "gpt2-tiny", **kwargs: object) -> zoo.ZooModel:
    torch.manual_seed(0)
    model = zoo.lora.apply(tiny(name), **kwargs)  # type: ignore[arg-type]
    liven(model)
    return model


def _base(name: str = "gpt2-tiny") -> zoo.ZooModel:
    torch.manual_seed(0)  # the same draw as `_adapted`'s base
    return tiny(name)


@pytest.mark.parametrize("dora", [False, True], ids=["lora", "dora"])
def test_save_then_load_gives_the_same_adapters_and_logits(tmp_path: Path, dora: bool) -> None:
    model = _adapted("bart-tiny", r=4, targets=["qkv", "decoder.ffn_out"], dora=dora)
    inputs = batch(model)
    path = zoo.lora.save(model, tmp_path / "adapter.safetensors", base_id="runs/bart")
    assert path == tmp_path / "adapter.safetensors"
    saved = load_file(path)
    assert saved.keys() == zoo.lora.adapter_state(model).keys()
    assert "decoder.layers.0.cross_attn.kv_proj.lora_A" in saved  # readable names, only adapters
    assert all(name.endswith(("lora_A", "lora_B", "lora_magnitude")) for name in saved)

    loaded = zoo.lora.load(_base("bart-tiny"), path)
    assert all(torch.equal(t, saved[n]) for n, t in zoo.lora.adapter_state(loaded).items())  # bit for bit
    assert torch.equal(logits(loaded, inputs), logits(model, inputs))
    assert loaded.lora_spec == model.lora_spec
    assert zoo.lora.trainable_parameters(loaded) == zoo.lora.trainable_parameters(model)


def test_the_metadata_names_the_spec_base_and_fingerprint(tmp_path: Path) -> None:
    model = _adapted(r=4, alpha=8, targets=["qkv"])
    path = zoo.lora.save(model, tmp_path / "a.safetensors", base_id="gpt2-base")
    with safe_open(str(path), framework="pt") as handle:
        metadata = handle.metadata()
    assert metadata["format"] == "zoo-lora" and metadata["format_version"] == "1"
    assert LoraSpec.model_validate_json(metadata["lora_spec"]) == LoraSpec(r=4, alpha=8, targets=["qkv"])
    assert zoo.parse_spec(json.loads(metadata["base_spec"])) == model.spec
    assert metadata["base_id"] == "gpt2-base"
    info = zoo.lora.read_adapter(path)
    assert (info.base_id, info.tensors, info.bytes) == ("gpt2-base", 4, 4 * (4 * 64 + 192 * 4) * 2)
    assert info.fingerprint == metadata["base_fingerprint"] and len(info.fingerprint) == 64


def test_base_id_defaults_to_where_the_base_came_from(tmp_path: Path) -> None:
    model = zoo.lora.apply(zoo.build("gpt2-tiny"), r=2)
    assert zoo.lora.read_adapter(zoo.lora.save(model, tmp_path / "a.safetensors")).base_id == "gpt2-tiny"
    zoo.save(zoo.build("gpt2-tiny"), tmp_path / "base")
    loaded = zoo.lora.apply(zoo.load(tmp_path / "base"), r=2)
    info = zoo.lora.read_adapter(zoo.lora.save(loaded, tmp_path / "b.safetensors"))
    assert info.base_id == str(tmp_path / "base")


def test_the_adapter_file_is_a_small_fraction_of_the_model(tmp_path: Path) -> None:
    model = _adapted("llama-tiny", r=4, targets=["qkv", "out"])
    adapter = zoo.lora.save(model, tmp_path / "a.safetensors").stat().st_size
    base = zoo.save(_base("llama-tiny"), tmp_path / "base") / "model.safetensors"
    ratio = adapter / base.stat().st_size
    assert ratio < 0.03, ratio  # measured 0.023: 2,560 adapter floats (+ header) against 139,584


def test_a_different_spec_is_refused_naming_the_fields(tmp_path: Path) -> None:
    path = zoo.lora.save(_adapted(), tmp_path / "a.safetensors", base_id="gpt2-tiny")
    other = tiny("gpt2-tiny", **{"ffn.d_ff": 256, "norm.eps": 1e-6})
    with pytest.raises(LoraError) as error:
        zoo.lora.load(other, path)
    message = str(error.value)
    assert "trained on a different base (gpt2-tiny): the spec differs in" in message
    assert "ffn.d_ff: 128 (adapter's base) vs 256 (this model)" in message
    assert "norm.eps: 1e-05 (adapter's base) vs 1e-06 (this model)" in message
    assert not zoo.lora.adapter_modules(other)


def test_a_different_base_of_the_same_shape_is_refused_unless_asked(tmp_path: Path) -> None:
    model = _adapted()
    path = zoo.lora.save(model, tmp_path / "a.safetensors", base_id="runs/base-a")
    torch.manual_seed(123)
    other = tiny("gpt2-tiny")  # same spec, other weights
    with pytest.raises(
        LoraError, match=r"trained on another base \(runs/base-a; weights fingerprint [0-9a-f]{12}\)"
    ):
        zoo.lora.load(other, path)
    assert not zoo.lora.adapter_modules(other) and all(p.requires_grad for p in other.parameters())
    zoo.lora.load(other, path, check_base=False)
    assert torch.equal(
        other.decoder.layers[0].self_attn.qkv_proj.lora_B, model.decoder.layers[0].self_attn.qkv_proj.lora_B
    )


def test_the_fingerprint_ignores_float32_vs_bfloat16_but_sees_one_changed_value(tmp_path: Path) -> None:
    path = zoo.lora.save(_adapted(), tmp_path / "a.safetensors")
    zoo.lora.load(_base().to(torch.bfloat16), path)  # the same base served in bf16: accepted
    base = _base()
    with torch.no_grad():
        base.decoder.layers[1].self_attn.out_proj.weight[0, 0] += 0.5  # a sampled position (the first)
    with pytest.raises(LoraError, match="trained on another base"):
        zoo.lora.load(base, path)


def test_a_file_that_is_not_an_adapter_is_refused(tmp_path: Path) -> None:
    base = _base()
    checkpoint = zoo.save(base, tmp_path / "ckpt") / "model.safetensors"
    with pytest.raises(
        LoraError, match=r"not a zoo LoRA adapter file: its format is 'zoo' \(a zoo checkpoint"
    ):
        zoo.lora.load(base, checkpoint)
    save_file({"x": torch.zeros(2)}, str(tmp_path / "plain.safetensors"))
    with pytest.raises(LoraError, match="not a zoo LoRA adapter file: it has no format marker"):
        zoo.lora.load(base, tmp_path / "plain.safetensors")
    (tmp_path / "text.safetensors").write_text("hello")
    with pytest.raises(LoraError, match="not a safetensors file, or truncated"):
        zoo.lora.read_adapter(tmp_path / "text.safetensors")
    with pytest.raises(LoraError, match="no such adapter file"):
        zoo.lora.load(base, tmp_path / "missing.safetensors")
    assert not zoo.lora.adapter_modules(base)


def test_a_truncated_file_is_refused(tmp_path: Path) -> None:
    path = zoo.lora.save(_adapted(), tmp_path / "a.safetensors")
    data = path.read_bytes()
    path.write_bytes(data[:-100])
    base = _base()
    with pytest.raises(LoraError, match="truncated or corrupted"):
        zoo.lora.load(base, path)
    assert not zoo.lora.adapter_modules(base)


def test_missing_unexpected_and_misshapen_tensors_are_named(tmp_path: Path) -> None:
    path = zoo.lora.save(_adapted(r=4), tmp_path / "a.safetensors")
    with safe_open(str(path), framework="pt") as handle:
        metadata = handle.metadata()
    tensors = load_file(path)
    tensors.pop("decoder.layers.1.self_attn.out_proj.lora_A")
    tensors["decoder.layers.0.self_attn.qkv_proj.lora_B"] = torch.zeros(192, 5)
    tensors["decoder.layers.0.extra"] = torch.zeros(1)
    save_file(tensors, str(tmp_path / "bad.safetensors"), metadata=metadata)
    base = _base()
    with pytest.raises(LoraError) as error:
        zoo.lora.load(base, tmp_path / "bad.safetensors")
    message = str(error.value)
    assert "missing decoder.layers.1.self_attn.out_proj.lora_A" in message
    assert "unexpected decoder.layers.0.extra" in message
    assert (
        "decoder.layers.0.self_attn.qkv_proj.lora_B: expected shape [192, 4], the file has [192, 5]"
        in message
    )
    assert not zoo.lora.adapter_modules(base)


def test_save_refuses_a_model_without_adapters_or_merged_ones(tmp_path: Path) -> None:
    with pytest.raises(LoraError, match="has no LoRA adapters"):
        zoo.lora.save(tiny("gpt2-tiny"), tmp_path / "a.safetensors")
    model = zoo.lora.merge(_adapted())
    with pytest.raises(LoraError, match="is merged; unmerge first"):
        zoo.lora.save(model, tmp_path / "a.safetensors")
    assert not (tmp_path / "a.safetensors").exists()


def test_load_refuses_a_model_that_already_has_adapters(tmp_path: Path) -> None:
    path = zoo.lora.save(_adapted(), tmp_path / "a.safetensors")
    with pytest.raises(LoraError, match="already has LoRA adapters"):
        zoo.lora.load(_adapted(), path)
