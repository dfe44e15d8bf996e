"""Stopping a run early without losing it: a signal (Ctrl-C, a scheduler's SIGTERM), or a loss that is no
longer finite.

    Guard.signals()     while `Trainer.fit` trains: SIGINT / SIGTERM handlers that only note the signal;
                        the previous handlers come back when training ends, however it ends
    Guard.interrupted() between two steps: whether any process got a signal (one all-reduce of the flag
                        under torchrun, so every process stops after the same step); the loop then saves a
                        checkpoint and raises `TrainingInterrupted`. A second signal raises it at once
    Guard.after_step()  on the device, no host sync: notes the first step whose loss or gradient norm is not
                        finite (fp16: the step that makes ``max_skipped_steps`` skipped steps in a row)
    Guard.check()       reads that note (one sync) where the loop syncs anyway: each record, validation,
                        checkpoint and the final save; before a save it also checks the weights themselves.
                        Raises `TrainingDiverged`, so no weights that are not finite are ever written

A signal never half-applies a step: the handler sets a flag, the step under way finishes (forward,
backward, optimizer step), and the loop stops before the next one. Under torchrun the launcher passes the
terminal's Ctrl-C on to its workers, which got it from the terminal already: a repeat within
`REPEAT_S` seconds is that echo, not a second Ctrl-C.

Under fp16 a step whose gradients overflow is skipped (weights untouched) and the loss scale halved
(`zoo.training.precision`): a few in a row are normal while the scale settles, so only ``max_skipped_steps``
in a row stop the run. In fp32 and bf16 the first non-finite loss (or gradient norm) stops it.
"""

from __future__ import annotations

import math
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

import torch
import torch.distributed as dist

from zoo.lora.nf4 import is_nf4
from zoo.training import distributed as dist_
from zoo.training.run import checkpoints, rundir

SIGNALS = (signal.SIGINT, signal.SIGTERM)
REPEAT_S = 1.0  # under torchrun: a repeat this soon after the first signal is the launcher's echo
_NONE = 2**62  # "no bad step" in a MIN all-reduce


class TrainingInterrupted(KeyboardInterrupt):
    """Training stopped on a signal. ``checkpoint``: the checkpoint kept at ``step`` (None when a second
    signal stopped it at once); ``exit_code``: the shell's 128 + the signal's number (130 for SIGINT, 143 for
    SIGTERM). A KeyboardInterrupt, so ``except Exception`` does not swallow a Ctrl-C."""

    def __init__(self, signum: int, *, step: int | None = None, checkpoint: Path | None = None) -> None:
        self.signum, self.step, self.checkpoint = signum, step, checkpoint
        self.signal_name = signal.Signals(signum).name
        self.exit_code = 128 + signum
        if checkpoint is not None:
            text = f"training interrupted ({self.signal_name}) after step {step}; kept {checkpoint}: "
            text += f"{rundir.option('resume')} continues from it"
        else:
            text = f"training stopped at once on a second {self.signal_name}; nothing more was saved"
        super().__init__(text)

    def __str__(self) -> str:
        return str(self.args[0])


class TrainingDiverged(ValueError):
    """The loss (or the weights) stopped being finite; nothing was saved after the last good checkpoint.
    A ValueError, so the CLI shows its one line. ``step``: the first bad step; ``checkpoint``: the last good
    one (None when the run saved none)."""

    def __init__(self, message: str, *, step: int, checkpoint: Path | None) -> None:
        super().__init__(message)
        self.step, self.checkpoint = step, checkpoint


