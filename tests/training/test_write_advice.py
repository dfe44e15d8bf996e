"""A write that fails (a full disk) says what will work next: continuing (``resume``) only when the run has a
complete checkpoint to continue from, else starting over."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path

import pytest

import zoo
from zoo.training import train
from zoo.training.config import TrainConfig
from zoo.training.run import checkpoints as checkpoints_module
from zoo.training.run.rundir import RunWriteError


def full_disk_on(marker: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the checkpoints' safetensors writer fail with ENOSPC for paths containing ``marker``."""
    real = checkpoints_module.save_file

    def save_file(tensors: dict, path: str, metadata: dict | None = None) -> None:
        if marker in path:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(tensors, path, metadata=metadata)

    monkeypatch.setattr(checkpoints_module, "save_file", save_file)


def test_a_failed_first_checkpoint_does_not_advise_a_resume(
    make_config: Callable[..., TrainConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    full_disk_on("step-00000002", monkeypatch)
    with pytest.raises(RunWriteError) as failed:
        train(make_config(max_steps=2, checkpoint={"every_steps": 2}), progress=False)
    message = str(failed.value)
    assert "there is no other to resume from" in message and "start over (overwrite=True)" in message
    assert "resume=True" not in message


def test_a_failed_final_save_advises_a_resume_only_with_a_checkpoint(
    make_config: Callable[..., TrainConfig], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    real_save = zoo.save

    def failing_save(model: object, path: object, **kwargs: object) -> object:
        if Path(str(path)).name == "run":  # the final model, in the output dir itself
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_save(model, path, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(zoo, "save", failing_save)
    with pytest.raises(RunWriteError) as failed:
        train(make_config(max_steps=2), progress=False)
    assert "start it over (overwrite=True): it saved no checkpoint to resume from" in str(failed.value)
    with pytest.raises(RunWriteError) as failed:
        train(make_config(max_steps=2, checkpoint={"every_steps": 1}), overwrite=True, progress=False)
    assert "then continue it from its last checkpoint (resume=True)" in str(failed.value)
