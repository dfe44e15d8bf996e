"""How many CPU threads torch computes with in a training run whose config leaves ``num_threads`` unset.

torch's own default is one thread per core. Its intra-op threads meet at a barrier after every operation, so
one thread whose core is busy elsewhere (another run, an editor, the tests) stalls them all, while they spin
and take the cores from that other work: docs/training.md's DPO example ran 20 steps in 48 s with torch's 2
threads and in 9 s with 1, back to back, on this project's shared 2-core machine. zoo therefore takes half
the CPUs this process may run on, at least one, shared among the processes torchrun starts on this machine:
one thread on a 2-core machine, never slower there than one thread is, and half the cores' speed-up on a
large one. zoo starts no DataLoader worker processes (batches are read from memory-mapped shards in the
training process), and the tokenizer's thread pool runs while the data is prepared, before the first step:
nothing else competes with torch's threads during the steps. On a GPU torch's CPU threads are left as
torch sets them. A config's ``num_threads`` always wins.
"""

from __future__ import annotations

import os


def available_cpus() -> int:
    """The CPUs this process may run on (its affinity mask, which containers and ``taskset`` narrow)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS and Windows have no affinity call
        return os.cpu_count() or 1


def local_processes() -> int:
    """The training processes torchrun starts on this machine (``LOCAL_WORLD_SIZE``), 1 without torchrun."""
    try:
        return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        return 1


def resolve_threads(
    requested: int | None, *, device_type: str, cpus: int | None = None, processes: int | None = None
) -> int | None:
    """The intra-op thread count to give ``torch.set_num_threads``; None: leave torch's own.

    ``requested`` (the config's ``num_threads``) when given; else, for a run on the CPU, half of ``cpus``
    (default: `available_cpus`) divided among ``processes`` (default: `local_processes`), at least 1; for a
    run on an accelerator, None.
    """
    if requested is not None:
        return requested
    if device_type != "cpu":
        return None
    cpus = available_cpus() if cpus is None else cpus
    processes = local_processes() if processes is None else processes
    return max(1, cpus // (2 * processes))
