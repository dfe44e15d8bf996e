"""Data parallelism: 2 gloo processes under torchrun step exactly like 1 process with the same global batch."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import yaml

import zoo
from zoo.io.tokenizer import train_tokenizer
from zoo.training import train
from zoo.training.config import TrainConfig

STEPS = 3


@pytest.fixture
def shared_setup(make_config: Callable[..., TrainConfig], toy_files: tuple[Path, Path], tmp_path: Path):
    """A fixed tokenizer file (so both runs share it) and a config factory without validation."""
    tokenizer_path = tmp_path / "tok.json"
    train_tokenizer([toy_files[0]], kind="bpe", vocab_size=400).save(tokenizer_path)

    def make(output_dir: Path, **overrides: object) -> TrainConfig:
        # Adam's eps at 1e-6, not 1e-9: a key bias has a gradient of exactly zero in exact arithmetic, and
        # summing the rounding noise in another order (all-reduce) must not turn into a full-size step.
        fixed = {
            "tokenizer.path": str(tokenizer_path),
            "data.valid": None,
            "batch.max_tokens": 600,
            "optim.eps": 1e-6,
        }
        return make_config(output_dir=str(output_dir), max_steps=STEPS, **fixed, **overrides)

    return make


def torchrun(config: TrainConfig, config_path: Path, *extra: str) -> None:
    config_path.write_text(config.to_yaml(), encoding="utf-8")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    command += ["-m", "zoo", "train", str(config_path), *extra]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=240, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def assert_same_weights(a: torch.nn.Module, b: torch.nn.Module) -> None:
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.allclose(x, y, atol=1e-5), f"{name}: max diff {(x - y).abs().max():.2e}"


def test_two_ddp_processes_match_one_process_with_the_same_global_batch(
    shared_setup: Callable[..., TrainConfig], tmp_path: Path
) -> None:
    single = train(shared_setup(tmp_path / "single", **{"batch.grad_accum": 2}))
    torchrun(shared_setup(tmp_path / "ddp"), tmp_path / "ddp.yaml")
    ddp = zoo.load(tmp_path / "ddp")
    assert_same_weights(single.model, ddp)
    # ...and they did move: the comparison is not between two untrained models.
    untrained = zoo.build(single.model.spec)
    assert not torch.allclose(untrained.embed.tokens.weight, ddp.embed.tokens.weight, atol=1e-3)
    records = yaml.safe_load(
        "[" + ",".join((tmp_path / "ddp" / "metrics.jsonl").read_text().splitlines()) + "]"
    )
    assert [r["step"] for r in records] == [1, 2, 3]  # only rank 0 writes


@pytest.mark.slow
def test_two_fsdp_processes_match_one_process_and_resume(
    shared_setup: Callable[..., TrainConfig], tmp_path: Path
) -> None:
    single = train(shared_setup(tmp_path / "single", **{"batch.grad_accum": 2}))
    config = shared_setup(
        tmp_path / "fsdp", checkpoint={"every_steps": 2}, **{"distributed.strategy": "fsdp"}
    )
    torchrun(config, tmp_path / "fsdp.yaml")
    assert_same_weights(single.model, zoo.load(tmp_path / "fsdp"))
    # A checkpoint written by 2 sharded processes resumes in 1 process (with accumulation instead).
    resumed = train(
        config.override(**{"batch.grad_accum": 2}), resume=tmp_path / "fsdp/checkpoints/step-00000002"
    )
    assert_same_weights(single.model, resumed.model)
