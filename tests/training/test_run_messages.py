"""A refused output dir names the options the way the caller passes them: ``resume=True`` /
``overwrite=True`` to Python's `train`, ``--resume`` / ``--overwrite`` to ``zoo train``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from zoo.cli import main
from zoo.training import TrainConfig, train


def test_python_callers_are_told_the_keyword_arguments_not_the_command_line_flags(
    make_config: Callable[..., TrainConfig],
) -> None:
    config = make_config(max_steps=1, **{"checkpoint.every_steps": 1})
    train(config, progress=False)
    with pytest.raises(FileExistsError) as refused:
        train(config, progress=False)
    message = str(refused.value)
    assert "resume it (resume=True)" in message and "start over (overwrite=True" in message
    assert "--" not in message


def test_zoo_train_is_told_the_command_line_flags(
    make_config: Callable[..., TrainConfig], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = make_config(max_steps=1, **{"checkpoint.every_steps": 1})
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config.model_dump(mode="json")), encoding="utf-8")
    assert main(["train", str(path), "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["train", str(path), "--no-progress"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "resume it (--resume)" in err and "start over (--overwrite" in err
    assert "=True" not in err
    with pytest.raises(FileExistsError, match=r"resume it \(resume=True\)"):  # and Python's again after it
        train(config, progress=False)


def test_resuming_without_a_checkpoint_names_the_python_arguments(
    make_config: Callable[..., TrainConfig],
) -> None:
    config = make_config(max_steps=1)
    train(config, progress=False)  # no checkpoint.every_steps: nothing to resume from
    with pytest.raises(ValueError) as refused:
        train(config, resume=True, progress=False)
    message = str(refused.value)
    assert "start over (overwrite=True)" in message and "(resume=PATH)" in message
    assert "--" not in message
