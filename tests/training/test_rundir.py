"""The output directory: a previous run or model is refused, one trainer at a time, no write through a link,
and a full disk names the file it could not write."""

from __future__ import annotations

import errno
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

import zoo
from zoo.training import Trainer, train
from zoo.training.config import TrainConfig
from zoo.training.report.sinks import JsonlSink
from zoo.training.run import checkpoints as checkpoints_module
from zoo.training.run.checkpoints import checkpoint_problem, list_checkpoints
from zoo.training.run.rundir import RunDirError, RunWriteError, previous_run
from zoo.training.run.runlock import RunInUseError


def tiny_model() -> zoo.ZooModel:
    spec = zoo.preset("transformer-tiny").override(
        vocab_size=50, d_model=32, num_layers=1, max_positions=32, **{"ffn.d_ff": 64}
    )
    return zoo.build(spec)


# --- a previous run or model --------------------------------------------------------------------------


def test_a_fresh_run_refuses_a_model_saved_in_its_output_dir(
    make_config: Callable[..., TrainConfig],
) -> None:
    config = make_config(max_steps=1)
    zoo.save(tiny_model(), config.output_dir)
    saved = {p.name: p.read_bytes() for p in config.output_dir.iterdir()}
    with pytest.raises(
        FileExistsError, match=r"already holds a saved model .*model\.safetensors.*overwrite=True"
    ):
        Trainer(config)
    assert {p.name: p.read_bytes() for p in config.output_dir.iterdir() if p.name in saved} == saved


@pytest.mark.parametrize(
    "name",
    [
        "model.safetensors",
        "model.safetensors.index.json",
        "model-00001-of-00002.safetensors",
        "spec.json",
        "config.json",
        "tokenizer.json",
        "train_config.yaml",
        "run.json",
        "metrics.jsonl",
        "checkpoints/step-00000001/trainer_state.json",
    ],
)
def test_each_kind_of_previous_run_file_is_refused_and_named(
    name: str, make_config: Callable[..., TrainConfig]
) -> None:
    config = make_config(max_steps=1)
    path = config.output_dir / name
    path.parent.mkdir(parents=True)
    path.write_text("{}")
    with pytest.raises(FileExistsError, match=r"overwrite=True") as refused:
        Trainer(config)
    assert name.split("/")[0] in str(refused.value)
    assert path.read_text() == "{}"


def test_overwrite_deletes_the_previous_run_and_model_but_nothing_else(
    make_config: Callable[..., TrainConfig],
) -> None:
    config = make_config(max_steps=1)
    out = config.output_dir
    zoo.save(tiny_model(), out)
    (out / "model-00002-of-00002.safetensors").write_text("a stale shard")
    (out / "notes.txt").write_text("mine")
    result = train(config, overwrite=True, progress=False)
    assert (out / "notes.txt").read_text() == "mine"
    assert not (out / "model-00002-of-00002.safetensors").exists()
    assert zoo.load(out).spec == result.model.spec  # the new model, not the one saved before


def packed_config(tmp_path: Path, *, block_size: int) -> TrainConfig:
    """gpt2-tiny (128 positions) on a small text file, packed into ``block_size`` windows."""
    text = tmp_path / "train.txt"
    if not text.exists():
        words = ["the", "cat", "sat", "on", "a", "mat", "while", "the", "dog", "slept", "by", "the", "log"]
        text.write_text("".join(" ".join(words[i:] + words[:i]) + "\n" for i in range(12)) * 4)
    return TrainConfig.from_dict(
        {
            "model": {"preset": "gpt2-tiny", "overrides": {"num_layers": 1}},
            "data": {"train": str(text), "packing": {"block_size": block_size}},
            "tokenizer": {"vocab_size": 80},
            "batch": {"max_tokens": 256},
            "max_steps": 1,
            "output_dir": str(tmp_path / "run"),
        }
    )


