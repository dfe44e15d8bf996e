"""torchao's 8- and 4-bit AdamW (``optim.name: adamw8bit | adamw4bit``): they train, hold quantised moments
in a quarter (an eighth) of fp32 Adam's bytes, and a run saved with them resumes exactly."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from zoo.training import Trainer, train
from zoo.training.config import ConfigError, TrainConfig
from zoo.training.run.checkpoints import latest_checkpoint

pytest.importorskip("torchao")
# The first step compiles torchao's update once per parameter shape: ~20-50 s on this CPU.
compiles = pytest.mark.slow


def losses(run: Path) -> dict[int, float]:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in records if r["loss"] is not None}


@compiles
@pytest.mark.parametrize("name", ["adamw8bit", "adamw4bit"])
def test_a_low_bit_adamw_run_trains_and_resumes_exactly(
    name: str, make_config: Callable[..., TrainConfig], tmp_path: Path
) -> None:
    def make(run: Path, steps: int) -> TrainConfig:
        return make_config(
            output_dir=str(run),
            max_steps=steps,
            optim={"name": name, "betas": [0.9, 0.98], "eps": 1e-9},
            schedule={"kind": "constant", "lr": 3e-3},
            log_every=1,
            checkpoint={"every_steps": 3, "keep_last": 5},
        )

    straight = train(make(tmp_path / "straight", 6), progress=False)
    record = losses(tmp_path / "straight")
    assert record[6] < record[1]  # it learns
    train(make(tmp_path / "split", 3), progress=False)
    assert latest_checkpoint(tmp_path / "split") is not None
    second = train(make(tmp_path / "split", 6), resume=True, progress=False)
    got = losses(tmp_path / "split")
    for step in (4, 5, 6):
        assert abs(record[step] - got[step]) < 1e-6, step
    for (key, a), (_, b) in zip(straight.model.state_dict().items(), second.model.state_dict().items()):
        assert torch.equal(a, b), key


@compiles
def test_the_moments_are_quantised_and_survive_a_checkpoint_bit_for_bit(
    make_config: Callable[..., TrainConfig], tmp_path: Path
) -> None:
    from safetensors.torch import save_file
    from torchao.optim.subclass_8bit import OptimState8bit

    from zoo.training.run.checkpoints import flatten_optimizer_state, unflatten_optimizer_state

    trainer = Trainer(make_config(max_steps=1, optim={"name": "adamw8bit"}), progress=False)
    try:
        trainer.fit()
        state = trainer.optimizer.state_dict()
        quantized = [v for s in state["state"].values() for v in s.values() if isinstance(v, OptimState8bit)]
        assert quantized  # the tiny model's larger matrices (>= 4,096 elements) hold 8-bit moments
        named = {
            "state": {str(k): v for k, v in state["state"].items()},
            "param_groups": state["param_groups"],
        }
        tensors, metadata = flatten_optimizer_state(named)
        save_file(tensors, str(tmp_path / "optimizer.safetensors"), metadata=metadata)
        back = unflatten_optimizer_state(tmp_path / "optimizer.safetensors")
        for key, values in named["state"].items():
            for field, value in values.items():
                restored = back["state"][key][field]
                if isinstance(value, OptimState8bit):
                    assert isinstance(restored, OptimState8bit)
                    assert torch.equal(restored.codes, value.codes) and torch.equal(
                        restored.scale, value.scale
                    )
                    assert restored.signed == value.signed
                else:
                    assert torch.equal(restored, value)
    finally:
        trainer.close()


def test_an_unknown_optimizer_name_lists_the_choices(make_config: Callable[..., TrainConfig]) -> None:
    with pytest.raises(
        ConfigError, match=r"optim.name: Input should be 'adam', 'adamw', 'adamw8bit' or 'adamw4bit'"
    ):
        make_config(optim={"name": "adamw2bit"})
