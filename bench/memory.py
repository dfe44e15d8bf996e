"""Peak memory of one unit of work, measured in a fresh process so contenders cannot inherit each other's heap.

On CPU, glibc keeps freed memory resident (its mmap threshold grows with use), so a resident-set high-water
mark taken inside the timing process reads near zero for whoever runs second. Here a child process fixes the
threshold (MALLOC_MMAP_THRESHOLD_) so large tensors are returned on free, runs one warm-up unit, resets the
high-water mark through /proc/self/clear_refs and measures the peak resident set of the next unit. On CUDA
the allocator's own peak counter does the same in-process.

What is reported: for a train step, its peak over the resident set just before it (activations, gradients
and the step's temporaries; the optimizer's states exist from the warm-up on). For generation, the peak over
the resident set right after the model was built, before the warm-up call: what serving a call costs on top
of the loaded weights, including whatever a call leaves behind for the next one (compiled graphs, frozen
copies of the weights, a cache not yet freed) but not the one-off peak of compiling. Generation also
reports the process's whole peak resident set (interpreter, libraries, weights and the call), ``process_mib``.

    python -m bench.memory train "gpt2-shaped train step" zoo
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent


def measure(kind: str, workload: str, contender: str, *, device: str = "cpu") -> dict[str, float] | None:
    """``{"peak_mib": ...}`` of one train step or one generation call of ``contender`` on ``workload`` (and, for
    generation on CPU, ``process_mib``); None if the child failed."""
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-m", "bench.memory", kind, workload, contender, device],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=900,
    )  # fmt: skip
    if result.returncode != 0:
        return None
    return json.loads(result.stdout.strip().splitlines()[-1])


def _child(kind: str, name: str, contender: str, device: str) -> dict[str, float]:
    from bench import contenders
    from bench.timing import PeakMemory
    from bench.workloads import suite

    workloads = suite(quick=False, device=device)
    items = workloads.train if kind == "train" else workloads.generate
    workload = next(w for w in items if w.name == name)
    torch.set_num_threads(1)  # memory, not speed: one thread keeps the child quiet next to the timed run
    if kind == "train":
        model = contenders.build(contender, workload.spec, device, torch.float32)
        run = contenders.train_step_fn(contender, workload, model, contenders.train_batch(workload, device))
    else:
        dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[workload.dtype]
        model = contenders.build(contender, workload.spec, device, dtype)
        run = contenders.generate_fn(contender, workload, model, device)
    loaded = PeakMemory(device).resident()  # generation: measured from the loaded model on
    with torch.inference_mode(kind != "train"):
        run()  # warm-up: optimizer states, lazily built buffers and compiled graphs exist from here on
        with PeakMemory(device) as memory:
            run()
    if kind == "train":
        return {"peak_mib": memory.peak / 2**20}
    result = {"peak_mib": (memory.peak + memory.base - loaded) / 2**20}
    if memory.process is not None:
        result["process_mib"] = memory.process / 2**20
    return result


if __name__ == "__main__":
    kind, name, contender, device = (*sys.argv[1:4], sys.argv[4] if len(sys.argv) > 4 else "cpu")
    print(json.dumps(_child(kind, name, contender, device)))
