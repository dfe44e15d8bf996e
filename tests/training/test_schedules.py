"""Learning-rate schedules: the paper's formula, its peak, and the warmup + decay family."""

from __future__ import annotations

import math
from itertools import pairwise

import pytest

from zoo.training.config import NoamSchedule, WarmupSchedule
from zoo.training.schedules import learning_rate, noam, warmup_decay


@pytest.mark.parametrize("step", [1, 2, 10, 399, 400, 401, 4000, 100_000])
@pytest.mark.parametrize(("d_model", "warmup", "scale"), [(512, 4000, 1.0), (128, 400, 2.0)])
def test_noam_equals_the_formula_of_the_paper(step: int, d_model: int, warmup: int, scale: float) -> None:
    expected = scale * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)
    assert noam(step, d_model=d_model, warmup=warmup, scale=scale) == pytest.approx(expected, rel=1e-12)


def test_noam_peaks_at_step_equal_to_warmup() -> None:
    rates = [noam(step, d_model=512, warmup=4000) for step in range(1, 20_001)]
    assert rates.index(max(rates)) + 1 == 4000
    assert max(rates) == pytest.approx((512 * 4000) ** -0.5)
    assert all(a < b for a, b in pairwise(rates[:4000]))  # rises during warmup
    assert all(a > b for a, b in pairwise(rates[3999:]))  # then decays


def test_noam_treats_step_zero_as_step_one() -> None:
    assert noam(0, d_model=512, warmup=4000) == noam(1, d_model=512, warmup=4000) > 0


@pytest.mark.parametrize("decay", ["linear", "cosine"])
def test_warmup_decay_rises_linearly_then_decays_to_the_floor(decay: str) -> None:
    kwargs = dict(lr=1e-3, warmup=10, total=110, decay=decay, min_lr_ratio=0.1)
    assert warmup_decay(5, **kwargs) == pytest.approx(5e-4)
    assert warmup_decay(10, **kwargs) == pytest.approx(1e-3)
    assert warmup_decay(110, **kwargs) == pytest.approx(1e-4)
    assert warmup_decay(500, **kwargs) == pytest.approx(1e-4)
    halfway = 1e-4 + 0.9e-3 * (0.5 if decay == "linear" else 0.5 * (1 + math.cos(math.pi / 2)))
    assert warmup_decay(60, **kwargs) == pytest.approx(halfway)


def test_learning_rate_dispatches_on_the_schedule_config() -> None:
    assert learning_rate(NoamSchedule(warmup_steps=100), 50, d_model=64, total_steps=1000) == noam(
        50, d_model=64, warmup=100
    )
    constant = WarmupSchedule(kind="constant", lr=3e-4, warmup_steps=0)
    assert learning_rate(constant, 999, d_model=64, total_steps=1000) == 3e-4
