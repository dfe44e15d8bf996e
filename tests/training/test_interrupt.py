"""Ctrl-C and SIGTERM during training keep the work: the step under way finishes, a checkpoint of it is
saved, the run resumes from it exactly, and the signal handlers are put back afterwards."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from zoo.cli import main
from zoo.training import Callback, Trainer, train
from zoo.training.config import TrainConfig
from zoo.training.run.checkpoints import checkpoint_dir, checkpoint_problem, list_checkpoints
from zoo.training.stopping import TrainingInterrupted


@pytest.fixture
def resumable(make_config: Callable[..., TrainConfig]) -> Callable[..., TrainConfig]:
    """Dropout on (the RNG must be restored too), 2 accumulated batches a step, no periodic checkpoints: the
    interrupt's checkpoint is the only one."""

    def make(output_dir: Path, max_steps: int) -> TrainConfig:
        return make_config(
            output_dir=str(output_dir),
            max_steps=max_steps,
            num_threads=1,
            **{"model.overrides.dropout": 0.1, "batch.max_tokens": 1500, "batch.grad_accum": 2},
        )

    return make


class SignalAt(Callback):
    """Sends ``signum`` to this process ``times`` times when step ``step`` is logged."""

    def __init__(self, step: int, signum: int = signal.SIGINT, times: int = 1) -> None:
        self.step, self.signum, self.times = step, signum, times

    def on_log(self, state: Any, record: dict[str, Any]) -> None:
        if state.step == self.step:
            for _ in range(self.times):
                os.kill(os.getpid(), self.signum)


def assert_same_weights(a: torch.nn.Module, b: torch.nn.Module) -> None:
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(x, y), f"{name}: max diff {(x - y).abs().max():.2e}"


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_keeps_the_last_step_and_resuming_matches_a_straight_run(
    resumable: Callable[..., TrainConfig], tmp_path: Path, signum: int, code: int
) -> None:
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    straight = train(resumable(tmp_path / "straight", 5), progress=False)
    run = tmp_path / "split"
    with pytest.raises(TrainingInterrupted) as caught:
        train(resumable(run, 5), callbacks=[SignalAt(2, signum)], progress=False)
    stop = caught.value
    assert (stop.step, stop.checkpoint, stop.exit_code) == (2, checkpoint_dir(run, 2), code)
    assert signal.Signals(signum).name in str(stop) and "resume=True continues" in str(stop)
    assert checkpoint_problem(checkpoint_dir(run, 2)) is None  # complete, and verifies
    assert not (run / "model.safetensors").exists()  # the final model is for a finished run only
    assert {sig: signal.getsignal(sig) for sig in handlers} == handlers  # put back after training
    resumed = train(resumable(run, 5), resume=True, progress=False)
    assert resumed.step == 5
    assert_same_weights(straight.model, resumed.model)


def test_the_handlers_are_put_back_after_a_run_that_finishes_or_fails(
    make_config: Callable[..., TrainConfig],
) -> None:
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    train(make_config(max_steps=1), progress=False)
    assert {sig: signal.getsignal(sig) for sig in handlers} == handlers

    class Boom(Callback):
        def on_log(self, state: Any, record: dict[str, Any]) -> None:
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        train(make_config(max_steps=2), callbacks=[Boom()], overwrite=True, progress=False)
    assert {sig: signal.getsignal(sig) for sig in handlers} == handlers


def test_a_second_signal_stops_at_once_without_saving(make_config: Callable[..., TrainConfig]) -> None:
    config = make_config(max_steps=4)
    with pytest.raises(TrainingInterrupted) as caught:
        train(config, callbacks=[SignalAt(2, times=2)], progress=False)
    assert caught.value.checkpoint is None and caught.value.exit_code == 130
    assert "second SIGINT" in str(caught.value)
    assert list_checkpoints(config.output_dir) == []
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_signal_right_after_a_checkpoint_keeps_that_checkpoint(
    make_config: Callable[..., TrainConfig],
) -> None:
    config = make_config(max_steps=6, checkpoint={"every_steps": 2})
    trainer = Trainer(config, callbacks=[SignalAt(2)], progress=False)
    saved: list[Path] = []
    trainer.reporter.callbacks.append(
        type("Saved", (), {"on_checkpoint": lambda s, st, p: saved.append(p)})()
    )
    try:
        with pytest.raises(TrainingInterrupted) as caught:
            trainer.fit()
    finally:
        trainer.close()
    assert caught.value.checkpoint == checkpoint_dir(config.output_dir, 2)
    assert saved == [checkpoint_dir(config.output_dir, 2)]  # not written a second time


def test_a_signal_during_the_final_validation_keeps_the_finished_steps(
    make_config: Callable[..., TrainConfig],
) -> None:
    class SignalOnEval(Callback):
        def on_eval(self, state: Any, record: dict[str, Any]) -> None:
            os.kill(os.getpid(), signal.SIGINT)

    config = make_config(max_steps=2)
    with pytest.raises(TrainingInterrupted) as caught:
        train(config, callbacks=[SignalOnEval()], progress=False)
    assert (caught.value.step, caught.value.checkpoint) == (2, checkpoint_dir(config.output_dir, 2))
    assert not (config.output_dir / "model.safetensors").exists()
    assert train(config, resume=True, progress=False).step == 2  # validates and saves, no step again
    assert (config.output_dir / "model.safetensors").is_file()


