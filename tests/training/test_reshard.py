"""Resuming on another process count: a run saved by 2 processes continues on 1, and one saved by 1 on 2,
step for step (the same batches in the same order, the same weights) when the global batch is kept."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from recorded_training import merged, train_recording
from training.conftest import tiny_config

import zoo
from zoo.training import train
from zoo.training.config import TrainConfig
from zoo.training.run.checkpoints import ResumeError
from zoo.training.run.global_batch import resumed_grad_accum

STEPS, SAVED = 4, 2


# --- the global batch kept, derived or refused ----------------------------------------------------------


def test_the_same_batches_per_step_on_another_process_count_are_accepted() -> None:
    saved = {"world_size": 2, "grad_accum": 3}
    assert resumed_grad_accum(Path("ck"), saved, world_size=1, grad_accum=6) == 6
    assert resumed_grad_accum(Path("ck"), saved, world_size=6, grad_accum=1) == 1
    assert resumed_grad_accum(Path("ck"), saved, world_size=2, grad_accum=3) == 3


def test_an_unset_grad_accum_is_derived_from_the_checkpoint(caplog: pytest.LogCaptureFixture) -> None:
    saved = {"world_size": 4, "grad_accum": 2}
    with caplog.at_level(logging.WARNING, logger="zoo.training"):
        assert resumed_grad_accum(Path("ck"), saved, world_size=2, grad_accum=1, given=False) == 4
    assert (
        "ck was written by 4 process(es) x grad_accum 2; on 2 process(es) batch.grad_accum is set to 4"
        in (caplog.text)
    )


def test_another_global_batch_is_refused_naming_the_grad_accum_that_fits() -> None:
    saved = {"world_size": 2, "grad_accum": 1}
    with pytest.raises(
        ResumeError,
        match=r"^ck: written by 2 process\(es\) x grad_accum 1 = 2 batches a step, but this run takes 1 x 1 = 1: "
        r"set batch.grad_accum to 2 to continue it step for step \(a different global batch is a new run",
    ):
        resumed_grad_accum(Path("ck"), saved, world_size=1, grad_accum=1)
    with pytest.raises(
        ResumeError, match=r"takes 3 x 1 = 3: no grad_accum does on 3 processes: resume on a "
    ):
        resumed_grad_accum(Path("ck"), saved, world_size=3, grad_accum=1, given=False)


def test_a_refused_resume_on_another_global_batch_writes_nothing(
    make_config: Callable[..., TrainConfig], tmp_path: Path
) -> None:
    config = make_config(checkpoint={"every_steps": 2}, max_steps=2, **{"batch.grad_accum": 2})
    train(config, progress=False)
    run = config.output_dir
    before = {
        p: p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file() and p.name != ".zoo-train.lock"
    }
    with pytest.raises(
        ResumeError, match=r"2 batches a step, but this run takes 1 x 3 = 3: set batch.grad_accum to 2"
    ):
        train(config.override(max_steps=4, **{"batch.grad_accum": 3}), resume=True, progress=False)
    assert {p: p.read_bytes() for p in before} == before
    # Unset, it is the checkpoint's: the run goes on.
    unset = config.model_dump(mode="json", exclude_unset=True)
    del unset["batch"]["grad_accum"]
    unset["max_steps"] = 4
    assert train(TrainConfig.from_dict(unset), resume=True, progress=False).step == 4


# --- 2 processes -> 1 and 1 -> 2 under torchrun (gloo) -----------------------------------------------------


def config_for(
    output_dir: Path, toy_files: tuple[Path, Path], tokenizer: Path, **overrides: Any
) -> TrainConfig:
    """Dropout on (its masks must follow the batch, not the process), checkpoints at step 2 of 4, one thread
    everywhere (the same matmul sums in every process)."""
    return tiny_config(
        output_dir,
        toy_files,
        **{
            "tokenizer.path": str(tokenizer),
            "data.valid": None,
            "batch.max_tokens": 2000,  # 3 steps an epoch: step 4 begins the second
            "model.overrides.dropout": 0.1,
            "max_steps": STEPS,
            "checkpoint": {"every_steps": SAVED, "keep_last": 5},
            "num_threads": 1,
            **overrides,
        },
    )


def torchrun(config: TrainConfig, record: Path, *resume: Path) -> None:
    """``config`` trained by 2 gloo processes, each recording its batches to ``record``."""
    config_path = record.with_suffix(".yaml")
    config_path.write_text(config.to_yaml(), encoding="utf-8")
    script = Path(__file__).parents[1] / "recorded_training.py"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    command += [str(script), str(config_path), str(record), *map(str, resume)]
    root = str(Path(zoo.__file__).parents[1])  # this checkout's zoo, as the test process imports it
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(command, capture_output=True, text=True, timeout=240, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def max_difference(a: torch.nn.Module, b: torch.nn.Module) -> float:
    a_state, b_state = a.state_dict(), b.state_dict()
    assert a_state.keys() == b_state.keys()
    return max(float((a_state[k] - b_state[k]).abs().max()) for k in a_state)


@pytest.fixture(scope="module")
def runs(toy_files: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Five runs of the same 4 steps of 2 batches: straight on 1 process (grad_accum 2) and on 2 (grad_accum
    unset: 1); resumed at step 2 from the 2-process run's checkpoint on 1 process (grad_accum unset: derived,
    2), and from the 1-process run's on 2 (grad_accum set to 1; DDP, and FSDP2 unset)."""
    from zoo.io.tokenizer import train_tokenizer

    root = tmp_path_factory.mktemp("reshard")
    tokenizer = root / "tok.json"
    train_tokenizer([toy_files[0]], kind="bpe", vocab_size=400).save(tokenizer)

    def config(name: str, **overrides: Any) -> TrainConfig:
        return config_for(root / name, toy_files, tokenizer, **overrides)

    threads = torch.get_num_threads()
    try:
        one = train_recording(config("one", **{"batch.grad_accum": 2}), root / "one.json")
        torchrun(config("two"), root / "two.json")
        checkpoint = f"checkpoints/step-{SAVED:08d}"
        two_to_one = train_recording(
            config("two_to_one"), root / "two_to_one.json", root / "two" / checkpoint
        )
        torchrun(
            config("one_to_two", **{"batch.grad_accum": 1}),
            root / "one_to_two.json",
            root / "one" / checkpoint,
        )
        torchrun(  # FSDP2 shards the weights and Adam's moments; the checkpoint holds them whole
            config("one_to_two_fsdp", **{"distributed.strategy": "fsdp"}),
            root / "one_to_two_fsdp.json",
            root / "one" / checkpoint,
        )
    finally:
        torch.set_num_threads(threads)
    names = ("one", "two", "two_to_one", "one_to_two", "one_to_two_fsdp")
    return {
        "models": {
            "one": one.model,
            "two": zoo.load(root / "two"),
            "two_to_one": two_to_one.model,
            "one_to_two": zoo.load(root / "one_to_two"),
            "one_to_two_fsdp": zoo.load(root / "one_to_two_fsdp"),
        },
        "batches": {name: merged(root / f"{name}.json") for name in names},
    }


