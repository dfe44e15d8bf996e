"""kill -9 at random moments of `zoo.save` over an existing checkpoint: the folder loads as the old
checkpoint or the new one, tensor for tensor, every time (slow: run with ``-m slow``).

A helper process imports torch and zoo once and forks one child per save, so each kill costs milliseconds,
not an interpreter start; it reaps the child only after the kill, so the pid killed is always that child.
Only in that child, each os.replace / os.unlink / os.fsync first sleeps a few random milliseconds, so that
a save of a few hundred kilobytes lasts long enough for the kills to land between any two of its steps.
The library itself has no such hook. Each kind of overwrite (sharded or single file, to sharded or single
file) is killed at least 15 times, and half the sharded-over-sharded ones write as many shards as the old
checkpoint has (the file names an untagged save would reuse).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import torch

import zoo

HELPER = r"""
import json, os, random, sys, time
import torch
torch.set_num_threads(1)  # no thread pool in the parent: forking stays safe
import zoo

models = {}
while line := sys.stdin.readline():
    request = json.loads(line)
    key = (request["seed"], request["layers"])
    if key not in models:
        torch.manual_seed(key[0])
        models[key] = zoo.build(zoo.preset("gpt2-tiny", num_layers=key[1]))
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            rng, pause = random.Random(request["rng"]), request["pause"]
            for name in ("replace", "unlink", "fsync"):
                def slow(*args, _real=getattr(os, name), **kwargs):
                    time.sleep(rng.uniform(0, pause))
                    return _real(*args, **kwargs)
                setattr(os, name, slow)
            start = time.perf_counter()
            zoo.save(models[key], request["dir"], max_shard_size=request["shard"])
            with open(request["timing"], "w") as f:  # how long a whole save takes, to aim the next kills
                f.write(str(time.perf_counter() - start))
            code = 0
        finally:
            os._exit(code)
    print(pid, flush=True)
    sys.stdin.readline()  # reaped only when the test says so: until then the pid cannot name another process
    print(os.waitpid(pid, 0)[1], flush=True)
