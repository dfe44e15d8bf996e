"""The training progress bar: `train(config, progress=...)` / `Trainer(..., progress=...)` and ``zoo train``.

    train(config)                   # "auto": a bar on stderr when stderr is a terminal, else nothing
    train(config, progress=False)   # silent
    train(config, progress=ProgressBar(file=open("progress.log", "w")))   # a bar drawn elsewhere

This is the one module outside ``zoo.cli`` that draws (with rich; the rest of the library only returns
values and logs). A training run takes minutes to days and Python users expect to see it move, as
Hugging Face's Trainer and Lightning show a bar by default; keeping the bar here, as a plain callback the
CLI uses too, gives both the same display. It draws only where asked: "auto" checks that stderr is a
terminal (so logs, pipes and CI stay clean), and the trainer builds it on rank 0 only. rich is imported
when a bar is made, never at ``import zoo.training``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TextIO

if TYPE_CHECKING:  # neither imports this module: no cycle, and no torch at import time
    from zoo.training.records import TrainResult
    from zoo.training.state import TrainerState

ProgressSetting = Literal["auto"] | bool


def wants_progress(setting: ProgressSetting, *, stream: TextIO | None = None) -> bool:
    """Whether ``setting`` means a bar: True/False as given; "auto" when ``stream`` (stderr) is a terminal."""
    if isinstance(setting, bool):
        return setting
    if setting != "auto":
        raise ValueError(f"progress must be True, False, 'auto' or a ProgressBar, got {setting!r}")
    stream = sys.stderr if stream is None else stream
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def parameters_line(state: TrainerState) -> str:
    """``trainable parameters: 24,576 of 3,027,968 (0.81%) — LoRA r=8 on qkv, out``: what a run trains."""
    trainable, total = state.trainable_parameters, state.total_parameters
    line = f"trainable parameters: {trainable:,} of {total:,} ({100 * trainable / max(total, 1):.2f}%)"
    if state.lora is not None:
        kind = "DoRA" if state.lora.dora else "LoRA"
        line += f" — {kind} r={state.lora.r} on {', '.join(state.lora.targets)}"
    return line


def eval_line(record: dict[str, Any]) -> str:
    """``step 200: val_loss 1.234  ppl 3.43  BLEU 25.1`` — one validation record as a line; a classifier's
    shows accuracy (and F1) instead of perplexity: ``step 200: val_loss 0.321  accuracy 91.0%  F1 88.2%``."""
    line = f"step {record['step']}: val_loss {record['val_loss']:.3f}"
    if record.get("val_accuracy") is not None:
        line += f"  accuracy {100 * record['val_accuracy']:.1f}%"
        if record.get("val_f1") is not None:
            line += f"  F1 {100 * record['val_f1']:.1f}%"
        return line
    bleu = f"  BLEU {record['val_bleu']:.1f}" if record.get("val_bleu") is not None else ""
    return f"{line}  ppl {record['val_ppl']:.2f}{bleu}"


class ProgressLines:
    """Validation results and checkpoints as lines on a rich console (no bar): for logs and pipes.

    ``console`` is a ``rich.console.Console``; else one on ``file``; else one on stderr.
    """

    def __init__(self, console: Any = None, *, file: TextIO | None = None) -> None:
        if console is None:
            from rich.console import Console

            console = Console(file=file) if file is not None else Console(stderr=True)
        self.console = console

    def on_train_start(self, state: TrainerState) -> None:
        self.print_parameters(state)

    def print_parameters(self, state: TrainerState) -> None:
        """The `parameters_line`, when the run trains only part of the model (LoRA, frozen weights)."""
        if state.trainable_parameters < state.total_parameters:
            self.console.print(parameters_line(state), highlight=False, markup=False, soft_wrap=True)

    def on_eval(self, state: TrainerState, record: dict[str, Any]) -> None:
        self.console.print(eval_line(record), highlight=False)

    def on_checkpoint(self, state: TrainerState, path: Path) -> None:
        from rich.markup import escape

        self.console.print(f"[dim]checkpoint {escape(str(path))}[/]", highlight=False)


class ProgressBar(ProgressLines):
    """A rich bar — step, loss, lr, tokens/s, elapsed and ETA — with validation and checkpoints as lines
    above it. On a console that is not a terminal (a file) rich draws the bar once, when it stops."""

    def __init__(self, console: Any = None, *, file: TextIO | None = None) -> None:
        super().__init__(console, file=file)
        self.progress: Any = None
        self.task: Any = None

    def on_train_start(self, state: TrainerState) -> None:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self.close()  # a second fit() on the same trainer starts a new bar
        self.print_parameters(state)
        self.progress = Progress(
            TextColumn("[bold]train"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("loss {task.fields[loss]}  lr {task.fields[lr]}  {task.fields[speed]} tok/s"),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            console=self.console,
        )
        self.progress.start()
        self.task = self.progress.add_task(
            "train", total=state.total_steps, completed=state.step, loss="-", lr="-", speed="-"
        )

    def on_log(self, state: TrainerState, record: dict[str, Any]) -> None:
        if self.progress is None:
            return
        self.progress.update(
            self.task,
            completed=record["step"],
            loss=f"{record['loss']:.3f}",
            lr=f"{record['lr']:.2e}",
            speed=f"{record['tokens_per_s']:,.0f}",
        )

    def on_train_end(self, state: TrainerState, result: TrainResult) -> None:
        self.close()

    def close(self) -> None:
        """Stop drawing (the trainer calls this when ``fit`` ends, also by an exception)."""
        if self.progress is not None:
            self.progress.stop()
            self.progress = None


def progress_bar(setting: ProgressSetting | ProgressBar, *, is_main: bool) -> ProgressBar | None:
    """The bar a trainer draws for ``setting``: None off rank 0, when off, or when not a terminal ("auto")."""
    if not is_main:
        return None
    if isinstance(setting, ProgressBar):
        return setting
    return ProgressBar() if wants_progress(setting) else None
