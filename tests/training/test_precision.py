"""Mixed precision: what ``auto`` means, and fp16's loss scaling — overflowing steps are skipped, recorded,
the scale halves, clipping sees unscaled gradients, and a resumed run keeps the scale."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from zoo.training import Callback, Trainer, TrainerState, train
from zoo.training.config import ConfigError, OptimConfig, TrainConfig
from zoo.training.optim import build_optimizer, clip_gradients
from zoo.training.precision import LossScaling, resolve_precision
from zoo.training.report.records import METRIC_KEYS, SCALING_KEYS
from zoo.training.run.checkpoints import ResumeError, checkpoint_dir, checkpoint_problem


def read_jsonl(run: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_auto_means_bf16_on_cuda_and_fp32_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert resolve_precision("auto", cpu) == "fp32"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: True)
    assert resolve_precision("auto", cuda) == "bf16"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: False)
    assert resolve_precision("auto", cuda) == "fp32"
    for setting in ("fp32", "bf16", "fp16"):
        assert resolve_precision(setting, cpu) == setting  # an explicit choice is kept
    with pytest.raises(ConfigError, match="precision"):
        TrainConfig.from_dict(
            {"model": "gpt2-tiny", "data": {"train": "x.txt"}, "max_steps": 1, "precision": "fp8"}
        )


def _linear_step(scaling: LossScaling, model: torch.nn.Linear, optimizer: torch.optim.Optimizer) -> None:
    with torch.autocast("cpu", dtype=torch.float16):
        loss = model(torch.ones(4, 3)).float().square().mean()
    scaling.scale(loss).backward()


def test_an_overflowing_step_is_skipped_and_the_scale_halved() -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    optimizer = build_optimizer(model, OptimConfig())  # fused Adam: the kernel itself skips on overflow
    for group in optimizer.param_groups:
        group["lr"] = 0.1
    scaling = LossScaling("fp16", torch.device("cpu"))
    _linear_step(scaling, model, optimizer)
    scaling.unscale(optimizer)
    scaling.step(optimizer, clip_gradients(model, 1.0))
    optimizer.zero_grad(set_to_none=True)
    assert scaling.measure() == {"loss_scale": 2.0**16, "skipped_steps": 0}
    weights = {name: p.detach().clone() for name, p in model.named_parameters()}
    moments = {k: v.clone() for k, v in optimizer.state[model.weight].items()}

    _linear_step(scaling, model, optimizer)
    assert model.weight.grad is not None
    model.weight.grad[0, 0] = math.inf  # an overflow in the scaled gradients
    scaling.unscale(optimizer)
    scaling.step(optimizer, clip_gradients(model, 1.0))
    optimizer.zero_grad(set_to_none=True)
    for name, p in model.named_parameters():
        assert torch.equal(p, weights[name]), name  # the step did not happen
    for key, value in moments.items():
        assert torch.equal(optimizer.state[model.weight][key], value), key  # nor Adam's moments or count
    assert scaling.measure() == {"loss_scale": 2.0**15, "skipped_steps": 1}
    assert scaling.measure()["skipped_steps"] == 0  # counted since the last measure

    saved = json.loads(json.dumps(scaling.state_dict()))  # JSON numbers, as a checkpoint stores them
    fresh = LossScaling("fp16", torch.device("cpu"))
    fresh.load_state_dict(saved)
    assert fresh.loss_scale == 2.0**15
    assert float(fresh.scale(torch.ones(()))) == 2.0**15


def test_other_precisions_pass_through_loss_scaling() -> None:
    scaling = LossScaling("bf16", torch.device("cpu"))
    loss = torch.tensor(3.0)
    assert scaling.scale(loss) is loss
    assert scaling.measure() == {} and scaling.state_dict() is None and scaling.loss_scale is None


class Watch(Callback):
    """Keeps each training record, the state's gradient norm and (given a model) the weights after each step."""

    def __init__(self) -> None:
        self.model: torch.nn.Module | None = None
        self.records: dict[int, dict[str, Any]] = {}
        self.grad_norms: dict[int, float | None] = {}
        self.weights: dict[int, dict[str, torch.Tensor]] = {}

    def on_log(self, state: TrainerState, record: dict[str, Any]) -> None:
        self.records[state.step] = record
        self.grad_norms[state.step] = state.grad_norm
        if self.model is not None:
            self.weights[state.step] = {n: p.detach().clone() for n, p in self.model.named_parameters()}