def test_a_run_without_a_checkpoint_is_not_offered_a_resume(make_config: Callable[..., TrainConfig]) -> None:
    config = make_config(max_steps=1)
    train(config, progress=False)
    with pytest.raises(
        FileExistsError, match=r"saved no checkpoint to resume from: start over \(overwrite=True"
    ):
        train(config, progress=False)
    with pytest.raises(
        ValueError, match=r"no complete checkpoint to resume from; start over \((--)?overwrite"
    ):
        train(config, resume=True, progress=False)


# --- the real thing: `zoo train` in a process of its own, stopped by a signal ---------------------------------


def start_training(config: TrainConfig, config_path: Path, *launcher: str) -> subprocess.Popen[str]:
    """``zoo train`` on ``config`` in a process of its own (``launcher``: e.g. torchrun's arguments)."""
    config_path.write_text(config.to_yaml(), encoding="utf-8")
    command = [sys.executable, *(launcher or ["-m", "zoo"]), "train", str(config_path), "--no-progress"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True
    )


def wait_for_step(run: Path, step: int, process: subprocess.Popen[str], timeout: float = 120.0) -> None:
    metrics, deadline = run / "metrics.jsonl", time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, process.communicate()
        lines = metrics.read_text().splitlines() if metrics.is_file() else []
        if sum(1 for line in lines if json.loads(line).get("loss") is not None) >= step:
            return
        time.sleep(0.05)
    process.kill()
    raise AssertionError(f"no step {step} within {timeout} s")


@pytest.mark.parametrize(
    ("signum", "code"),
    [(signal.SIGINT, 130), pytest.param(signal.SIGTERM, 143, marks=pytest.mark.slow)],
)
def test_zoo_train_stopped_by_a_signal_prints_what_it_kept_and_resumes_exactly(
    resumable: Callable[..., TrainConfig],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    signum: int,
    code: int,
) -> None:
    run = tmp_path / "run"
    process = start_training(resumable(run, 100_000), tmp_path / "run.yaml")
    wait_for_step(run, 2, process)
    process.send_signal(signum)
    out, err = process.communicate(timeout=120)
    assert process.returncode == code, out + err
    name = signal.Signals(signum).name
    kept = re.search(rf"interrupted \({name}\): kept step (\d+) in (\S+)", err)
    assert kept is not None, err
    step = int(kept.group(1))
    assert step >= 2 and Path(kept.group(2)) == checkpoint_dir(run, step)
    assert checkpoint_problem(checkpoint_dir(run, step)) is None
    assert f"continue with: zoo train {tmp_path / 'run.yaml'} --no-progress --resume" in err
    if signum != signal.SIGINT:
        return  # resuming is the same for both signals: checked once

    straight = train(resumable(tmp_path / "straight", step + 2), progress=False)
    capsys.readouterr()
    status = main(
        ["train", str(tmp_path / "run.yaml"), "--max-steps", str(step + 2), "--resume", "--no-progress"]
    )
    assert status == 0
    assert f"resumed from step {step} of {step + 2}" in capsys.readouterr().out
    import zoo

    assert_same_weights(straight.model, zoo.load(run))


def worker(launcher: int, rank: int) -> int:
    """The pid of the torchrun worker of ``rank`` started by ``launcher``."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            environ = (stat.parent / "environ").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        if parent == launcher and f"RANK={rank}".encode() in environ:
            return int(stat.parent.name)
    raise AssertionError(f"no worker of rank {rank} under process {launcher}")


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="finds the workers through /proc")
@pytest.mark.parametrize("who", ["rank 1 alone", "the terminal's process group"])
def test_under_torchrun_every_process_stops_after_the_same_step_and_keeps_it(
    resumable: Callable[..., TrainConfig], tmp_path: Path, who: str
) -> None:
    """Rank 1 alone: rank 0 learns of the signal from the all-reduce. The process group, as a terminal's
    Ctrl-C: every worker gets it from the terminal and again from torchrun, which is no second Ctrl-C."""
    run = tmp_path / "run"
    launcher = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "zoo"]
    process = start_training(resumable(run, 100_000), tmp_path / "run.yaml", *launcher)
    wait_for_step(run, 2, process, timeout=240)
    if who == "rank 1 alone":
        os.kill(worker(process.pid, 1), signal.SIGINT)
    else:
        os.killpg(process.pid, signal.SIGINT)  # start_training made it a session (and group) leader
    out, err = process.communicate(timeout=120)
    assert process.returncode != 0, out + err
    kept = re.search(r"interrupted \(SIGINT\): kept step (\d+) in (\S+)", err)
    assert kept is not None, out + err
    path = Path(kept.group(2))
    assert checkpoint_problem(path) is None
    state = json.loads((path / "trainer_state.json").read_text())
    assert state["step"] == int(kept.group(1)) and state["world_size"] == 2
    from safetensors import safe_open

    with safe_open(str(path / "rng.safetensors"), framework="pt") as f:
        ranks = {key.split("/")[0] for key in f.keys()}  # noqa: SIM118 (safe_open is not a mapping)
    assert ranks == {"rank0", "rank1"}  # both processes saved theirs
