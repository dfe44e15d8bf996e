"""Every JSON that zoo reads from a file goes through the bounded reader (zoo.io.jsonfile): JSON nested
50,000 deep inside a checkpoint's optimizer metadata, a run's metric log or a file of unknown kind is one
clear refusal (or a skipped record), never a RecursionError."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from zoo.cli.kinds import file_kind
from zoo.training.report.sinks import truncate_records
from zoo.training.run.checkpoints import unflatten_optimizer_state
from zoo.viz.training import read_metrics

DEEP = "[" * 50_000 + "]" * 50_000


def test_deep_optimizer_metadata_is_refused_naming_the_file_and_key(tmp_path: Path) -> None:
    path = tmp_path / "optimizer.safetensors"
    save_file({"w/exp_avg": torch.zeros(2)}, str(path), metadata={"param_groups": DEEP, "scalars": "{}"})
    with pytest.raises(ValueError, match=r"optimizer\.safetensors: param_groups: JSON nested more than"):
        unflatten_optimizer_state(path)


def test_deep_metric_record_is_dropped_on_resume_and_skipped_by_plots(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n' + DEEP + "\n", encoding="utf-8")
    metrics = read_metrics(tmp_path)
    assert metrics.skipped == 1 and metrics.series["loss"] == [(1.0, 2.0)]
    truncate_records(tmp_path, after=5)
    assert (tmp_path / "metrics.jsonl").read_text(encoding="utf-8") == '{"step": 1, "loss": 2.0}\n'


def test_a_deep_json_file_is_of_no_known_kind(tmp_path: Path) -> None:
    path = tmp_path / "deep.json"
    path.write_text(DEEP, encoding="utf-8")
    assert file_kind(path) is None