def test_fp16_trains_on_cpu_and_records_the_loss_scale(make_config: Callable[..., TrainConfig]) -> None:
    config = make_config(precision="fp16", max_steps=3)
    result = train(config, progress=False)
    assert all(p.dtype == torch.float32 for p in result.model.parameters())  # autocast: weights stay fp32
    records = read_jsonl(config.output_dir)
    training = [r for r in records if r["loss"] is not None]
    assert [r["step"] for r in training] == [1, 2, 3]
    for r in training:
        assert tuple(r) == (*METRIC_KEYS, *SCALING_KEYS)  # the standard keys, then the scaler's
        assert math.isfinite(r["loss"]) and r["loss_scale"] == 2.0**16 and r["skipped_steps"] == 0
    assert "loss_scale" not in records[-1]  # the validation record
    assert math.isfinite(result.final["val_loss"])


def test_fp16_clips_the_unscaled_gradients(make_config: Callable[..., TrainConfig], tmp_path: Path) -> None:
    # The gradient norm reported (and clipped to 1.0) must be the true one, not 2^16 times it.
    norms = {}
    for precision in ("fp32", "fp16"):
        watch = Watch()
        train(
            make_config(precision=precision, max_steps=1, output_dir=str(tmp_path / precision)),
            callbacks=[watch],
            progress=False,
        )
        norms[precision] = watch.grad_norms[1]
    assert norms["fp16"] == pytest.approx(norms["fp32"], rel=5e-2)


def test_an_fp16_overflow_is_skipped_recorded_and_the_scale_survives_resume(
    make_config: Callable[..., TrainConfig], tmp_path: Path
) -> None:
    """Step 3's first micro-batch (of 2) overflows; clipping is on. A run split at step 4 and resumed
    matches a straight one, with the halved scale."""

    def run(output_dir: Path, max_steps: int, *, resume: bool = False) -> tuple[Trainer, Watch]:
        config = make_config(
            precision="fp16",
            max_steps=max_steps,
            output_dir=str(output_dir),
            checkpoint={"every_steps": 2, "keep_last": 5},
            **{"batch.max_tokens": 1500, "batch.grad_accum": 2, "optim.clip_grad_norm": 1.0},
        )
        watch = Watch()
        trainer = Trainer(config, callbacks=[watch], progress=False, resume=resume)
        watch.model = trainer.model
        first_micro_batch: dict[int, bool] = {}

        def overflow(grad: torch.Tensor) -> torch.Tensor:
            if trainer.step == 2 and trainer.step not in first_micro_batch:  # computing step 3
                first_micro_batch[trainer.step] = True
                return torch.full_like(grad, math.inf)
            return grad

        list(trainer.model.parameters())[-1].register_hook(overflow)
        return trainer, watch

    straight, watch = run(tmp_path / "straight", 6)
    straight.fit()
    straight.close()
    records = watch.records
    assert [records[s]["skipped_steps"] for s in range(1, 7)] == [0, 0, 1, 0, 0, 0]
    assert [records[s]["loss_scale"] for s in range(1, 7)] == [2.0**16] * 2 + [2.0**15] * 4
    for name, before in watch.weights[2].items():
        assert torch.equal(watch.weights[3][name], before), name  # the skipped step changed nothing
    assert any(not torch.equal(watch.weights[4][n], w) for n, w in watch.weights[3].items())  # step 4 did
    adam_steps = {int(s["step"]) for s in straight.optimizer.state.values()}
    assert adam_steps == {5}  # six steps taken by the loop, one of them skipped

    first, _ = run(tmp_path / "split", 4)
    first.fit()
    first.close()
    saved = json.loads((checkpoint_dir(tmp_path / "split", 4) / "trainer_state.json").read_text())
    assert saved["grad_scaler"]["scale"] == 2.0**15
    second, resumed = run(tmp_path / "split", 6, resume=True)
    assert second.scaling.loss_scale == 2.0**15  # restored before the first resumed step
    second.fit()
    second.close()
    for step in (5, 6):
        assert resumed.records[step]["loss"] == pytest.approx(records[step]["loss"], abs=1e-6)
        assert resumed.records[step]["loss_scale"] == 2.0**15
    for name, weight in resumed.weights[6].items():
        assert torch.allclose(weight, watch.weights[6][name], atol=1e-6), name


def test_a_bad_saved_loss_scale_is_named(make_config: Callable[..., TrainConfig]) -> None:
    config = make_config(precision="fp16", max_steps=2, checkpoint={"every_steps": 2})
    train(config, progress=False)
    path = checkpoint_dir(config.output_dir, 2)
    state_file = path / "trainer_state.json"
    state = json.loads(state_file.read_text())
    state["grad_scaler"]["scale"] = "big"
    state_file.write_text(json.dumps(state))
    assert checkpoint_problem(path) == "trainer_state.json: grad_scaler: no valid scale"
    with pytest.raises(ResumeError, match="grad_scaler: no valid scale"):
        train(config.override(max_steps=3), resume=path, progress=False)
