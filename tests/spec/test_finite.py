"""Every float of every spec is finite and in range, every int an int (not a bool), every key given once:
refused by name otherwise. ``norm.eps: .inf`` used to build a model whose logits were equal at every
position; ``num_layers: true`` built one layer; a duplicated key silently took the last value."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

import zoo
from zoo.spec import SpecError, load_spec, parse_spec
from zoo.spec.blocks import Spec

HEADER = "family: decoder\nvocab_size: 100\nd_model: 64\nattention: {num_heads: 4}\n"
# What a sub-spec needs besides the field under test, where it has required fields.
REQUIRED: dict[str, dict[str, Any]] = {
    "LinearRopeScaling": {"factor": 2.0},
    "LongRopeScaling": {"short_factor": [1.0], "long_factor": [1.0], "original_max_positions": 4},
    "YarnRopeScaling": {"factor": 2.0, "original_max_positions": 4},
    "DynamicRopeScaling": {"factor": 2.0, "original_max_positions": 4},
    "SequenceClassifierSpec": {"num_labels": 2},
    "TokenClassifierSpec": {"num_labels": 2},
    "ImageClassifierSpec": {"num_labels": 2},
    **{name: {"vocab_size": 100} for name in ("EncoderSpec", "DecoderSpec", "EncoderDecoderSpec")},
    "DualEncoderSpec": {"vocab_size": 100, "eos_token_id": 1, "vision": {"embedding": {"kind": "patches"}}},
}


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    return path


def float_fields() -> Iterator[tuple[type[BaseModel], str]]:
    """(spec class, field) for every float field of every concrete spec class in zoo.spec."""
    seen: set[type] = set()
    todo = list(Spec.__subclasses__())
    while todo:
        cls = todo.pop()
        if cls in seen:
            continue
        seen.add(cls)
        todo += cls.__subclasses__()
        if cls.__name__.startswith("_") or cls.__name__ in ("ResolvedStack",):
            continue
        for name, field in cls.model_fields.items():
            if "float" in str(field.annotation):
                yield cls, name


FLOAT_FIELDS = sorted(float_fields(), key=lambda item: (item[0].__name__, item[1]))


def test_the_float_fields_are_found() -> None:
    names = {f"{cls.__name__}.{field}" for cls, field in FLOAT_FIELDS}
    assert {"NormSpec.eps", "InitSpec.std", "RotaryPositions.theta", "AttentionSpec.dropout"} <= names


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
@pytest.mark.parametrize(("cls", "field"), FLOAT_FIELDS, ids=lambda x: getattr(x, "__name__", x))
def test_every_float_field_refuses_infinity_and_nan_by_name(cls: type[BaseModel], field: str, value: float):
    listed = str(cls.model_fields[field].annotation).startswith("list[")  # a list of floats: one bad entry
    with pytest.raises(ValidationError) as error:
        cls.model_validate({**REQUIRED.get(cls.__name__, {}), field: [value] if listed else value})
    problems = error.value.errors(include_url=False)
    assert [problem["loc"] for problem in problems] == [(field, 0) if listed else (field,)]
    assert "finite" in problems[0]["msg"]


@pytest.mark.parametrize("text", ["norm: {eps: .inf}", "norm: {eps: 1e999}", "init: {std: .inf}"])
def test_an_infinite_float_in_a_spec_file_is_refused_by_name(tmp_path: Path, text: str) -> None:
    field = "norm.eps" if "eps" in text else "init.std"
    with pytest.raises(SpecError, match=rf"{field}: Input should be a finite number"):
        load_spec(write(tmp_path, HEADER + text + "\n"))


def test_an_infinite_float_in_a_preset_override_is_refused_by_name() -> None:
    with pytest.raises(ValidationError, match=r"norm\.eps: Input should be a finite number"):
        zoo.preset("gpt2-tiny", **{"norm.eps": math.inf})
    with pytest.raises(ValidationError, match=r"init\.std: Input should be a finite number"):
        zoo.preset("gpt2-tiny", **{"init.std": math.inf})


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"norm.eps": 1.0}, r"norm\.eps: Input should be less than 1"),
        ({"norm.eps": 1e300}, r"norm\.eps: Input should be less than 1"),
        ({"attention.qk_norm_eps": 5.0}, r"attention\.qk_norm_eps: Input should be less than 1"),
        ({"init.std": 1e30}, r"init\.std: Input should be less than or equal to 1"),
    ],
)
def test_floats_outside_their_range_are_refused_by_name(override: dict[str, float], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        zoo.preset("gpt2-tiny", **override)


@pytest.mark.parametrize(
    ("text", "field", "message"),
    [
        ("num_layers: true", "num_layers", "valid integer"),
        ("max_positions: '64'", "max_positions", "valid integer"),
        ("decoder: {num_layers: false}", r"decoder\.num_layers", "valid integer"),
        ("max_positions: 64.0", "max_positions", "valid integer"),
        ("norm: {eps: true}", r"norm\.eps", "valid number"),
        ("norm: {eps: '1e-5'}", r"norm\.eps", "valid number"),  # quoted: a string, not a number
        ("lm_head: {tied: 1}", r"lm_head\.tied", "valid boolean"),
        ("attention: {num_heads: 4, bias: 'yes'}", r"attention\.bias", "valid boolean"),
    ],
)
def test_types_are_strict(tmp_path: Path, text: str, field: str, message: str) -> None:
    header = HEADER.replace("attention: {num_heads: 4}\n", "") if text.startswith("attention") else HEADER
    with pytest.raises(SpecError, match=rf"{field}: Input should be a {message}"):
        load_spec(write(tmp_path, header + text + "\n"))


def test_a_bool_is_not_an_int_in_a_python_spec_either() -> None:
    with pytest.raises(ValidationError, match="num_layers: Input should be a valid integer"):
        parse_spec({"family": "decoder", "vocab_size": 100, "num_layers": True})


def test_exponent_floats_without_a_dot_are_read_as_numbers(tmp_path: Path) -> None:
    spec = load_spec(write(tmp_path, HEADER + "norm: {eps: 1e-6}\ninit: {std: 2e-2}\n"))
    assert spec.norm.eps == 1e-6 and spec.init.std == 0.02


def test_a_key_given_twice_is_refused_naming_the_key_and_lines(tmp_path: Path) -> None:
    path = write(tmp_path, HEADER + "num_layers: 2\nnum_layers: 8\n")
    with pytest.raises(
        SpecError, match=r"the key 'num_layers' is given twice in one mapping \(on lines 5 and 6\)"
    ):
        load_spec(path)


def test_a_nested_key_given_twice_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, HEADER + "norm: {eps: 1.0e-5, eps: 1.0e-6}\n")
    with pytest.raises(SpecError, match=r"the key 'eps' is given twice in one mapping \(on line 5\)"):
        load_spec(path)


def test_a_merge_key_may_still_be_overridden() -> None:
    from zoo.spec.files import load_yaml

    data = load_yaml("base: &b {num_heads: 4, bias: true}\nattention:\n  <<: *b\n  bias: false\n")
    assert data["attention"] == {"num_heads": 4, "bias": False}


def test_a_finite_spec_still_builds_and_differs_across_positions() -> None:
    import torch

    model = zoo.build(zoo.preset("gpt2-tiny", **{"norm.eps": 1e-5})).eval()
    logits = model(torch.tensor([[5, 6, 7, 8]])).logits
    assert not torch.allclose(logits[0, 0], logits[0, -1])


@pytest.mark.parametrize(
    ("key", "value", "field"),
    [
        ("schedule", {"kind": "constant", "lr": math.inf}, r"schedule\.constant\.lr"),
        ("optim", {"betas": [0.9, math.inf]}, r"optim\.betas\.1"),
        ("loss", {"label_smoothing": math.nan}, r"loss\.label_smoothing"),
    ],
)
def test_training_config_floats_are_finite(tmp_path: Path, key: str, value: dict, field: str) -> None:
    from zoo.training.config import ConfigError, TrainConfig

    data = {"model": "transformer-tiny", "data": {"train": "t.tsv"}, "max_steps": 1, key: value}
    with pytest.raises(ConfigError, match=rf"{field}: Input should be a finite number"):
        TrainConfig.from_dict(data)
