"""Train a config and record the batches each step takes, alone or under torchrun (`test_reshard.py`).

    python -m torch.distributed.run --standalone --nproc-per-node 2 tests/recorded_training.py \
        CONFIG.yaml RECORD.json [CHECKPOINT]

Each process writes ``RECORD.json.rank<r>``: for every step it trained, the indices of its batches in the
epoch's order and their tensors (inputs and targets) as lists. `merged` puts the processes' records back
together as the steps' batches over all processes, in the epoch's order.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from zoo.training import Trainer, TrainResult
from zoo.training.batching import Batch
from zoo.training.config import TrainConfig


def train_recording(config: TrainConfig, record: Path, resume: Path | None = None) -> TrainResult:
    """`zoo.training.train`, writing this process's batches to ``record.rank<r>``."""
    trainer = Trainer(config, progress=False, resume=resume or False)
    steps: list[dict[str, Any]] = []
    take = trainer._next_batches

    def recording() -> tuple[list[Batch], list[int]]:
        batches, indices = take()
        tensors = [
            {**{name: t.tolist() for name, t in b.inputs.items()}, "targets": b.targets.tolist()}
            for b in batches
        ]
        steps.append(
            {"step": trainer.step + 1, "epoch": trainer.order.epoch, "batches": dict(zip(indices, tensors))}
        )
        return batches, indices

    trainer._next_batches = recording  # type: ignore[method-assign]
    try:
        result = trainer.fit()
    finally:
        trainer.close()
    Path(f"{record}.rank{trainer.runtime.rank}").write_text(json.dumps(steps), encoding="utf-8")
    return result


def merged(record: Path) -> dict[int, list[tuple[int, int, Any]]]:
    """Every process's record of ``record``: step -> [(epoch, batch index, tensors)] in the epoch's order."""
    steps: dict[int, list[tuple[int, int, Any]]] = {}
    for file in sorted(record.parent.glob(f"{record.name}.rank*")):
        for step in json.loads(file.read_text(encoding="utf-8")):
            for index, tensors in step["batches"].items():
                steps.setdefault(step["step"], []).append((step["epoch"], int(index), tensors))
    return {step: sorted(batches, key=lambda b: b[:2]) for step, batches in sorted(steps.items())}


if __name__ == "__main__":
    config_path, record_path, *checkpoint = sys.argv[1:]
    train_recording(
        TrainConfig.from_yaml(config_path), Path(record_path), Path(checkpoint[0]) if checkpoint else None
    )