class Guard:
    """The stop conditions of one run on ``runtime``: signals and non-finite losses. ``skipping``: the run
    skips overflowing steps (fp16 loss scaling); ``max_skipped_steps``: how many in a row stop it then."""

    def __init__(
        self, runtime: dist_.Runtime, *, output_dir: Path, skipping: bool, max_skipped_steps: int
    ) -> None:
        self.runtime, self.output_dir = runtime, output_dir
        self.skipping, self.max_skipped_steps = skipping, max_skipped_steps
        self.signum: int | None = None  # the first signal, until training ends
        self._at = 0.0
        self._previous: dict[int, Any] = {}
        device = runtime.device
        self._first = torch.full((), -1, dtype=torch.int64, device=device)  # the first bad step, or -1
        self._value = torch.zeros((), dtype=torch.float32, device=device)  # its loss
        self._streak = torch.zeros((), dtype=torch.int64, device=device)  # skipped steps in a row (fp16)

    # --- signals ----------------------------------------------------------------------------------------

    @contextmanager
    def signals(self) -> Iterator[None]:
        """Note SIGINT and SIGTERM instead of dying, inside this block only (in the main thread; elsewhere
        Python allows no handlers and signals keep their usual effect)."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        self.signum = None
        self._previous = {sig: signal.getsignal(sig) for sig in SIGNALS}
        for sig in SIGNALS:
            signal.signal(sig, self._handle)
        try:
            yield
        finally:
            self._restore()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        now = time.monotonic()
        if self.signum is None:
            self.signum, self._at = signum, now
            return
        if self.runtime.distributed and now - self._at < REPEAT_S:
            return  # torchrun passing on the Ctrl-C this process already got from the terminal
        self._restore()  # a third signal has its usual effect
        raise TrainingInterrupted(signum)

    def _restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        self._previous = {}

    def interrupted(self) -> int | None:
        """The signal to stop on, if any process got one (every process must call this, between steps)."""
        if not self.runtime.distributed:
            return self.signum
        got, number = dist_.all_reduce_sum(
            [float(self.signum is not None), float(self.signum or 0)], self.runtime
        )
        if not got:
            return None
        return self.signum or round(number / got)  # a process that got none stops on the others' signal

    # --- non-finite losses ------------------------------------------------------------------------------

    def after_step(self, step: int, loss: torch.Tensor, grad_norm: torch.Tensor | None) -> None:
        """Note ``step`` if it is the first bad one (a few tensor ops on the device; nothing is read)."""
        device = self._first.device
        loss = loss.detach().to(device, torch.float32)
        if self.skipping:  # fp16: GradScaler skipped this step exactly when the norm is not finite
            assert grad_norm is not None  # fp16 always clips or measures the norm
            self._streak = (self._streak + 1) * ~torch.isfinite(grad_norm.detach().to(device))
            bad = self._streak >= self.max_skipped_steps
        else:
            bad = ~torch.isfinite(loss)
            if grad_norm is not None:
                bad |= ~torch.isfinite(grad_norm.detach().to(device))
        new = bad & (self._first < 0)
        self._first = torch.where(new, step, self._first)
        self._value = torch.where(new, loss, self._value)

    def check(
        self, *, step: int, model: torch.nn.Module | None = None, loss_scale: float | None = None
    ) -> None:
        """Raise `TrainingDiverged` if a bad step was noted (every process must call this: under torchrun the
        verdict is all-reduced); with ``model``, also if any of its weights is not finite (call it before
        saving them)."""
        first = int(self._first)
        first = first if first >= 0 else _NONE
        broken = _non_finite_weights(model) if model is not None else 0
        if self.runtime.distributed:  # the earliest bad step of any process; the bad weights of all
            device = self.runtime.device
            earliest = torch.tensor([first], dtype=torch.int64, device=device)
            total = torch.tensor([broken], dtype=torch.int64, device=device)
            dist.all_reduce(earliest, op=dist.ReduceOp.MIN)
            dist.all_reduce(total)
            first, broken = int(earliest), int(total)
        if first == _NONE and not broken:
            return
        kept = checkpoints.latest_checkpoint(self.output_dir)
        if first != _NONE:
            what = self._describe(first, loss_scale)
        else:
            first = step
            what = f"the weights are no longer finite after step {step} ({broken} values: inf or nan)"
        later = f", found at step {step}" if step != first else ""
        if kept is not None:
            advice = (
                f"the last good checkpoint, {kept}, is kept: lower the learning rate (or check the data), "
            )
            advice += f"then continue from it ({rundir.option('resume')})"
        else:
            advice = (
                "the run saved no checkpoint before it: lower the learning rate (or check the data), then "
            )
            advice += f"start over ({rundir.option('overwrite')})"
        raise TrainingDiverged(
            f"training diverged: {what}{later}; its weights were not saved, and {advice}",
            step=first,
            checkpoint=kept,
        )

    def _describe(self, first: int, loss_scale: float | None) -> str:
        if self.skipping:
            n = self.max_skipped_steps
            scale = f"; loss scale {loss_scale:g}" if loss_scale is not None else ""
            return (
                f"{n} optimizer steps in a row were skipped for non-finite gradients (steps {first - n + 1} to "
                f"{first}{scale}; max_skipped_steps: {n})"
            )
        value = float(self._value)
        if math.isfinite(value):
            return f"the gradient norm was not finite at step {first}"
        return f"the loss was {value} at step {first}"


def _non_finite_weights(model: torch.nn.Module) -> int:
    """How many parameter values (this process's shards, under FSDP) are inf or nan: one host sync."""
    counts = []
    for p in model.parameters():
        local = p.to_local() if hasattr(p, "to_local") else p  # an FSDP2 DTensor: this process's shard
        if is_nf4(local):
            continue  # QLoRA's frozen NF4 base: finite by construction (quantised from finite weights)
        counts.append((~torch.isfinite(local.detach())).sum())
    return int(torch.stack(counts).sum()) if counts else 0
