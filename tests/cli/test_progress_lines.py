"""`zoo train` with stdout not a terminal (``> log``, a pipe): a header line (model, parameters, data,
steps, device) at the start and a plain progress line every ``log_every`` steps."""

from __future__ import annotations

import io
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import yaml
from support import tiny_seq2seq_run

from zoo.cli import main
from zoo.training import TrainConfig, TrainerState
from zoo.training.report.progress import ProgressLines, RunHeader, clock, header_line, step_line
from zoo.training.threads import resolve_threads

STEP_LINE = re.compile(
    r"^step (\d+)/(\d+)  loss \d+\.\d{3}  lr \d\.\d\de[-+]\d\d  [\d,]+ tok/s  elapsed \d+:\d\d:\d\d  eta \d+:\d\d:\d\d$"
)


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def no_valid_config(tmp_path: Path) -> Path:
    """A tiny run with no validation split: before, nothing was printed until its end."""
    config = tiny_seq2seq_run(tmp_path, max_steps=3, log_every=1, device="cpu")
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


def test_a_run_into_a_pipe_prints_a_header_then_a_line_every_log_every_steps(
    no_valid_config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["train", str(no_valid_config)]) == 0  # capsys's stdout is no terminal
    header, *rest = capsys.readouterr().out.splitlines()
    assert header.startswith("training transformer-tiny: ") and " parameters; data " in header
    assert f"{tmp_path / 'train.tsv'} (no validation split)" in header
    assert "; 3 steps (" in header and re.search(r"; device cpu, \d+ threads?$", header), header
    steps = [STEP_LINE.match(line) for line in rest[:3]]
    assert all(steps), rest
    assert [(int(m.group(1)), int(m.group(2))) for m in steps if m] == [(1, 3), (2, 3), (3, 3)]
    assert any(line.startswith("trained 3 steps") for line in rest[3:])


def test_no_progress_keeps_the_header_and_drops_the_step_lines(
    no_valid_config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["train", str(no_valid_config), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("training transformer-tiny: ") and "tok/s" not in out


def test_the_header_says_what_the_state_and_the_config_know(no_valid_config: Path, tmp_path: Path) -> None:
    header = RunHeader.of(TrainConfig.from_yaml(no_valid_config))
    threads = resolve_threads(None, device_type="cpu")  # half this machine's CPUs: zoo.training.threads
    assert header.model == "transformer-tiny"
    assert header.device == f"cpu, {threads} thread{'s' if threads > 1 else ''}"
    assert header.data == f"{tmp_path / 'train.tsv'} (no validation split)"
    state = TrainerState(total_parameters=1234567, total_steps=400, steps_per_epoch=134)
    assert header_line(state, header) == (
        f"training transformer-tiny: 1,234,567 parameters; data {header.data}; 400 steps (134 per epoch); "
        f"device {header.device}"
    )
    assert header_line(state) == "training: 1,234,567 parameters; 400 steps (134 per epoch)"


def test_a_step_line_has_step_of_total_loss_lr_speed_elapsed_and_eta() -> None:
    record = {"step": 40, "loss": 4.12345, "lr": 2.5e-4, "tokens_per_s": 12345.6, "elapsed_s": 62.4}
    assert step_line(record, total_steps=400, eta_s=558.0) == (
        "step 40/400  loss 4.123  lr 2.50e-04  12,346 tok/s  elapsed 0:01:02  eta 0:09:18"
    )
    assert clock(3725.9) == "1:02:05"


def test_lines_print_one_line_a_record_however_narrow_the_console() -> None:
    from rich.console import Console

    out = io.StringIO()
    lines = ProgressLines(
        Console(file=out, width=30), header=RunHeader(model="m", data="a/very/long/path.tsv")
    )
    state = TrainerState(trainable_parameters=10, total_parameters=10, total_steps=2)
    lines.on_train_start(state)
    lines.on_log(state, {"step": 1, "loss": 1.0, "lr": 1e-3, "tokens_per_s": 10.0, "elapsed_s": 1.0})
    text = out.getvalue().splitlines()
    assert len(text) == 2 and text[0].startswith("training m: ") and STEP_LINE.match(text[1])
