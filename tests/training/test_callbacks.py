"""Callbacks and custom metrics: the documented example runs, duck-typed hooks work, mistakes are named."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from zoo.training import Callback, Trainer, TrainerState, train
from zoo.training.config import TrainConfig
from zoo.training.report.records import METRIC_KEYS, check_callbacks, make_record, metric_value


def read_jsonl(run: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_documented_example_collects_records_and_logs_a_custom_metric(
    make_config: Callable[..., TrainConfig],
) -> None:
    # The callback example of the README and zoo.training.report.records.Callback: keep them in step.
    class History(Callback):
        def __init__(self) -> None:
            self.records: list[dict[str, Any]] = []

        def on_log(self, state: TrainerState, record: dict[str, Any]) -> None:
            record["grad_norm"] = state.grad_norm  # a custom key: in the record and every sink
            self.records.append(record)

        def on_eval(self, state: TrainerState, record: dict[str, Any]) -> None:
            self.records.append(record)

    history = History()
    config = make_config(max_steps=3)
    train(config, callbacks=[history], progress=False)
    assert [r["step"] for r in history.records] == [1, 2, 3, 3]  # 3 training records, the final validation
    training = history.records[:3]
    assert all(isinstance(r["grad_norm"], float) and r["grad_norm"] > 0 for r in training)
    assert history.records == read_jsonl(config.output_dir)  # written after the callbacks added to it
    assert tuple(training[0]) == (*METRIC_KEYS, "grad_norm")  # standard keys first, then the extras
    assert "grad_norm" not in history.records[-1]


def test_a_plain_object_with_some_hooks_is_a_callback(make_config: Callable[..., TrainConfig]) -> None:
    class Steps:  # no base class, only the hooks it needs
        def __init__(self) -> None:
            self.calls: list[str] = []

        def on_train_start(self, state: TrainerState) -> None:
            self.calls.append("start")

        def on_train_end(self, state: TrainerState, result: Any) -> None:
            self.calls.append(f"end {result.step}")

    steps = Steps()
    train(make_config(max_steps=2), callbacks=[steps], progress=False)
    assert steps.calls == ["start", "end 2"]


def test_hooks_get_a_state_snapshot_with_what_callbacks_need(
    make_config: Callable[..., TrainConfig],
) -> None:
    class Watch:
        def __init__(self) -> None:
            self.seen: list[tuple[str, TrainerState, Any]] = []

        def on_train_start(self, state: TrainerState) -> None:
            self.seen.append(("start", state, None))

        def on_log(self, state: TrainerState, record: dict[str, Any]) -> None:
            self.seen.append(("log", state, record))

        def on_checkpoint(self, state: TrainerState, path: Path) -> None:
            self.seen.append(("checkpoint", state, path))

        def on_train_end(self, state: TrainerState, result: Any) -> None:
            self.seen.append(("end", state, result))

    watch = Watch()
    config = make_config(max_steps=2, checkpoint={"every_steps": 2})
    train(config, callbacks=[watch], progress=False)
    assert [hook for hook, _, _ in watch.seen] == ["start", "log", "log", "checkpoint", "end"]
    assert all(isinstance(state, TrainerState) for _, state, _ in watch.seen)
    start, log1, log2, checkpoint, end = (state for _, state, _ in watch.seen)
    assert (start.step, start.total_steps, start.grad_norm) == (0, 2, None)
    assert start.output_dir == config.output_dir
    for state, (_, _, record) in zip((log1, log2), watch.seen[1:3]):
        assert state.step == record["step"] and state.lr == record["lr"] and state.grad_norm > 0
    assert checkpoint.step == 2 and watch.seen[3][2].name == "step-00000002"
    assert end.step == 2 and end.elapsed_s >= log2.elapsed_s and end.position > 0


def test_a_callback_may_add_keys_to_a_record_but_not_change_the_measured_ones(
    make_config: Callable[..., TrainConfig],
) -> None:
    class AddsTensor:
        def on_log(self, state: TrainerState, record: dict[str, Any]) -> None:
            record["twice"] = torch.tensor(2.0) * record["loss"]  # written as a plain number

    config = make_config(max_steps=1)
    train(config, callbacks=[AddsTensor()], progress=False)
    first = read_jsonl(config.output_dir)[0]
    assert first["twice"] == pytest.approx(2 * first["loss"])

    class Rewrites:
        def on_log(self, state: TrainerState, record: dict[str, Any]) -> None:
            record["loss"] = 0.0

    with pytest.raises(ValueError, match="loss: standard metric"):
        train(make_config(max_steps=1), callbacks=[Rewrites()], progress=False, overwrite=True)


def test_things_that_are_not_callbacks_are_named() -> None:
    with pytest.raises(TypeError, match=r"callbacks\[0\] \(Ellipsis\) has none of the hooks on_train_start"):
        check_callbacks([...])  # what `callbacks=[...]` copied from a sketch passes
    with pytest.raises(
        TypeError, match=r"callbacks\[1\] is the class Callback, not an instance: pass Callback\(\)"
    ):
        check_callbacks([Callback(), Callback])

    class HuggingFaceStyle(Callback):
        def on_step_end(self, state: TrainerState) -> None: ...

    with pytest.warns(UserWarning, match="defines on_step_end, which the training loop never calls"):
        check_callbacks([HuggingFaceStyle()])


def test_metrics_logged_outside_a_hook_join_the_next_record_and_standard_keys_are_refused(
    make_config: Callable[..., TrainConfig],
) -> None:
    trainer = Trainer(make_config(max_steps=1), progress=False)
    try:
        trainer.log_metrics(my_metric=torch.tensor(0.5), note="warm start")
        with pytest.raises(ValueError, match="loss: standard metric"):
            trainer.log_metrics(loss=1.0)
        with pytest.raises(TypeError, match="metric 'bad': list is not a number"):
            trainer.log_metrics(bad=[1, 2])
        trainer.fit()
    finally:
        trainer.close()
    first, *rest = read_jsonl(trainer.output_dir)
    assert first["my_metric"] == 0.5 and first["note"] == "warm start"
    assert all("my_metric" not in r for r in rest)


def test_records_keep_standard_keys_and_accept_extras() -> None:
    record = make_record(3, 1.23456, loss=2.0, my_metric=7)
    assert tuple(record) == (*METRIC_KEYS, "my_metric")
    assert record["val_loss"] is None and record["elapsed_s"] == 1.235 and record["my_metric"] == 7
    assert metric_value("x", torch.tensor(2)) == 2 and isinstance(metric_value("x", torch.tensor(2.5)), float)
    with pytest.raises(ValueError, match="non-empty strings"):
        make_record(1, 0.0, **{"": 1})