"""

MODELS = [(0, 2), (1, 3), (2, 2), (3, 3)]  # (seed, layers): 2 or 3 layers, so shard counts differ too
SIZES = ["2GB", 40_000, 100_000]  # one file; 11-15 shards; 5-6 shards
KILLS = 60  # at least, a quarter of them for each kind of overwrite
TRANSITIONS = ("sharded->sharded", "single->sharded", "sharded->single", "single->single")
PAUSE = 0.004  # seconds, at most, before each file operation of the child


def build(seed: int, layers: int) -> zoo.ZooModel:
    torch.manual_seed(seed)
    return zoo.build(zoo.preset("gpt2-tiny", num_layers=layers))


def identify(path: Path, pool: dict[tuple[int, int], zoo.ZooModel]) -> tuple[int, int] | None:
    """Which model of ``pool`` the checkpoint at ``path`` loads as, tensor for tensor; None if it does not
    load or matches none."""
    try:
        loaded = zoo.load(path).state_dict()
    except Exception:
        return None
    for key, model in pool.items():
        state = model.state_dict()
        if loaded.keys() == state.keys() and all(torch.equal(loaded[k], state[k]) for k in state):
            return key
    return None


def size(layout: str, rng: random.Random) -> str | int:
    """A max_shard_size that gives ``layout``."""
    return SIZES[0] if layout == "single" else rng.choice(SIZES[1:])


def layout(path: Path) -> str:
    return "sharded" if (path / "model.safetensors.index.json").exists() else "single"


@pytest.mark.slow
def test_kill_9_at_random_moments_leaves_the_old_or_the_new_checkpoint(tmp_path: Path) -> None:
    rng = random.Random(1234)
    pool = {key: build(*key) for key in MODELS}
    directory = tmp_path / "ckpt"
    current, current_size = MODELS[0], SIZES[1]
    zoo.save(pool[current], directory, max_shard_size=current_size)
    helper = subprocess.Popen(
        [sys.executable, "-c", HELPER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=(tmp_path / "helper.log").open("w"),
        text=True,
    )
    assert helper.stdin is not None and helper.stdout is not None
    kills, trials = 0, 0
    durations: dict[str, list[float]] = {"single": [], "sharded": []}  # of saves that ran to the end
    timing = tmp_path / "timing"
    outcomes: Counter[str] = Counter()
    transitions: Counter[str] = Counter()
    failures: list[str] = []
    try:
        while min(transitions[t] for t in TRANSITIONS) < KILLS // 4 and trials < 10 * KILLS:
            trials += 1
            # the overwrite killed least so far; a complete save in this process sets up its old layout
            fewest = min(TRANSITIONS, key=lambda t: (transitions[t], rng.random()))
            wanted_old, new_layout = fewest.split("->")
            if layout(directory) != wanted_old:
                current, current_size = (
                    rng.choice([key for key in MODELS if key != current]),
                    size(wanted_old, rng),
                )
                zoo.save(pool[current], directory, max_shard_size=current_size)
            target = rng.choice([key for key in MODELS if key != current])
            shard = size(new_layout, rng)
            if fewest == "sharded->sharded" and rng.random() < 0.5:
                # as many shards as the old checkpoint: the file names a save without its own tag would reuse
                target, shard = next(k for k in MODELS if k[1] == current[1] and k != current), current_size
            request = {"seed": target[0], "layers": target[1], "dir": str(directory), "shard": shard}
            request |= {"rng": trials, "pause": PAUSE, "timing": str(timing)}
            timing.unlink(missing_ok=True)
            helper.stdin.write(json.dumps(request) + "\n")
            helper.stdin.flush()
            pid = int(helper.stdout.readline())
            past = sorted(durations[new_layout])
            if len(past) >= 3:  # until then the save runs to the end: how long does one take?
                time.sleep(rng.uniform(0, 1.2 * past[len(past) // 2]))
                os.kill(
                    pid, signal.SIGKILL
                )  # the helper's child, not yet reaped (a no-op once it has exited)
            helper.stdin.write("reap\n")
            helper.stdin.flush()
            status = int(helper.stdout.readline())
            killed = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
            old_layout = layout(directory)
            found = identify(directory, pool)
            if not killed:
                if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
                    durations[new_layout].append(float(timing.read_text()))
                else:
                    failures.append(f"trial {trials}: the save failed on its own (status {status})")
            if found is None or found not in (current, target) or (not killed and found != target):
                failures.append(
                    f"trial {trials}: {old_layout} {current} -> {new_layout} {target}: loads as {found}"
                )
            if killed:
                kills += 1
                outcomes["old" if found == current else "new" if found == target else "neither"] += 1
                transitions[f"{old_layout}->{new_layout}"] += 1
            if found == target:
                current, current_size = target, shard
    finally:
        helper.stdin.close()
        helper.wait(timeout=60)

    typical = {k: f"{1000 * sorted(v)[len(v) // 2]:.0f} ms" for k, v in durations.items() if v}
    summary = (
        f"{kills} kills in {trials} saves (a whole save: {typical}); after the kill the folder "
        f"loaded as: {dict(outcomes)}; overwrites killed: {dict(transitions)}; "
        f"unloadable or mixed: {len(failures)}"
    )
    print(summary)
    assert failures == [], summary + "\n" + "\n".join(failures)
    assert kills >= 50 and outcomes["old"] >= 5 and outcomes["new"] >= 5, summary
    assert all(transitions[t] >= KILLS // 4 for t in TRANSITIONS), summary

    # The next complete save removes whatever the killed ones left: temp files, shards no index names.
    zoo.save(pool[current], directory, max_shard_size=SIZES[2])
    index = json.loads((directory / "model.safetensors.index.json").read_text())
    expected = sorted({"model.safetensors.index.json", "spec.json", *index["weight_map"].values()})
    assert sorted(p.name for p in directory.iterdir()) == expected
