"""Learning-rate schedules as pure functions of the optimizer step (1 = the first update).

The loop sets the learning rate from ``learning_rate(schedule, step)`` before every update, so a schedule
has no state to checkpoint: resuming at step ``n`` gives the lr a straight run has at step ``n``.
"""

from __future__ import annotations

import math

from zoo.training.config import NoamSchedule, WarmupSchedule


def noam(step: int, *, d_model: int, warmup: int, scale: float = 1.0) -> float:
    """The schedule of "Attention Is All You Need" (section 5.3, eq. 3):

        lr = scale * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)

    Linear warmup for ``warmup`` steps, then decay with the inverse square root of the step; the two
    branches meet at ``step == warmup``, where the rate peaks at ``scale * (d_model * warmup)^-0.5``.
    Step 0 (before any update) is treated as step 1.
    """
    step = max(step, 1)
    return scale * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


def warmup_decay(
    step: int, *, lr: float, warmup: int, total: int, decay: str = "cosine", min_lr_ratio: float = 0.0
) -> float:
    """Linear warmup from ~0 to ``lr`` over ``warmup`` steps, then ``constant``, ``linear`` or ``cosine``
    decay to ``min_lr_ratio * lr`` at step ``total``."""
    step = max(step, 1)
    if step <= warmup:
        return lr * step / warmup
    if decay == "constant":
        return lr
    progress = min(1.0, (step - warmup) / max(1, total - warmup))  # 0 -> 1 over the decay phase
    if decay == "linear":
        factor = 1.0 - progress
    elif decay == "cosine":
        factor = 0.5 * (1.0 + math.cos(math.pi * progress))
    else:
        raise ValueError(f"unknown decay {decay!r}; expected constant, linear or cosine")
    return lr * (min_lr_ratio + (1.0 - min_lr_ratio) * factor)


def learning_rate(
    schedule: NoamSchedule | WarmupSchedule, step: int, *, d_model: int, total_steps: int
) -> float:
    """The learning rate of a config's ``schedule`` for update number ``step``."""
    if isinstance(schedule, NoamSchedule):
        return noam(step, d_model=d_model, warmup=schedule.warmup_steps, scale=schedule.scale)
    return warmup_decay(
        step,
        lr=schedule.lr,
        warmup=schedule.warmup_steps,
        total=total_steps,
        decay=schedule.kind,
        min_lr_ratio=schedule.min_lr_ratio,
    )
