"""Data parallelism: 2 gloo processes under torchrun step exactly like 1 process with the same global batch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import yaml

import zoo
from zoo.io.tokenizer import train_tokenizer
from zoo.training import train
from zoo.training.config import TrainConfig
from zoo.training.distributed import Runtime, TorchVersionError, wrap_model

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


def test_fsdp_on_a_torch_without_public_fsdp2_names_the_version_it_needs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # torch 2.5's torch.distributed.fsdp: FSDP1 only, fully_shard still private elsewhere.
    monkeypatch.setitem(sys.modules, "torch.distributed.fsdp", types.ModuleType("torch.distributed.fsdp"))
    monkeypatch.setattr(torch, "__version__", "2.5.1")
    two = Runtime(rank=0, world_size=2, local_rank=0, device=torch.device("cpu"))
    with pytest.raises(TorchVersionError, match=r"FSDP2 .* needs torch >= 2\.6 \(found 2\.5\.1\)"):
        wrap_model(zoo.build("gpt2-tiny"), two, strategy="fsdp")


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_fp16_loss_scaling_across_processes_steps_like_one_process(
    strategy: str, shared_setup: Callable[..., TrainConfig], tmp_path: Path
) -> None:
    """Every process scales, unscales and skips alike (under FSDP2 the overflow check sees sharded
    gradients, which DTensor reduces over the processes). DDP matches one process to 1e-5, as in float32.
    FSDP2 does only to ~1e-6 after a step here, and Adam turns that into ~1e-3 on the key biases, whose
    true gradient is zero (see `shared_setup`), so there the losses and the scaler's records are compared."""
    single = train(shared_setup(tmp_path / "single", precision="fp16", **{"batch.grad_accum": 2}))
    config = shared_setup(tmp_path / strategy, precision="fp16", **{"distributed.strategy": strategy})
    torchrun(config, tmp_path / f"{strategy}.yaml")
    if strategy == "ddp":
        assert_same_weights(single.model, zoo.load(tmp_path / strategy))
    records = {
        run: [json.loads(line) for line in (tmp_path / run / "metrics.jsonl").read_text().splitlines()]
        for run in ("single", strategy)
    }
    for one, many in zip(records["single"], records[strategy], strict=True):
        assert many["loss"] == pytest.approx(one["loss"], rel=1e-4)
        assert (
            (many["loss_scale"], many["skipped_steps"])
            == (one["loss_scale"], one["skipped_steps"])
            == (2.0**16, 0)
        )
