"""What a run reports: metric records, the callbacks that receive them, ``metrics.jsonl``, the result.

Every record has the same keys (`METRIC_KEYS`), None where a value was not measured at that step: a
training record has ``loss`` (the training objective per target token, label smoothing included),
``lr`` and ``tokens_per_s`` (real source + target tokens over all processes); a validation record has
``val_loss`` (plain NLL per token), ``val_ppl`` and, for translation, ``val_bleu``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zoo.io.tokenizer import Tokenizer
from zoo.models.base import ZooModel

if TYPE_CHECKING:
    from zoo.training.loop import Trainer

METRICS_NAME = "metrics.jsonl"
METRIC_KEYS = ("step", "loss", "lr", "tokens_per_s", "val_loss", "val_ppl", "val_bleu", "elapsed_s")


class Callback:
    """Hooks the loop calls on rank 0; subclass and override what you need."""

    def on_train_start(self, trainer: Trainer) -> None: ...
    def on_log(self, trainer: Trainer, record: dict[str, Any]) -> None: ...
    def on_eval(self, trainer: Trainer, record: dict[str, Any]) -> None: ...
    def on_checkpoint(self, trainer: Trainer, path: Path) -> None: ...
    def on_train_end(self, trainer: Trainer, result: TrainResult) -> None: ...


@dataclass
class TrainResult:
    model: ZooModel  # the trained model (sharded in place under FSDP)
    tokenizer: Tokenizer  # the target (or shared) tokenizer
    source_tokenizer: Tokenizer | None
    output_dir: Path
    step: int
    final: dict[str, Any] = field(default_factory=dict)  # the last validation record


def make_record(step: int, elapsed_s: float, **values: Any) -> dict[str, Any]:
    unknown = set(values) - set(METRIC_KEYS)
    if unknown:
        raise ValueError(f"unknown metric(s) {sorted(unknown)}; records have {METRIC_KEYS}")
    return dict.fromkeys(METRIC_KEYS) | values | {"step": step, "elapsed_s": round(elapsed_s, 3)}


def append_record(output_dir: Path, record: dict[str, Any]) -> None:
    with open(output_dir / METRICS_NAME, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")


def truncate_records(output_dir: Path, *, after: int) -> None:
    """Drop records past ``after``: on resume they belong to steps the run is about to redo."""
    path = output_dir / METRICS_NAME
    if not path.is_file():
        return
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line]
    kept = [line for line in lines if json.loads(line)["step"] <= after]
    path.write_text("".join(f"{line}\n" for line in kept), encoding="utf-8")