def test_a_config_that_cannot_train_writes_nothing_and_its_fix_runs_in_the_same_dir(tmp_path: Path) -> None:
    bad = packed_config(tmp_path, block_size=4096)
    with pytest.raises(
        ValueError, match=r"^data\.packing\.block_size \(4096\) exceeds the length limit \(128"
    ):
        train(bad, progress=False)
    assert previous_run(bad.output_dir) == []  # no tokenizer.json left to refuse the rerun
    train(packed_config(tmp_path, block_size=32), progress=False)
    assert zoo.load_tokenizer(bad.output_dir) is not None


def test_overwrite_with_a_config_that_cannot_train_keeps_the_model_it_would_replace(tmp_path: Path) -> None:
    bad = packed_config(tmp_path, block_size=4096)
    zoo.save(tiny_model(), bad.output_dir)
    saved = {p.name: p.read_bytes() for p in bad.output_dir.iterdir()}
    with pytest.raises(ValueError, match="block_size"):
        train(bad, overwrite=True, progress=False)
    assert {p.name: p.read_bytes() for p in bad.output_dir.iterdir() if p.name in saved} == saved


def test_a_start_that_fails_after_writing_removes_what_it_wrote(
    make_config: Callable[..., TrainConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    config = make_config(max_steps=1)

    def fail(*args: object, **kwargs: object) -> None:
        assert (config.output_dir / "tokenizer.json").is_file()  # written: the tokenizers come first
        raise ValueError("optim: cannot build")

    monkeypatch.setattr("zoo.training.loop.build_optimizer", fail)
    with pytest.raises(ValueError, match="cannot build"):
        Trainer(config)
    assert previous_run(config.output_dir) == []
    monkeypatch.undo()
    train(config, progress=False)  # the rerun is accepted


# --- one trainer at a time ----------------------------------------------------------------------------

HOLD = """
import sys
from zoo.training import Trainer, TrainConfig
trainer = Trainer(TrainConfig.from_yaml(sys.argv[1]), progress=False)
print("holding", flush=True)
sys.stdin.read()  # until the test closes the pipe or kills this process
"""


def test_a_second_trainer_fails_at_once_naming_the_process_that_holds_the_run(
    make_config: Callable[..., TrainConfig], tmp_path: Path
) -> None:
    config = make_config(max_steps=1)
    config_path = tmp_path / "config.yaml"
    config_path.write_text(config.to_yaml(), encoding="utf-8")
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(config_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"
        before = sorted(p.name for p in config.output_dir.iterdir())
        start = time.perf_counter()
        for attempt in ({}, {"overwrite": True}, {"resume": True}):
            with pytest.raises(RunInUseError) as refused:
                Trainer(config, progress=False, **attempt)  # type: ignore[arg-type]
            message = str(refused.value)
            assert (
                f"{config.output_dir} is in use by pid {holder.pid} on host {socket.gethostname()} since "
                in (message)
            )
        assert time.perf_counter() - start < 5  # at once: no waiting for the lock
        assert sorted(p.name for p in config.output_dir.iterdir()) == before
    finally:
        holder.kill()  # a crash: the kernel drops the flock with the process
        holder.wait()
    assert train(config, overwrite=True, progress=False).step == 1


def test_an_open_trainer_in_this_process_holds_its_run_until_closed(
    make_config: Callable[..., TrainConfig],
) -> None:
    config = make_config(max_steps=1)
    first = Trainer(config, progress=False)
    try:
        with pytest.raises(RunInUseError, match=r"this process: close the Trainer that holds it first"):
            Trainer(config, progress=False, overwrite=True)
    finally:
        first.close()
    Trainer(config, progress=False, overwrite=True).close()


# --- symbolic links -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["metrics.jsonl", "train_config.yaml", "run.json", "metrics.csv", "checkpoints"]
)
def test_a_fresh_run_never_writes_through_a_symbolic_link(
    name: str, make_config: Callable[..., TrainConfig], tmp_path: Path
) -> None:
    config = make_config(max_steps=1, log_sinks=["csv"])
    config.output_dir.mkdir()
    elsewhere = tmp_path / "elsewhere"  # dangling: today's trainer would create it through the link
    (config.output_dir / name).symlink_to(elsewhere)
    for overwrite in (False, True):
        with pytest.raises(RunDirError, match=rf"{name} is a symbolic link \(to {elsewhere}\)"):
            Trainer(config, progress=False, overwrite=overwrite)
    assert not elsewhere.exists() and (config.output_dir / name).is_symlink()


@pytest.mark.parametrize("name", ["train_config.yaml", "metrics.jsonl", "tokenizer.json"])
def test_resume_refuses_a_symbolic_link_and_leaves_its_target_alone(
    name: str, make_config: Callable[..., TrainConfig], tmp_path: Path
) -> None:
    config = make_config(max_steps=1, checkpoint={"every_steps": 1})
    train(config, progress=False)
    victim = tmp_path / "victim.txt"
    victim.write_text("not a training file")
    (config.output_dir / name).unlink()
    (config.output_dir / name).symlink_to(victim)
    with pytest.raises(RunDirError, match=rf"{name} is a symbolic link"):
        train(config.override(max_steps=2), resume=True, progress=False)
    assert victim.read_text() == "not a training file" and (config.output_dir / name).is_symlink()


def test_the_metrics_sink_refuses_to_append_through_a_link(tmp_path: Path) -> None:
    target = tmp_path / "target.jsonl"
    target.write_text("")
    (tmp_path / "metrics.jsonl").symlink_to(target)
    with pytest.raises(RunDirError, match=r"metrics\.jsonl is a symbolic link"):
        JsonlSink(tmp_path / "metrics.jsonl").write({"step": 1})
    assert target.read_text() == ""


# --- a full disk ----------------------------------------------------------------------------------------


def test_a_full_disk_during_a_checkpoint_names_the_file_and_keeps_the_previous_checkpoint(
    make_config: Callable[..., TrainConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    config = make_config(max_steps=4, checkpoint={"every_steps": 2, "keep_last": 1})
    real_save_file = checkpoints_module.save_file

    def full_disk(tensors: dict, path: str, metadata: dict | None = None) -> None:
        if "step-00000004" in path:
            Path(path).write_bytes(b"\0" * 100)  # a partial file, as the writer leaves one
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_save_file(tensors, path, metadata=metadata)

    monkeypatch.setattr(checkpoints_module, "save_file", full_disk)
    with pytest.raises(RunWriteError) as failed:
        train(config, progress=False)
    message = str(failed.value)
    assert f"could not write {config.output_dir}/checkpoints/step-00000004/optimizer.safetensors: " in message
    assert "No space left on device" in message and "step-00000002" in message and "resume=True" in message
    assert failed.value.errno == errno.ENOSPC
    assert [p.name for p in (config.output_dir / "checkpoints").iterdir()] == ["step-00000002"]
    assert checkpoint_problem(list_checkpoints(config.output_dir)[-1]) is None
    monkeypatch.undo()
    assert train(config, resume=True, progress=False).step == 4


def test_a_full_disk_during_a_record_names_the_file_and_leaves_whole_lines(
    make_config: Callable[..., TrainConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    config = make_config(max_steps=3, checkpoint={"every_steps": 1})
    real_write = os.write

    def full_disk(fd: int, data: bytes) -> int:
        if b'"step": 3' in bytes(data):
            real_write(fd, bytes(data)[:20])  # half a record reaches the disk
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", full_disk)
    with pytest.raises(
        RunWriteError, match=r"could not write .*metrics\.jsonl: the disk is full \(No space left on device\)"
    ):
        train(config, progress=False)
    monkeypatch.undo()
    lines = (config.output_dir / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2]  # the torn record was cut back off
    assert train(config, resume=True, progress=False).step == 3
