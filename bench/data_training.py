"""Training from prepared shards (`bench.data`'s training columns): memory, start-up time and speed.

For one corpus size, each measure in a fresh process:

    zoo train    ``python -m zoo train`` on a config whose ``data.train`` is the prepared folder
                 (transformer-tiny, the 8,000-token BPE tokenizer, ``batch.max_tokens`` 4096, no
                 validation, a few steps): its peak resident set (VmHWM, the "Maximum resident set size"
                 ``/usr/bin/time -v`` reports) and the wall time from starting the command to its
                 ``step 1/`` line
    speed        in one process, every batch collated and trained on twice: its rows read from the shard
                 files (as training does) and sliced from arrays copied into memory first (the in-memory
                 path), in alternating order: training tokens/s of each

    python -m bench.data_training --pairs 100000 --prepared runs/bench-data/work/prepared-100000 \\
        --tokenizer runs/bench-data/work/bpe-8000.json            # one size on its own
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RSS_STEPS = 12  # the peak is the largest batch seen: a dozen steps reach the long-sentence buckets
SPEED_STEPS = 30  # batches timed, each trained on twice: once read from the files, once from memory
SPEED_SKIP = 5  # warm-up steps (the allocator, the caches), not timed


def write_config(folder: Path, prepared: Path, tokenizer: Path, *, steps: int, name: str) -> Path:
    """A training config for transformer-tiny on the prepared folder; returns its path."""
    import yaml

    config = {
        "model": {"preset": "transformer-tiny"},
        "data": {"train": {"prepared": str(prepared.resolve())}},
        "tokenizer": {"path": str(tokenizer.resolve())},
        "batch": {"max_tokens": 4096},
        "max_steps": steps,
        "log_every": 1,
        "num_threads": 2,
        "output_dir": str((folder / name).resolve()),
    }
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


# ``zoo train`` as the command runs it (zoo.cli.main), reporting its own peak resident set (VmHWM) at exit:
# a child's ru_maxrss would start from the parent's resident set at the fork.
LAUNCH = """
import atexit, sys
def peak():
    status = open("/proc/self/status").read().splitlines()
    sys.stderr.write(next(line for line in status if line.startswith("VmHWM:")) + "\\n")
atexit.register(peak)
from zoo.cli import main
sys.exit(main(["train", sys.argv[1], "--overwrite"]))
"""


def zoo_train(config: Path) -> dict[str, Any]:
    """Run ``zoo train`` in a fresh process: its peak RSS and the wall time to its first step's line."""
    command = [sys.executable, "-c", LAUNCH, str(config)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TERM": "dumb", "COLUMNS": "200"}
    start = time.perf_counter()
    first_step = None
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=err, env=env, cwd=ROOT, text=True)
        assert proc.stdout is not None
        for line in proc.stdout:  # line-buffered: the progress lines of a non-terminal run
            if first_step is None and line.startswith("step 1/"):
                first_step = time.perf_counter() - start
        proc.wait()
        err.seek(0)
        stderr = err.read().decode(errors="replace")
    if proc.returncode:
        raise RuntimeError(f"zoo train failed:\n{stderr[-2000:]}")
    peak = next(line for line in stderr.splitlines() if line.startswith("VmHWM:"))
    return {
        "train_peak_rss_mb": int(peak.split()[1]) / 1024,
        "first_step_s": first_step,
        "train_wall_s": time.perf_counter() - start,
    }


def child_speed(config: Path) -> dict[str, Any]:
    """Training tokens/s reading each batch's rows from the shard files (as training does) against the
    same rows sliced from arrays copied into memory first, in one process: every batch is collated and
    trained on twice, once each way, in alternating order (ABBA), after `SPEED_SKIP` warm-up steps."""
    import numpy as np

    from zoo.training import TrainConfig, Trainer
    from zoo.training.report.reporting import Interval

    trainer = Trainer(TrainConfig.from_yaml(config), progress=False, overwrite=True)
    trainer.interval = Interval(trainer.runtime.device)  # what fit() sets up before its first step
    data = trainer.train_split.data
    files = data.read_rows
    held = {side: (np.array(data.tokens(side)), np.array(data.offsets(side))) for side in data.sides}

    def memory(indices: Any, side: str) -> list[Any]:
        tokens, offsets = held[side]
        return [tokens[offsets[i] : offsets[i + 1]] for i in np.asarray(indices).tolist()]

    seconds = {"files": 0.0, "memory": 0.0}
    tokens = 0
    try:
        for step in range(SPEED_SKIP + SPEED_STEPS):
            group = trainer.order.next_group()
            mine = group[trainer.runtime.rank :: trainer.runtime.world_size]
            modes = ("files", "memory") if step % 2 == 0 else ("memory", "files")
            for mode in modes:
                data.read_rows = files if mode == "files" else memory  # type: ignore[method-assign]
                start = time.perf_counter()
                batches = [trainer.collate(units) for _, units in mine]
                trainer._train_step(batches)
                if step >= SPEED_SKIP:
                    seconds[mode] += time.perf_counter() - start
            if step >= SPEED_SKIP:
                tokens += sum(batch.num_tokens for batch in batches)
    finally:
        trainer.close()
    return {"shards_tokens_s": tokens / seconds["files"], "memory_tokens_s": tokens / seconds["memory"]}


def run_child(*args: str) -> dict[str, Any]:
    command = [sys.executable, "-m", "bench.data_training", "--child", *args]
    done = subprocess.run(
        command, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT
    )
    if done.returncode:
        raise RuntimeError(f"bench.data_training child failed:\n{done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def training_measures(
    pairs: int, tsv: Path, prepared: Path, tokenizer_path: Path, work: Path, *, speed: bool = True
) -> dict[str, Any]:
    """The training columns of `bench.data` at one size (``tsv`` is not read: training reads the
    prepared folder)."""
    folder = work / f"train-{pairs}"
    folder.mkdir(parents=True, exist_ok=True)
    row = zoo_train(write_config(folder, prepared, tokenizer_path, steps=RSS_STEPS, name="rss"))
    if speed:
        config = write_config(folder, prepared, tokenizer_path, steps=SPEED_SKIP + SPEED_STEPS, name="speed")
        speeds = run_child("speed", str(config))
        row |= speeds | {"shards_vs_memory": speeds["shards_tokens_s"] / speeds["memory_tokens_s"]}
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.data_training", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--pairs", type=int)
    parser.add_argument("--prepared", type=Path)
    parser.add_argument("--tokenizer", type=Path)
    parser.add_argument("--work", type=Path, default=ROOT / "runs" / "bench-data" / "work")
    parser.add_argument("--no-speed", action="store_true", help="memory and start-up only")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        name, *rest = args.child
        assert name == "speed"
        print(json.dumps(child_speed(Path(rest[0]))))
        return 0
    row = training_measures(
        args.pairs, Path(), args.prepared, args.tokenizer, args.work, speed=not args.no_speed
    )
    print(json.dumps({"pairs": args.pairs, **row}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
