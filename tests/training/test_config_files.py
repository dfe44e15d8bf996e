"""Training configs are read at bounded cost, and their errors (and those of the model spec they name) are
formatted without pydantic's links or input reprs."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from pydantic import ValidationError

from zoo.spec.files import MAX_NODES
from zoo.training.config import ConfigError, TrainConfig
from zoo.training.setup import base_spec

MINIMAL = "data: {train: train.tsv}\nmax_steps: 10\n"


def _bomb(levels: int = 9, width: int = 10) -> str:
    lines = ["  lol0: &b0 [" + ", ".join(["lol"] * width) + "]"]
    for i in range(1, levels):
        lines.append(f"  lol{i}: &b{i} [" + ", ".join([f"*b{i - 1}"] * width) + "]")
    return "\n".join(lines)


def test_an_alias_bomb_in_model_overrides_is_refused_at_once(tmp_path: Path) -> None:
    path = tmp_path / "bomb.yaml"
    path.write_text(
        MINIMAL + "model:\n  preset: gpt2-tiny\n  overrides:\n  " + _bomb().replace("\n", "\n  ") + "\n",
        encoding="utf-8",
    )
    start = time.perf_counter()
    with pytest.raises(ConfigError, match=rf"bomb.yaml: refused: more than {MAX_NODES:,} values"):
        TrainConfig.from_yaml(path)
    assert time.perf_counter() - start < 1.0


def _shared(levels: int = 10, width: int = 10) -> list:
    node: list = ["lol"] * width
    for _ in range(levels):
        node = [node] * width
    return node


@pytest.mark.parametrize(
    "change",
    [
        {"schedule": {"kind": _shared()}},
        {"seed": _shared()},
        {"log_sinks": _shared()},
        {"eval": _shared()},
        {"task": _shared()},
        {"task": {"kind": _shared()}},
        {"task": {"kind": "dpo", "beta": _shared()}},
        {"task": "dpo", "loss": {"dpo_beta": _shared()}},
    ],
)
def test_config_errors_never_print_their_input_or_a_link(change: dict) -> None:
    start = time.perf_counter()
    with pytest.raises(ConfigError) as error:
        TrainConfig.from_dict({"model": "gpt2-tiny", "data": {"train": "x.tsv"}, "max_steps": 1, **change})
    message = str(error.value)
    assert time.perf_counter() - start < 1.0
    assert len(message) < 2000
    assert "https://" not in message and "input_value" not in message and "lol" not in message


def test_a_bad_model_override_is_a_formatted_spec_error(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        MINIMAL + "model: {preset: gpt2-tiny, overrides: {num_layers: 1000000000, d_model: x}}\n",
        encoding="utf-8",
    )
    config = TrainConfig.from_yaml(path)
    start = time.perf_counter()
    with pytest.raises(ValidationError) as error:
        base_spec(config)
    message = str(error.value)
    assert time.perf_counter() - start < 1.0
    assert "d_model: Input should be a valid integer" in message
    assert "https://" not in message and "input_value" not in message
    config = TrainConfig.from_dict({"model": {"preset": "gpt2-tiny", "overrides": {"num_layers": 10**9}}, "data": {"train": "x"}, "max_steps": 1})  # fmt: skip
    with pytest.raises(ValueError, match=r"num_layers \(1,000,000,000\) is over the limit .* ZOO_MAX_LAYERS"):
        base_spec(config)
