"""The device's memory bandwidth as a copy measures it: the denominator of the weights-read floor.

A decode step at batch 1 reads every weight once; no decoder can go faster than reading them at the
bandwidth a plain device-to-device copy reaches (bytes read + bytes written over its time), so
``weight bytes / bandwidth`` is the floor of a step's time, measured here rather than taken from a datasheet.
"""

from __future__ import annotations

import time

import torch


def copy_bandwidth(device: str, *, mib: int | None = None, repeats: int = 10) -> float:
    """Bytes per second (read + written) of copying a ``mib`` MiB buffer on ``device``, best of ``repeats``
    after a warm-up (default size: 1 GiB on CUDA, 64 MiB elsewhere: past every cache)."""
    size = (mib or (1024 if device.startswith("cuda") else 64)) * 2**20
    source = torch.empty(size, dtype=torch.uint8, device=device)
    target = torch.empty_like(source)
    target.copy_(source)  # warm-up: pages and kernels
    best = float("inf")
    for _ in range(repeats):
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        start = time.perf_counter()
        target.copy_(source)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return 2 * size / best
