"""Resuming on another process count: the checkpoint's global batch kept through ``grad_accum``.

A step takes ``grad_accum x world_size`` batches of the epoch's order (`zoo.training.batching`), process r
its every ``world_size``-th, and the loss is divided by the whole step's token count, so a step is the
gradient of those batches however they are split among processes and micro-batches. The data position is
counted in batches over all processes, the learning rate is a function of the step, each forward's RNG
(dropout) is seeded from its batch's index (`zoo.training.loop`), and a checkpoint holds full (unsharded)
weights and optimizer state. So a run saved by N processes with grad_accum g continues step for step on M
processes with grad_accum g x N / M: the same batches in the same order, the same weights up to float
rounding in the order gradients are summed.

A resume whose ``grad_accum x world_size`` differs from the checkpoint's would be another run (other steps,
another epoch length) and is refused with the grad_accum that would fit; a config that leaves
``batch.grad_accum`` unset gets that value, as litgpt derives its accumulation from a global batch size.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from zoo.training.run.checkpoints import ResumeError

log = logging.getLogger(__name__)


def resumed_grad_accum(
    path: Path, saved: dict[str, Any], *, world_size: int, grad_accum: int, given: bool = True
) -> int:
    """The grad_accum that continues checkpoint ``path`` (its ``trainer_state.json`` read as ``saved``) on
    ``world_size`` processes with the checkpoint's batches per step: ``grad_accum`` when it does; the one
    that does when ``given`` is False (the config left it unset); else a `ResumeError` naming both."""
    saved_processes, saved_accum = int(saved["world_size"]), int(saved["grad_accum"])
    per_step = saved_processes * saved_accum  # batches per optimizer step, over all processes
    if grad_accum * world_size == per_step:
        return grad_accum
    fits = per_step % world_size == 0
    if fits and not given:
        log.warning(
            "%s was written by %d process(es) x grad_accum %d; on %d process(es) batch.grad_accum is set to "
            "%d (unset in the config), so each step still takes %d batches",
            path, saved_processes, saved_accum, world_size, per_step // world_size, per_step,
        )  # fmt: skip
        return per_step // world_size
    if fits:
        advice = f"set batch.grad_accum to {per_step // world_size} to continue it step for step"
    else:
        advice = f"no grad_accum does on {world_size} processes: resume on a number of processes dividing {per_step}"
    raise ResumeError(
        f"{path}: written by {saved_processes} process(es) x grad_accum {saved_accum} = {per_step} batches a "
        f"step, but this run takes {world_size} x {grad_accum} = {world_size * grad_accum}: {advice} (a "
        "different global batch is a new run: start one from its weights with model.init_from)"
    )
