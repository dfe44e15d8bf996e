"""`zoo.lora.apply`'s arguments and adapter files' specs: one line naming the argument and what it takes
(never pydantic's input reprs or links), a rank bounded by each targeted layer, checked before allocating."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from lora.lora_support import tiny
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import zoo
import zoo.lora
from zoo.lora import LoraError

PYDANTIC = ("pydantic", "input_value", "input_type", "[type=")


def refused(model: zoo.ZooModel, **arguments: Any) -> str:
    with pytest.raises(LoraError) as error:
        zoo.lora.apply(model, **arguments)
    message = str(error.value)
    assert "\n" not in message and not any(mark in message for mark in PYDANTIC), message
    assert not zoo.lora.adapter_modules(model)  # nothing replaced
    return message


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ({"r": -1}, "r must be an integer >= 1 (the adapters' rank), got -1"),
        ({"r": 0}, "r must be an integer >= 1 (the adapters' rank), got 0"),
        ({"r": True}, "r must be an integer >= 1 (the adapters' rank), got True"),
        (
            {"alpha": float("inf")},
            "alpha must be a finite number > 0 (the update is scaled by alpha / r), got inf",
        ),
        ({"dropout": 1.0}, "dropout must be a number in [0, 1), got 1.0"),
        ({"dora": 1}, "dora must be True or False, got 1"),
        ({"targets": "qkv"}, "targets must be a non-empty list of target names, each [encoder.|decoder.]"),
        ({"targets": []}, "targets must be a non-empty list of target names"),
        (
            {"spec": {"rank": 8}},
            "unknown argument 'rank'; the arguments are r, alpha, dropout, targets, dora",
        ),
        ({"spec": {"r": 0}}, "r must be an integer >= 1"),
    ],
)
def test_a_bad_argument_is_one_line_naming_it_and_what_it_takes(
    arguments: dict[str, Any], expected: str
) -> None:
    assert refused(tiny("gpt2-tiny"), **arguments).startswith(f"zoo.lora.apply: {expected}")


@pytest.mark.parametrize("target", ["nope", "decoder.ffn"])
def test_a_target_that_is_no_target_names_the_grammar_and_what_the_model_has(target: str) -> None:
    message = refused(tiny("gpt2-tiny"), targets=["qkv", target])
    assert f"targets[1] '{target}' is not a target: expected [encoder.|decoder.][self.|cross.]KIND" in message
    assert message.endswith("this model has decoder (self-attention, ffn)")


def test_a_rank_above_a_targeted_layers_size_is_refused_naming_the_layer() -> None:
    model = tiny("gpt2-tiny")  # d_model 64: qkv_proj maps 64 -> 192
    message = refused(model, r=65)
    assert message == (
        "lora r (65) is more than the targeted layer decoder.layers.0.self_attn.qkv_proj can use: it maps "
        "64 -> 192 features, so an update's rank is at most 64; choose r <= 64"
    )
    assert "r (10,000,000)" in refused(model, r=10_000_000)  # refused before 7.7 GB are asked for
    assert zoo.lora.apply(model, r=64)  # the largest rank the layers can use


def adapter_with(tmp_path: Path, **lora_spec: Any) -> tuple[zoo.ZooModel, Path]:
    """A saved gpt2-tiny adapter whose metadata's lora_spec is changed by ``lora_spec`` (raw JSON values)."""
    model = tiny("gpt2-tiny")
    path = zoo.lora.save(zoo.lora.apply(tiny("gpt2-tiny"), r=4), tmp_path / "a.safetensors")
    with safe_open(str(path), framework="pt") as handle:
        metadata = handle.metadata()
    spec = json.loads(metadata["lora_spec"]) | lora_spec
    metadata["lora_spec"] = json.dumps(spec).replace('"__raw__"', "1e999")
    save_file(load_file(str(path)), str(path), metadata=metadata)
    return model, path


def test_an_adapter_file_with_an_infinite_alpha_is_refused_by_name(tmp_path: Path) -> None:
    model, path = adapter_with(tmp_path, alpha="__raw__")  # written as alpha: 1e999
    with pytest.raises(
        LoraError, match=r"a\.safetensors: lora_spec in the metadata: alpha: 1e999 is not a finite"
    ):
        zoo.lora.load(model, path)


def test_an_adapter_file_asking_for_a_rank_the_layers_cannot_use_is_refused_before_reading(
    tmp_path: Path,
) -> None:
    model, path = adapter_with(tmp_path, r=100_000)
    with pytest.raises(
        LoraError, match=r"lora r \(100,000\) is more than the targeted layer .*choose r <= 64"
    ):
        zoo.lora.load(model, path)
    assert not zoo.lora.adapter_modules(model)


def test_an_adapter_header_nested_50000_deep_is_one_line(tmp_path: Path) -> None:
    model = tiny("gpt2-tiny")
    path = zoo.lora.save(zoo.lora.apply(tiny("gpt2-tiny"), r=4), tmp_path / "a.safetensors")
    with safe_open(str(path), framework="pt") as handle:
        metadata = handle.metadata()
    for key in ("lora_spec", "base_spec"):
        deep = dict(metadata, **{key: "[" * 50_000 + "]" * 50_000})
        save_file(load_file(str(path)), str(tmp_path / "deep.safetensors"), metadata=deep)
        with pytest.raises(
            LoraError, match=rf"deep\.safetensors: {key} in the metadata: JSON nested more than"
        ):
            zoo.lora.load(model, tmp_path / "deep.safetensors")