@pytest.mark.slow
@pytest.mark.parametrize("resumed", ["two_to_one", "one_to_two", "one_to_two_fsdp"])
def test_a_run_resumes_on_another_process_count_step_for_step(runs: dict[str, Any], resumed: str) -> None:
    batches, models = runs["batches"], runs["models"]
    # The same batches in the same order: straight on 1 or 2 processes, and after the resume.
    assert sorted(batches["one"]) == list(range(1, STEPS + 1))
    assert batches["two"] == batches["one"]
    assert sorted(batches[resumed]) == list(range(SAVED + 1, STEPS + 1))  # only the steps after the resume
    for step, taken in batches[resumed].items():
        assert taken == batches["one"][step], f"step {step}"
    assert len({epoch for step in batches["one"].values() for epoch, _, _ in step}) == 2  # across an epoch
    # The weights of a straight run (dropout on: its masks follow the batch, not the process).
    # Measured: 0.0 both ways (2 -> 1 and 1 -> 2): the same sums in the same order, the all-reduce of two
    # halves (each scaled by 2, averaged) adding what one process accumulates.
    assert max_difference(models["two"], models["one"]) <= 1e-6
    assert max_difference(models[resumed], models["one"]) <= 1e-6
    # ...and they moved: the comparison is not between untrained models.
    untrained = zoo.build(models["one"].spec)
    assert max_difference(untrained, models["one"]) > 1e-3
