"""Symbolic links in a run's checkpoints: a file linked out of a checkpoint is not read on resume; a linked
checkpoint folder counts and is pruned like any other (the link goes, never what it points to)."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from zoo.io.names import TRAINER_STATE_NAME
from zoo.training import train
from zoo.training.config import TrainConfig
from zoo.training.run.checkpoints import ResumeError, checkpoint_problem, list_checkpoints, prune_checkpoints


def fake_checkpoint(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / TRAINER_STATE_NAME).write_text("{}")
    (folder / "model.safetensors").write_bytes(b"weights")
    return folder


def test_a_linked_checkpoint_folder_is_pruned_by_unlinking_it_and_its_target_is_kept(tmp_path: Path) -> None:
    run = tmp_path / "run"
    elsewhere = fake_checkpoint(tmp_path / "elsewhere" / "step-00000001")
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "step-00000001").symlink_to(elsewhere)
    for step in (2, 3):
        fake_checkpoint(run / "checkpoints" / f"step-{step:08d}")
    assert len(list_checkpoints(run)) == 3
    prune_checkpoints(run, keep_last=2)
    assert [p.name for p in list_checkpoints(run)] == ["step-00000002", "step-00000003"]
    assert not (run / "checkpoints" / "step-00000001").is_symlink()
    assert (elsewhere / "model.safetensors").read_bytes() == b"weights"  # outside the run: untouched


def test_a_checkpoint_whose_optimizer_state_links_out_of_it_is_not_resumed(
    make_config: Callable[..., TrainConfig], tmp_path: Path
) -> None:
    config = make_config(max_steps=2, checkpoint={"every_steps": 2, "keep_last": 2})
    train(config, progress=False)
    checkpoint = list_checkpoints(config.output_dir)[-1]
    assert checkpoint_problem(checkpoint) is None
    stolen = tmp_path / "elsewhere.safetensors"
    shutil.move(checkpoint / "optimizer.safetensors", stolen)
    (checkpoint / "optimizer.safetensors").symlink_to(stolen)  # the very same bytes, read on the old tree
    assert "optimizer.safetensors: a symbolic link out of its folder" in str(checkpoint_problem(checkpoint))
    more = make_config(max_steps=4, checkpoint={"every_steps": 2, "keep_last": 2})
    with pytest.raises(ResumeError, match=r"optimizer\.safetensors: a symbolic link out of its folder"):
        train(more, progress=False, resume=True)
    with pytest.raises(ResumeError, match=r"optimizer\.safetensors: a symbolic link out of its folder"):
        train(more, progress=False, resume=checkpoint)
