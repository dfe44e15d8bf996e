"""A loss (or weights) no longer finite stops the run, naming the step; the weights are never saved, and the
last good checkpoint stays the newest. Under fp16 a few skipped steps in a row are normal."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

import zoo
from zoo.cli import main
from zoo.training import Callback, Trainer
from zoo.training.config import TrainConfig
from zoo.training.distributed import start_runtime
from zoo.training.run.checkpoints import list_checkpoints
from zoo.training.stopping import Guard, TrainingDiverged


def fit(config: TrainConfig, *, corrupt: str | None = None, at: int = 0) -> Trainer:
    """Train ``config``; with ``corrupt`` (a hook name), fill one weight with nan when that hook sees step ``at``."""
    trainer = Trainer(config, progress=False)

    class Corrupt(Callback):
        def hook(self, state: Any, *args: Any) -> None:
            if state.step == at:
                with torch.no_grad():
                    next(trainer.model.parameters()).fill_(math.nan)

    if corrupt is not None:
        callback = Corrupt()
        setattr(callback, corrupt, callback.hook)
        trainer.reporter.callbacks.append(callback)
    try:
        trainer.fit()
    finally:
        trainer.close()
    return trainer


def names(run: Path) -> list[str]:
    return [p.name for p in list_checkpoints(run)]


def assert_finite(path: Path) -> None:
    for name, tensor in zoo.load(path).state_dict().items():
        assert torch.isfinite(tensor).all(), f"{path}: {name}"


def test_a_nan_loss_stops_the_run_naming_its_step_and_keeps_the_last_good_checkpoint(
    make_config: Callable[..., TrainConfig],
) -> None:
    # Records every 5 steps: the nan loss of step 3 is found at the step-4 checkpoint, its first sync.
    config = make_config(max_steps=10, log_every=5, checkpoint={"every_steps": 2, "keep_last": 5})
    with pytest.raises(TrainingDiverged, match=r"the loss was nan at step 3, found at step 4") as caught:
        fit(config, corrupt="on_checkpoint", at=2)
    assert caught.value.step == 3
    kept = config.output_dir / "checkpoints" / "step-00000002"
    assert caught.value.checkpoint == kept and str(kept) in str(caught.value)
    assert names(config.output_dir) == ["step-00000002"]  # no step-4 checkpoint of nan weights
    assert not (config.output_dir / "model.safetensors").exists()  # nor a final model
    assert_finite(kept)


def test_weights_that_are_not_finite_are_never_saved(make_config: Callable[..., TrainConfig]) -> None:
    # The loss of step 2 was finite; its weights are not (here: made nan after it): the step-2 checkpoint
    # is refused, naming the step.
    config = make_config(max_steps=4, checkpoint={"every_steps": 1, "keep_last": 5})
    with pytest.raises(TrainingDiverged, match=r"the weights are no longer finite after step 2") as caught:
        fit(config, corrupt="on_log", at=2)
    assert caught.value.step == 2
    assert names(config.output_dir) == ["step-00000001"]
    assert not (config.output_dir / "model.safetensors").exists()


def test_the_final_model_is_not_saved_when_the_last_step_went_bad(
    make_config: Callable[..., TrainConfig],
) -> None:
    config = make_config(max_steps=3, log_every=10)
    with pytest.raises(TrainingDiverged, match="no checkpoint"):
        fit(config, corrupt="on_log", at=3)  # the last step's record, then the final save
    assert not (config.output_dir / "model.safetensors").exists()


def test_zoo_train_with_an_exploding_learning_rate_stops_in_one_line(
    make_config: Callable[..., TrainConfig], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The issue's case: a learning rate so large that the first update overflows the next loss."""
    config = make_config(max_steps=20, log_every=5, schedule={"kind": "constant", "lr": 1e30})
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config.model_dump(mode="json")), encoding="utf-8")
    assert main(["train", str(path), "--no-progress"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "error: training diverged: the loss was" in err and "at step 2, found at step 5" in err
    assert "start over (--overwrite)" in err and "Traceback" not in err
    assert not (config.output_dir / "model.safetensors").exists()


# --- fp16: skipped steps are normal, up to max_skipped_steps in a row ---------------------------------------


def overflowing(config: TrainConfig, steps: set[int]) -> Trainer:
    """Train ``config`` with the gradients made inf while computing each step in ``steps``."""
    trainer = Trainer(config, progress=False)

    def overflow(grad: torch.Tensor) -> torch.Tensor:
        return torch.full_like(grad, math.inf) if trainer.step + 1 in steps else grad

    list(trainer.model.parameters())[-1].register_hook(overflow)
    try:
        trainer.fit()
    finally:
        trainer.close()
    return trainer


def test_fp16_stops_after_max_skipped_steps_in_a_row(make_config: Callable[..., TrainConfig]) -> None:
    config = make_config(precision="fp16", max_steps=12, max_skipped_steps=3, checkpoint={"every_steps": 1})
    with pytest.raises(
        TrainingDiverged, match=r"3 optimizer steps in a row were skipped .*steps 4 to 6"
    ) as caught:
        overflowing(config, steps=set(range(4, 13)))
    assert caught.value.step == 6 and "max_skipped_steps: 3" in str(caught.value)
    assert names(config.output_dir)[-1] == "step-00000005"  # skipped steps leave the weights as they were


def test_fp16_goes_on_through_fewer_skipped_steps_in_a_row(make_config: Callable[..., TrainConfig]) -> None:
    config = make_config(precision="fp16", max_steps=8, max_skipped_steps=3)
    trainer = overflowing(config, steps={2, 3, 5, 6})  # two in a row, twice: the count starts over
    assert trainer.step == 8
    assert_finite(config.output_dir)


def test_max_skipped_steps_must_be_positive(make_config: Callable[..., TrainConfig]) -> None:
    with pytest.raises(ValueError, match="max_skipped_steps"):
        make_config(max_skipped_steps=0)
    assert make_config().max_skipped_steps == 25


def test_the_guard_reads_nothing_until_checked() -> None:
    guard = Guard(start_runtime("cpu"), output_dir=Path("unused"), skipping=False, max_skipped_steps=3)
    guard.after_step(1, torch.tensor(2.0), torch.tensor(1.0))
    guard.check(step=1)  # fine so far
    guard.after_step(2, torch.tensor(math.inf), torch.tensor(1.0))
    guard.after_step(3, torch.tensor(math.nan), torch.tensor(math.nan))
    with pytest.raises(TrainingDiverged, match=r"the loss was inf at step 2, found at step 3"):
        guard.check(step=3)
