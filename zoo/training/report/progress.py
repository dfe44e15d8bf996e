"""The training progress bar: `train(config, progress=...)` / `Trainer(..., progress=...)` and ``zoo train``.

    train(config)                   # "auto": a bar on stderr when stderr is a terminal, else nothing
    train(config, progress=False)   # silent
    train(config, progress=ProgressBar(file=open("progress.log", "w")))   # a bar drawn elsewhere
    train(config, progress=False, callbacks=[ProgressLines(header=RunHeader.of(config))])   # plain lines

Both start with a header line (`header_line`: the model, its parameters, the data, the steps, the device).
`ProgressLines` is for logs and pipes: no bar, a plain line every ``log_every`` steps (`step_line`: step of
total, loss, lr, tokens/s, elapsed and ETA), validation results and checkpoints, one line each, so that
``zoo train ... > log`` shows the run moving from its first record.

This is the one module outside ``zoo.cli`` that draws (with rich; the rest of the library only returns
values and logs). A training run takes minutes to days and Python users expect to see it move, as
Hugging Face's Trainer and Lightning show a bar by default; keeping the bar here, as a plain callback the
CLI uses too, gives both the same display. It draws only where asked: "auto" checks that stderr is a
terminal (so logs, pipes and CI stay clean), and the trainer builds it on rank 0 only. rich is imported
when a bar is made, never at ``import zoo.training``.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TextIO

if TYPE_CHECKING:  # none of them imports this module: no cycle, and no torch at import time
    from zoo.training.config import TrainConfig
    from zoo.training.report.records import TrainResult
    from zoo.training.run.state import TrainerState

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


@dataclass(frozen=True)
class RunHeader:
    """What the header line says besides the counts a `TrainerState` carries: the model, the data and the
    device, as text (`of` reads them from a config)."""

    model: str | None = None
    data: str | None = None
    device: str | None = None

    @classmethod
    def of(cls, config: TrainConfig) -> RunHeader:
        """The model source, the training (and validation) data and the device ``config`` names; ``auto``
        resolved as the trainer resolves it, and the process count under torchrun."""
        from zoo.devices import resolve_device
        from zoo.training.threads import resolve_threads

        source = config.model
        if source.init_from is not None:
            model = str(source.init_from)
        elif source.preset is not None:
            model = source.preset
        elif source.file is not None:
            model = str(source.file)
        else:
            model = str((source.spec or {}).get("name") or "the config's spec")
        valid = config.data.valid
        data = _files(config.data.train) + (
            f" (validation {_files(valid)})" if valid is not None else " (no validation split)"
        )
        try:
            device = str(resolve_device(config.device, local_rank=int(os.environ.get("LOCAL_RANK", "0"))))
        except ValueError:  # the trainer says so, before anything runs
            device = str(config.device)
        processes = int(os.environ.get("WORLD_SIZE", "1"))
        if processes > 1:
            device += f" × {processes} processes"
        threads = resolve_threads(config.num_threads, device_type=device.split(":")[0])
        if threads is not None and device.startswith("cpu"):
            device += f", {threads} thread{'s' if threads > 1 else ''}" + (" each" if processes > 1 else "")
        return cls(model=model, data=data, device=device)


def _files(files: Any) -> str:
    """A data entry as text: a path, ``source + target`` files, or a prepared folder."""
    if hasattr(files, "source") and hasattr(files, "target"):
        return f"{files.source} + {files.target}"
    if hasattr(files, "prepared"):
        return f"{files.prepared} (prepared)"
    return str(files)


def header_line(state: TrainerState, header: RunHeader | None = None) -> str:
    """``training gpt2-tiny: 1,234,567 parameters; data a.txt (no validation split); 400 steps (134 per
    epoch); device cpu`` — the parts ``header`` does not know are left out."""
    model = f" {header.model}" if header is not None and header.model else ""
    parts = [f"training{model}: {state.total_parameters:,} parameters"]
    if header is not None and header.data:
        parts.append(f"data {header.data}")
    epoch = f" ({state.steps_per_epoch:,} per epoch)" if state.steps_per_epoch else ""
    parts.append(f"{state.total_steps:,} steps{epoch}")
    if header is not None and header.device:
        parts.append(f"device {header.device}")
    return "; ".join(parts)


def step_line(record: dict[str, Any], *, total_steps: int, eta_s: float | None = None) -> str:
    """``step 40/400  loss 4.123  lr 2.50e-04  12,345 tok/s  elapsed 0:01:02  eta 0:09:18`` — one training
    record as a line (the lr and the speed shown as ``-`` where the record has none)."""
    lr = f"{record['lr']:.2e}" if record.get("lr") is not None else "-"
    speed = f"{record['tokens_per_s']:,.0f}" if record.get("tokens_per_s") is not None else "-"
    line = (
        f"step {record['step']}/{total_steps}  loss {record['loss']:.3f}  lr {lr}  {speed} tok/s  "
        f"elapsed {clock(record.get('elapsed_s') or 0.0)}"
    )
    return line + (f"  eta {clock(eta_s)}" if eta_s is not None else "")


def clock(seconds: float) -> str:
    """3725.2 -> ``1:02:05``."""
    whole = int(seconds)
    return f"{whole // 3600}:{whole // 60 % 60:02d}:{whole % 60:02d}"


def eval_line(record: dict[str, Any]) -> str:
    """``step 200: val_loss 1.234  ppl 3.43  BLEU 25.1`` — one validation record as a line; a classifier's
    shows accuracy (and F1) instead of perplexity: ``step 200: val_loss 0.321  accuracy 91.0%  F1 88.2%``;
    DPO its rewards: ``step 200: val_loss 0.512  reward accuracy 81.0%  margin 0.734``; contrastive its
    held-out retrieval: ``step 90: val_loss 0.643  retrieval accuracy 83.3%``."""
    line = f"step {record['step']}: val_loss {record['val_loss']:.3f}"
    if record.get("val_rewards/accuracy") is not None:
        margin = record.get("val_rewards/margins")
        margin_text = f"  margin {margin:.3f}" if margin is not None else ""
        return f"{line}  reward accuracy {100 * record['val_rewards/accuracy']:.1f}%{margin_text}"
    if record.get("val_retrieval_accuracy") is not None:  # contrastive
        return f"{line}  retrieval accuracy {100 * record['val_retrieval_accuracy']:.1f}%"
    if record.get("val_accuracy") is not None:
        line += f"  accuracy {100 * record['val_accuracy']:.1f}%"
        if record.get("val_f1") is not None:
            line += f"  F1 {100 * record['val_f1']:.1f}%"
        return line
    bleu = f"  BLEU {record['val_bleu']:.1f}" if record.get("val_bleu") is not None else ""
    ppl = f"  ppl {record['val_ppl']:.2f}" if record.get("val_ppl") is not None else ""
    return f"{line}{ppl}{bleu}"


class ProgressLines:
    """The run as plain lines on a rich console (no bar), for logs and pipes: the header at the start, a
    `step_line` every ``log_every`` steps (unless ``steps=False``), validation results and checkpoints.

    ``console`` is a ``rich.console.Console``; else one on ``file``; else one on stderr. ``header``: the
    model, data and device for the header line (`RunHeader.of(config)`); without it the line gives the
    parameter and step counts alone.
    """

    def __init__(
        self,
        console: Any = None,
        *,
        file: TextIO | None = None,
        header: RunHeader | None = None,
        steps: bool = True,
    ) -> None:
        if console is None:
            from rich.console import Console

            console = Console(file=file) if file is not None else Console(stderr=True)
        self.console = console
        self.header = header
        self.steps = steps
        self._start: tuple[int, float] | None = None  # (step, time) this fit started at, for the ETA

    def on_train_start(self, state: TrainerState) -> None:
        self.print_header(state)

    def print_header(self, state: TrainerState) -> None:
        """The `header_line`, then the `parameters_line` when only part of the model trains."""
        self._start = (state.step, time.perf_counter())
        self._line(header_line(state, self.header))
        self.print_parameters(state)

    def on_log(self, state: TrainerState, record: dict[str, Any]) -> None:
        if self.steps:
            self._line(
                step_line(record, total_steps=state.total_steps, eta_s=self._eta(record["step"], state))
            )

    def _eta(self, step: int, state: TrainerState) -> float | None:
        """Seconds to ``total_steps`` at this fit's pace so far (validation and checkpoints included)."""
        if self._start is None or step <= self._start[0]:
            return None
        seconds_a_step = (time.perf_counter() - self._start[1]) / (step - self._start[0])
        return seconds_a_step * max(state.total_steps - step, 0)

    def _line(self, text: str) -> None:
        # soft_wrap: a line of a log stays one line, whatever the console's width
        self.console.print(text, highlight=False, markup=False, soft_wrap=True)

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

    def __init__(
        self, console: Any = None, *, file: TextIO | None = None, header: RunHeader | None = None
    ) -> None:
        super().__init__(console, file=file, header=header)
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
        self.print_header(state)
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
