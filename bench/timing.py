"""Alternating timing: every repetition runs each contender once, in turn, so drift in machine load hits
all of them alike. Reports the median and the spread (min, max) of the timed repetitions."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch


@dataclass
class Timing:
    seconds: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    def rate(self, units: float) -> tuple[float, float, float]:
        """(median, slowest, fastest) units per second."""
        return units / self.median, units / max(self.seconds), units / min(self.seconds)


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


class PeakMemory:
    """Peak memory of one call: CUDA allocator peak, or on Linux CPU the resident-set high-water mark (VmHWM),
    reset before the call through /proc/self/clear_refs, minus the resident set before it (meaningful in a
    process whose allocator returns freed memory: see `bench.memory`)."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.process: int | None = None  # CPU: the process's whole peak resident set during the call

    def resident(self) -> int:
        """Bytes in use now: the CUDA allocator's, or the process's resident set."""
        if self.device.startswith("cuda"):
            return torch.cuda.memory_allocated()
        return _status_bytes("VmRSS")

    def __enter__(self) -> PeakMemory:
        if self.device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()
            self.base = torch.cuda.memory_allocated()
        else:
            self.base = _status_bytes("VmRSS")
            try:
                Path("/proc/self/clear_refs").write_text("5")
            except OSError:
                self.base = None
        return self

    def __exit__(self, *exc: object) -> None:
        if self.device.startswith("cuda"):
            self.peak = torch.cuda.max_memory_allocated() - self.base
        else:
            self.process = _status_bytes("VmHWM") if self.base is not None else None
            self.peak = self.process - self.base if self.process is not None and self.base is not None else 0


def _status_bytes(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    return 0


def alternate(
    runs: dict[str, Callable[[], object]], *, device: str, warmup: int, repeats: int
) -> dict[str, Timing]:
    """Time each closure ``repeats`` times after ``warmup`` untimed calls, interleaving contenders.
    (Peak memory is measured apart, in `bench.memory`, so it cannot disturb the timings.)"""
    timings = {name: Timing() for name in runs}
    for _ in range(warmup):
        for run in runs.values():
            run()
    for _ in range(repeats):
        for name, run in runs.items():
            _sync(device)
            start = time.perf_counter()
            run()
            _sync(device)
            timings[name].seconds.append(time.perf_counter() - start)
    return timings
