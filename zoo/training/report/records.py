"""What a run reports: metric records, the callbacks that receive them, ``run.json``, the result.

Every record has the standard keys (`METRIC_KEYS`), None where a value was not measured at that step: a
training record has ``loss`` (the training objective per target token, label smoothing included),
``lr`` and ``tokens_per_s`` (real source + target tokens over all processes); a validation record has
``val_loss`` (plain NLL per token), ``val_ppl`` and, for translation, ``val_bleu``. A ``precision: fp16``
run's training records add `SCALING_KEYS`: ``loss_scale`` (the loss scale after the record's step) and
``skipped_steps`` (optimizer steps skipped since the previous record because the gradients overflowed;
`zoo.training.precision`). After them come any keys user code added (a callback's ``record["grad_norm"] = ...``, or ``trainer.log_metrics(...)``), in
the order they were first given.

``run.json`` says what the numbers mean, once per run rather than on every line: the task and the label
smoothing in ``loss`` (``loss_label_smoothing``), which `zoo plot training` uses to label its curves; the
parameter counts (``parameters``: trainable and total), the model it started from (``init_from``) and a
LoRA run's ``lora`` spec.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zoo.io.atomic import write_text_atomic
from zoo.io.names import RUN_INFO_NAME
from zoo.io.tokenizer import Tokenizer
from zoo.models.base import ZooModel
from zoo.spec import LoraSpec
from zoo.training.objectives import Objective, TokenCrossEntropy
from zoo.training.run.rundir import writing
from zoo.training.run.state import TrainerState

METRIC_KEYS = ("step", "loss", "lr", "tokens_per_s", "val_loss", "val_ppl", "val_bleu", "elapsed_s")
SCALING_KEYS = ("loss_scale", "skipped_steps")  # fp16 training records only; measured by the trainer too
TRAINER_KEYS = METRIC_KEYS + SCALING_KEYS
HOOKS = ("on_train_start", "on_log", "on_eval", "on_checkpoint", "on_train_end")


class Callback:
    """Hooks the loop calls on rank 0, each with a `TrainerState` snapshot (step, total_steps, epoch,
    elapsed_s, lr, grad_norm, output_dir, ...). Subclass and override what you need, or pass any object
    that has some of these methods (the loop calls only the ones it finds).

    ``on_log`` and ``on_eval`` get the record before it is written: a key added to it is written with it,
    to ``metrics.jsonl`` and every sink::

        class History(Callback):
            def __init__(self) -> None:
                self.records = []

            def on_log(self, state, record):
                record["grad_norm"] = state.grad_norm  # a custom key, written with the record
                self.records.append(record)

        train(config, callbacks=[History()])
    """

    def on_train_start(self, state: TrainerState) -> None: ...
    def on_log(self, state: TrainerState, record: dict[str, Any]) -> None: ...
    def on_eval(self, state: TrainerState, record: dict[str, Any]) -> None: ...
    def on_checkpoint(self, state: TrainerState, path: Path) -> None: ...
    def on_train_end(self, state: TrainerState, result: TrainResult) -> None: ...


def check_callbacks(callbacks: Iterable[Any]) -> list[Any]:
    """The callbacks as a list; a TypeError for something that is not one (a class, ``...``, a typo'd
    object), and a warning for ``on_*`` methods the loop never calls (another library's hook names)."""
    checked = []
    for i, callback in enumerate(callbacks):
        name = getattr(callback, "__name__", None) or type(callback).__name__
        if isinstance(callback, type):
            raise TypeError(f"callbacks[{i}] is the class {name}, not an instance: pass {name}()")
        if not any(callable(getattr(callback, hook, None)) for hook in HOOKS):
            raise TypeError(
                f"callbacks[{i}] ({callback!r}) has none of the hooks {', '.join(HOOKS)}: "
                "subclass zoo.training.Callback, or give it some of those methods"
            )
        unknown = sorted(
            attr
            for attr in dir(callback)
            if attr.startswith("on_") and attr not in HOOKS and callable(getattr(callback, attr, None))
        )
        if unknown:
            warnings.warn(
                f"callbacks[{i}] ({name}) defines {', '.join(unknown)}, which the training loop never "
                f"calls; its hooks are {', '.join(HOOKS)}",
                stacklevel=3,
            )
        checked.append(callback)
    return checked


@dataclass
class TrainResult:
    model: ZooModel  # the trained model (sharded in place under FSDP)
    tokenizer: Tokenizer | None  # the target (or shared) tokenizer; None for a task that reads no text
    source_tokenizer: Tokenizer | None
    output_dir: Path
    step: int
    final: dict[str, Any] = field(default_factory=dict)  # the last validation record


def make_record(step: int, elapsed_s: float, **values: Any) -> dict[str, Any]:
    """The standard keys (None unless given), then any extra keys; values must be numbers, strings or None."""
    plain = {key: metric_value(key, value) for key, value in values.items()}
    return dict.fromkeys(METRIC_KEYS) | plain | {"step": step, "elapsed_s": round(elapsed_s, 3)}


def metric_value(key: str, value: Any) -> Any:
    """``value`` as JSON can hold it: a 1-element tensor or numpy scalar becomes its Python number."""
    if not isinstance(key, str) or not key:
        raise ValueError(f"metric names must be non-empty strings, got {key!r}")
    if hasattr(value, "item") and not isinstance(value, str):
        value = value.item()  # torch / numpy scalars; a tensor of several values raises here
    if value is None or isinstance(value, bool | int | float | str):
        return value
    raise TypeError(f"metric {key!r}: {type(value).__name__} is not a number, string or None")


def check_custom_metrics(values: dict[str, Any]) -> dict[str, Any]:
    """``values`` as plain metric values; a ValueError for a key the trainer measures (`TRAINER_KEYS`)."""
    taken = sorted(set(values) & set(TRAINER_KEYS))
    if taken:
        raise ValueError(f"{', '.join(taken)}: standard metric(s) the trainer measures; use another name")
    return {key: metric_value(key, value) for key, value in values.items()}


def settle_record(record: dict[str, Any], standard: dict[str, Any]) -> None:
    """After the callbacks: the keys they added become plain values (in place, so a callback that kept the
    record sees what is written); the standard keys must still hold what the trainer measured."""
    altered = [key for key, value in standard.items() if key not in record or record[key] is not value]
    if altered:
        raise ValueError(
            f"{', '.join(altered)}: standard metric(s) the trainer measures; a callback may add keys to a "
            "record, not change or remove these"
        )
    for key, value in record.items():
        if key not in standard:
            record[key] = metric_value(key, value)


def write_run_info(
    output_dir: Path,
    *,
    task: str,
    label_smoothing: float,
    parameters: tuple[int, int] | None = None,
    lora: LoraSpec | None = None,
    init_from: Path | None = None,
    objective: Objective | None = None,
) -> None:
    """``run.json``: what this run's losses are, for readers of ``metrics.jsonl`` (and its plot), and what
    it trains: ``parameters`` (trainable, total) and a LoRA run's spec and base. ``objective``: the task's
    (`zoo.training.objectives`), which describes its losses (default: token cross-entropy)."""
    if objective is None:
        objective = TokenCrossEntropy(label_smoothing=label_smoothing)
    info: dict[str, Any] = {
        "task": task,
        "loss_label_smoothing": label_smoothing,
        "loss": objective.description,
        "val_loss": objective.validation_description,
    }
    if objective.loss_name:  # `zoo plot training` names the curves by it
        info["loss_name"] = objective.loss_name
    if parameters is not None:
        info["parameters"] = {"trainable": parameters[0], "total": parameters[1]}
    if lora is not None:
        info["lora"] = lora.model_dump(mode="json")
    if init_from is not None:
        info["init_from"] = str(init_from)
    with writing(output_dir / RUN_INFO_NAME):
        write_text_atomic(output_dir / RUN_INFO_NAME, json.dumps(info, indent=2) + "\n")
