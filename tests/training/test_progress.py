"""The progress bar: when the library draws one, where it draws, and that it stops whatever happens."""

from __future__ import annotations

import io
from collections.abc import Callable

import pytest

from zoo.training import ProgressBar, Trainer, TrainerState, train
from zoo.training.config import TrainConfig
from zoo.training.report.progress import ProgressLines, eval_line, progress_bar, wants_progress


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_auto_draws_only_on_a_terminal_and_true_false_force_it() -> None:
    assert wants_progress("auto", stream=FakeTerminal()) is True
    assert wants_progress("auto", stream=io.StringIO()) is False
    assert wants_progress(True, stream=io.StringIO()) is True
    assert wants_progress(False, stream=FakeTerminal()) is False
    closed = io.StringIO()
    closed.close()
    assert wants_progress("auto", stream=closed) is False  # a closed stderr is not a terminal
    with pytest.raises(ValueError, match="progress must be True, False, 'auto'"):
        wants_progress("yes")  # type: ignore[arg-type]


def test_auto_follows_stderr(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.stderr", FakeTerminal())
    assert isinstance(progress_bar("auto", is_main=True), ProgressBar)
    monkeypatch.setattr("sys.stderr", io.StringIO())
    assert progress_bar("auto", is_main=True) is None


def test_only_rank_0_draws() -> None:
    given = ProgressBar(file=io.StringIO())
    assert progress_bar(True, is_main=False) is None and progress_bar(given, is_main=False) is None
    assert progress_bar(given, is_main=True) is given
    assert progress_bar(False, is_main=True) is None


def test_a_run_with_progress_draws_the_bar_and_without_it_writes_nothing(
    make_config: Callable[..., TrainConfig], tmp_path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = io.StringIO()
    train(make_config(max_steps=2, output_dir=str(tmp_path / "a")), progress=ProgressBar(file=out))
    drawn = out.getvalue()
    assert "train" in drawn and "2/2" in drawn and "loss" in drawn and "tok/s" in drawn
    assert "step 2: val_loss" in drawn  # the final validation, as a line above the bar

    capsys.readouterr()
    train(make_config(max_steps=2, output_dir=str(tmp_path / "b")), progress=True)  # default: stderr
    assert "2/2" in capsys.readouterr().err

    train(make_config(max_steps=2, output_dir=str(tmp_path / "c")), progress=False)
    assert capsys.readouterr() == ("", "")


def test_a_bar_passed_as_a_callback_is_the_only_bar(
    make_config: Callable[..., TrainConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("sys.stderr", FakeTerminal())  # "auto" would draw one of its own
    trainer = Trainer(make_config(max_steps=1), callbacks=[ProgressBar(file=io.StringIO())])
    try:
        assert trainer.progress is None
    finally:
        trainer.close()


def test_the_bar_stops_when_training_fails(make_config: Callable[..., TrainConfig]) -> None:
    class Boom:
        def on_log(self, state: TrainerState, record: dict) -> None:
            raise RuntimeError("boom")

    bar = ProgressBar(file=io.StringIO())
    with pytest.raises(RuntimeError, match="boom"):
        train(make_config(max_steps=2), callbacks=[Boom()], progress=bar)
    assert bar.progress is None  # stopped: no live display left refreshing the terminal


def test_lines_report_validation_and_checkpoints_without_markup_surprises(tmp_path) -> None:
    out = io.StringIO()
    lines = ProgressLines(file=out)
    lines.on_eval(None, {"step": 7, "val_loss": 1.23456, "val_ppl": 3.437, "val_bleu": None})  # type: ignore[arg-type]
    lines.on_checkpoint(None, tmp_path / "[bold]x")  # type: ignore[arg-type]
    text = out.getvalue()
    assert "step 7: val_loss 1.235  ppl 3.44\n" in text and "[bold]x" in text
    assert eval_line({"step": 1, "val_loss": 1.0, "val_ppl": 2.7, "val_bleu": 25.04}).endswith("BLEU 25.0")
