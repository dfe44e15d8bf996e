"""Metric sinks: metrics.jsonl always, metrics.csv and TensorBoard by choice; crashes and resumes keep
every file readable and free of steps the run redid."""

from __future__ import annotations

import csv
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from zoo.training import SinkDependencyError, Trainer, TrainerState, train
from zoo.training.config import TrainConfig
from zoo.training.report.records import METRIC_KEYS, make_record
from zoo.training.report.sinks import CsvSink, JsonlSink, TensorBoardSink, read_csv, truncate_records


def csv_rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


class Collect:
    """A sink of one's own: anything with write(record)."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []
        self.closed = False

    def write(self, record: dict[str, Any]) -> None:
        self.records.append(record)

    def close(self) -> None:
        self.closed = True


def test_config_sinks_write_the_same_records_as_jsonl_and_csv(
    make_config: Callable[..., TrainConfig],
) -> None:
    class GradNorm:
        def on_log(self, state: TrainerState, record: dict[str, Any]) -> None:
            record["grad_norm"] = state.grad_norm

    config = make_config(max_steps=2, log_sinks=["jsonl", "csv"])
    mine = Collect()
    train(config, callbacks=[GradNorm()], sinks=[mine], progress=False)
    records = [json.loads(line) for line in (config.output_dir / "metrics.jsonl").read_text().splitlines()]
    assert mine.records == records and mine.closed
    header = (config.output_dir / "metrics.csv").read_text().splitlines()[0]
    assert header.split(",") == [*METRIC_KEYS, "grad_norm"]  # the union of the records' keys
    rows = csv_rows(config.output_dir / "metrics.csv")
    assert [float(r["step"]) for r in rows] == [r["step"] for r in records]
    assert float(rows[0]["loss"]) == records[0]["loss"] and rows[-1]["loss"] == ""  # None: an empty cell
    assert float(rows[0]["grad_norm"]) == records[0]["grad_norm"] and rows[-1]["grad_norm"] == ""


def test_csv_header_grows_with_new_keys_and_a_crash_leaves_whole_rows(tmp_path: Path) -> None:
    path = tmp_path / "metrics.csv"
    sink = CsvSink(path)
    sink.write(make_record(1, 0.1, loss=3.0))
    sink.write(make_record(2, 0.2, loss=2.5, my_metric="a,b"))  # a new key: the table is rewritten
    assert not path.with_name("metrics.csv.tmp").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["metrics.csv"]  # no temporary file left behind
    with open(path, "a", encoding="utf-8") as f:
        f.write("3,2.0,0.1")  # a run killed mid-row
    header, rows = read_csv(path)
    assert header == [*METRIC_KEYS, "my_metric"]
    assert [(r["step"], r["loss"], r["my_metric"]) for r in rows] == [("1", "3.0", ""), ("2", "2.5", "a,b")]


def test_resume_truncation_keeps_both_logs_to_the_checkpoint_step(tmp_path: Path) -> None:
    records = [make_record(s, s / 10, loss=1.0 / s, my_metric=s) for s in (1, 2, 3, 4)]
    jsonl, table = JsonlSink(tmp_path / "metrics.jsonl"), CsvSink(tmp_path / "metrics.csv")
    for record in records:
        jsonl.write(record)
        table.write(record)
    with open(tmp_path / "metrics.jsonl", "a", encoding="utf-8") as f:
        f.write('{"step": 5, "lo')  # half a line from a crash
    truncate_records(tmp_path, after=2)
    kept = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert kept == records[:2] and kept[1]["my_metric"] == 2
    assert [r["step"] for r in csv_rows(tmp_path / "metrics.csv")] == ["1", "2"]
    resumed = CsvSink(tmp_path / "metrics.csv", append=True)  # what a resumed trainer opens
    resumed.write(make_record(3, 0.3, loss=0.5, other=1))
    header, rows = read_csv(tmp_path / "metrics.csv")
    assert header == [*METRIC_KEYS, "my_metric", "other"] and [r["step"] for r in rows] == ["1", "2", "3"]


def test_a_fresh_run_starts_a_new_csv(make_config: Callable[..., TrainConfig]) -> None:
    config = make_config(max_steps=1, log_sinks=["csv"])
    config.output_dir.mkdir(parents=True)
    (config.output_dir / "metrics.csv").write_text("step,old\n9,1\n")
    train(config, progress=False)
    rows = csv_rows(config.output_dir / "metrics.csv")
    assert "old" not in rows[0] and [r["step"] for r in rows] == ["1", "1"]


def test_bad_sinks_are_refused_before_any_work(make_config: Callable[..., TrainConfig]) -> None:
    config = make_config()
    with pytest.raises(ValueError, match="unknown metric sink 'parquet'; built-in sinks are jsonl, csv"):
        Trainer(config, sinks=["parquet"])
    with pytest.raises(TypeError, match="neither a sink name nor an object with write"):
        Trainer(config, sinks=[object()])
    with pytest.raises(ValueError, match="log_sinks"):
        make_config(log_sinks=["parquet"])
    assert not config.output_dir.exists()


def test_missing_tensorboard_names_the_package(
    make_config: Callable[..., TrainConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # as if not installed
    with pytest.raises(SinkDependencyError, match="pip install tensorboard") as error:
        Trainer(make_config(log_sinks=["tensorboard"]))
    assert isinstance(error.value, ValueError)  # so `zoo train` prints it without a traceback


def test_tensorboard_sink_writes_scalars_and_a_resume_purges_redone_steps(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    def scalars(tag: str) -> list[tuple[int, float]]:
        events = EventAccumulator(str(tmp_path / "tb"))
        events.Reload()
        return [(e.step, round(e.value, 6)) for e in events.Scalars(tag)]

    sink = TensorBoardSink(tmp_path / "tb")
    for step in (1, 2, 3):
        sink.write(make_record(step, 0.1, loss=1.0 / step, my_metric=step * 10, note="text"))
    sink.close()
    assert scalars("loss") == [(1, 1.0), (2, 0.5), (3, 0.333333)]
    assert scalars("my_metric") == [(1, 10.0), (2, 20.0), (3, 30.0)]
    resumed = TensorBoardSink(tmp_path / "tb", purge_step=3)  # resumed from a checkpoint at step 2
    resumed.write(make_record(3, 0.3, loss=0.25))
    resumed.close()
    assert scalars("loss") == [(1, 1.0), (2, 0.5), (3, 0.25)]
