"""Checkpoints: resuming continues exactly; a failed save never leaves a checkpoint that looks complete."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from zoo.training import Trainer, train
from zoo.training import state as state_module
from zoo.training.config import TrainConfig
from zoo.training.data import DataError
from zoo.training.state import latest_checkpoint, list_checkpoints


def losses(run: Path) -> dict[int, float]:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in records if r["loss"] is not None}


@pytest.fixture
def resumable(make_config: Callable[..., TrainConfig]) -> Callable[..., TrainConfig]:
    """Dropout on (so the RNG must be restored), 2 accumulated batches a step, ~2 steps an epoch."""

    def make(output_dir: Path, max_steps: int) -> TrainConfig:
        return make_config(
            output_dir=str(output_dir),
            max_steps=max_steps,
            **{"model.overrides.dropout": 0.1, "batch.max_tokens": 1500, "batch.grad_accum": 2},
            checkpoint={"every_steps": 3, "keep_last": 5},
        )

    return make


def test_resuming_gives_the_same_losses_and_weights_as_a_straight_run(
    resumable: Callable[..., TrainConfig], tmp_path: Path
) -> None:
    straight = train(resumable(tmp_path / "straight", 6))
    assert straight.step == 6
    first = train(resumable(tmp_path / "split", 3))
    assert first.step == 3 and latest_checkpoint(tmp_path / "split").name == "step-00000003"
    second = train(resumable(tmp_path / "split", 6), resume=True)
    assert second.step == 6
    expected, got = losses(tmp_path / "straight"), losses(tmp_path / "split")
    assert sorted(got) == [1, 2, 3, 4, 5, 6]  # no step recorded twice
    for step in (4, 5, 6):
        assert abs(expected[step] - got[step]) < 1e-6
    for (name, a), (_, b) in zip(straight.model.state_dict().items(), second.model.state_dict().items()):
        assert torch.allclose(a, b, atol=1e-6), name


def test_failed_save_leaves_the_previous_checkpoint_intact(
    resumable: Callable[..., TrainConfig], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = tmp_path / "run"
    real_save_file = state_module.save_file

    def failing_save_file(tensors: dict, path: str, metadata: dict | None = None) -> None:
        if "step-00000006" in path:
            real_save_file(tensors, path, metadata=metadata)
            raise OSError("disk full")
        real_save_file(tensors, path, metadata=metadata)

    monkeypatch.setattr(state_module, "save_file", failing_save_file)
    with pytest.raises(OSError, match="disk full"):
        train(resumable(run, 6))
    assert [p.name for p in list_checkpoints(run)] == ["step-00000003"]
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["step-00000003"]  # no temp left behind
    monkeypatch.undo()
    resumed = train(resumable(run, 6), resume=True)
    assert resumed.step == 6


def test_a_finished_run_is_not_silently_overwritten(make_config: Callable[..., TrainConfig]) -> None:
    config = make_config(max_steps=1)
    train(config)
    with pytest.raises(FileExistsError, match="already holds a training run; resume it"):
        train(config)
    assert train(config, overwrite=True).step == 1
    with pytest.raises(ValueError, match="no complete checkpoint to resume from"):
        train(config, resume=True)


def test_bad_data_stops_the_run_before_the_first_step(
    make_config: Callable[..., TrainConfig], toy_files: tuple[Path, Path], tmp_path: Path
) -> None:
    bad_valid = tmp_path / "valid.tsv"
    bad_valid.write_text(toy_files[1].read_text() + "a line without a tab\n", encoding="utf-8")
    config = make_config(**{"data.valid": str(bad_valid)})
    with pytest.raises(DataError, match=r"valid\.tsv:21: expected 'source<TAB>target'"):
        Trainer(config)
    assert not (config.output_dir / "metrics.jsonl").exists()
    assert latest_checkpoint(config.output_dir) is None


def test_resuming_with_a_different_model_is_refused(
    resumable: Callable[..., TrainConfig], tmp_path: Path
) -> None:
    train(resumable(tmp_path / "run", 3))
    other = resumable(tmp_path / "run", 6).override(**{"model.overrides.ffn.d_ff": 128})
    with pytest.raises(ValueError, match="model spec differs from this config's in: ffn"):
        train(other, resume=True)
