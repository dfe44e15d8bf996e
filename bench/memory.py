"""Peak memory of one unit of work, measured in a fresh process so contenders cannot inherit each other's heap.

On CPU, glibc keeps freed memory resident (its mmap threshold grows with use), so a resident-set high-water
mark taken inside the timing process reads near zero for whoever runs second. Here a child process fixes the
threshold (MALLOC_MMAP_THRESHOLD_) so large tensors are returned on free, resets the high-water mark through
/proc/self/clear_refs and reads the peak resident set (VmHWM) afterwards. On CUDA the allocator's own peak
counter does the same in-process.

What is reported: for a train step, its peak over the resident set just before it, after one warm-up step
(activations, gradients and the step's temporaries; the optimizer's states exist from the warm-up on). For
generation, the peak over the loaded model: the mark is reset right after the model is built in the process,
or loaded from a checkpoint (`GenerateWorkload.from_checkpoint`) with each weight read once so that a
memory-mapped file is as resident as after any call, and it spans the first call and a second one. So it counts
what serving costs on top of the weights, including what the first call does once (single-row decoding's weight
layout, compiling a decode step) and whatever a call leaves behind for the next (compiled graphs, frozen
copies of the weights). Generation also reports the process's whole peak resident set over the two calls
(interpreter, libraries, weights and the calls), ``process_mib``.

    python -m bench.memory train "gpt2-shaped train step" zoo
    python -m bench.memory write "llama-3.2-1b-shaped greedy, batch 1, float32" cpu /tmp/checkpoint
    python -m bench.memory generate "llama-3.2-1b-shaped greedy, batch 1, float32" zoo cpu /tmp/checkpoint
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536", "PYTHONPATH": str(ROOT)}


def measure(
    kind: str, workload: str, contender: str, *, device: str = "cpu", checkpoint: Path | None = None
) -> dict[str, float] | None:
    """``{"peak_mib": ...}`` of one train step or of generation by ``contender`` on ``workload`` (and, for
    generation on CPU, ``process_mib``); ``checkpoint``: the folder `write_checkpoint` filled, for a workload
    loaded from one. None if the child failed."""
    extra = [str(checkpoint)] if checkpoint is not None else []
    result = subprocess.run(
        [sys.executable, "-m", "bench.memory", kind, workload, contender, device, *extra],
        capture_output=True, text=True, env={**os.environ, **_ENV}, cwd=ROOT, timeout=900,
    )  # fmt: skip
    if result.returncode != 0:
        return None
    return json.loads(result.stdout.strip().splitlines()[-1])


def write_checkpoint(workload: str, folder: Path, *, device: str = "cpu") -> bool:
    """Write ``workload``'s model with random weights (float32) into ``folder``: a zoo checkpoint in
    ``zoo/``, its `zoo.to_hf` export in ``hf/``; in a child process, so this one never holds the weights."""
    result = subprocess.run(
        [sys.executable, "-m", "bench.memory", "write", workload, device, str(folder)],
        capture_output=True, text=True, env={**os.environ, **_ENV}, cwd=ROOT, timeout=1800,
    )  # fmt: skip
    return result.returncode == 0


def _workload(kind: str, name: str, device: str) -> Any:
    from bench.workloads import suite

    workloads = suite(quick=False, device=device)
    return next(w for w in (workloads.train if kind == "train" else workloads.generate) if w.name == name)


def _write(name: str, device: str, folder: Path) -> None:
    import zoo

    torch.manual_seed(0)
    model = zoo.build(_workload("generate", name, device).spec, dtype=torch.float32)
    zoo.save(model, folder / "zoo")
    zoo.to_hf(model, folder / "hf")


def _load(contender: str, folder: Path, device: str, dtype: torch.dtype) -> torch.nn.Module:
    """The model as a user loads it: `zoo.load`, or transformers' ``from_pretrained`` on the export."""
    if contender == "zoo":
        import zoo

        return zoo.load(folder / "zoo", device=device, dtype=dtype)
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(folder / "hf", dtype=dtype).to(device)


def _child(kind: str, name: str, contender: str, device: str, checkpoint: Path | None) -> dict[str, float]:
    from bench import contenders
    from bench.timing import PeakMemory

    workload = _workload(kind, name, device)
    torch.set_num_threads(1)  # memory, not speed: one thread keeps the child quiet next to the timed run
    if kind == "train":
        model = contenders.build(contender, workload.spec, device, torch.float32)
        run = contenders.train_step_fn(contender, workload, model, contenders.train_batch(workload, device))
        run()  # warm-up: optimizer states and lazily built buffers exist from here on
        with PeakMemory(device) as memory:
            run()
        return {"peak_mib": memory.peak / 2**20}
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[workload.dtype]
    if workload.from_checkpoint:
        assert checkpoint is not None, f"{name} is loaded from a checkpoint: pass its folder"
        model = _load(contender, checkpoint, device, dtype)
        with (
            torch.no_grad()
        ):  # every weight read once: a memory-mapped file's pages resident, as after a call
            for tensor in [*model.parameters(), *model.buffers()]:
                tensor.sum()
    else:
        model = contenders.build(contender, workload.spec, device, dtype)
    run = contenders.generate_fn(contender, workload, model, device)
    with PeakMemory(device) as memory, torch.inference_mode():  # from the loaded model on
        run()  # the first call: the weight layout for its rows, compiled graphs, lazily built buffers
        run()
    result = {"peak_mib": memory.peak / 2**20}
    if memory.process is not None:
        result["process_mib"] = memory.process / 2**20
    return result


if __name__ == "__main__":
    if sys.argv[1] == "write":
        _write(sys.argv[2], sys.argv[3], Path(sys.argv[4]))
    else:
        kind, name, contender = sys.argv[1:4]
        device = sys.argv[4] if len(sys.argv) > 4 else "cpu"
        folder = Path(sys.argv[5]) if len(sys.argv) > 5 else None
        print(json.dumps(_child(kind, name, contender, device, folder)))
