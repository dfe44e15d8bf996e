"""``zoo train CONFIG``: run a training config (one process, or each process under torchrun).

    zoo train examples/translate.yaml
    zoo train examples/translate.yaml --set batch.max_tokens=2048 --set schedule.warmup_steps=800
    zoo train examples/translate.yaml --resume            # continue from the latest checkpoint
    torchrun --nproc-per-node 2 -m zoo train examples/translate.yaml

Only rank 0 draws the progress bar and prints; the library loop reports through callbacks.
"""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path
from typing import Any

import yaml


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("train", help="train a model from a training config (YAML)")
    parser.add_argument("config", type=Path, help="training config file (YAML)")
    parser.add_argument(
        "--resume",
        nargs="?",
        const=True,
        default=False,
        metavar="CHECKPOINT",
        help="continue from the latest checkpoint in the output dir (or from CHECKPOINT)",
    )
    parser.add_argument(
        "--overwrite", action="store_true", help="start over in an output dir that holds a run"
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="change a config field (dotted key, YAML value), e.g. --set optim.clip_grad_norm=null",
    )
    parser.add_argument("--max-steps", type=int, help="shortcut for --set max_steps=N")
    parser.add_argument("--output-dir", help="shortcut for --set output_dir=DIR")
    parser.add_argument("--device", help="shortcut for --set device=DEVICE")
    parser.set_defaults(run=run)


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """``["a.b=1", "c=[1, 2]"]`` -> ``{"a.b": 1, "c": [1, 2]}``; values are parsed as YAML."""
    overrides = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--set expects KEY=VALUE, got {item!r}")
        overrides[key.strip()] = yaml.safe_load(value)
    return overrides


def is_main_process() -> bool:
    return os.environ.get("RANK", "0") == "0"


def setup_logging() -> None:
    """Warnings from the library (truncated data, resume notes) through rich, on rank 0 only."""
    from rich.logging import RichHandler

    from zoo.cli import err_console

    logger = logging.getLogger("zoo")
    if is_main_process() and not any(isinstance(h, RichHandler) for h in logger.handlers):
        logger.addHandler(RichHandler(console=err_console, show_path=False, show_time=False))
    logger.setLevel(logging.WARNING if is_main_process() else logging.ERROR)


class ProgressCallback:
    """A rich progress bar: step, loss, lr, tokens/s, elapsed and ETA; validation and checkpoints as lines."""

    def __init__(self, console: Any) -> None:
        self.console = console
        self.progress: Any = None

    def on_train_start(self, trainer: Any) -> None:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self.progress = Progress(
            TextColumn("[bold]train"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("loss {task.fields[loss]}  lr {task.fields[lr]}  {task.fields[speed]} tok/s"),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            console=self.console,
        )
        self.progress.start()
        self.task = self.progress.add_task(
            "train", total=trainer.total_steps, completed=trainer.step, loss="-", lr="-", speed="-"
        )

    def on_log(self, trainer: Any, record: dict[str, Any]) -> None:
        self.progress.update(
            self.task,
            completed=record["step"],
            loss=f"{record['loss']:.3f}",
            lr=f"{record['lr']:.2e}",
            speed=f"{record['tokens_per_s']:,.0f}",
        )

    def on_eval(self, trainer: Any, record: dict[str, Any]) -> None:
        bleu = f"  BLEU {record['val_bleu']:.1f}" if record["val_bleu"] is not None else ""
        self.console.print(
            f"step {record['step']}: val_loss {record['val_loss']:.3f}  ppl {record['val_ppl']:.2f}{bleu}"
        )

    def on_checkpoint(self, trainer: Any, path: Path) -> None:
        self.console.print(f"[dim]checkpoint {path}[/]")

    def on_train_end(self, trainer: Any, result: Any) -> None:
        if self.progress is not None:
            self.progress.stop()


def run(args: argparse.Namespace) -> int:
    from zoo.cli import console
    from zoo.training import TrainConfig, train

    setup_logging()
    overrides = parse_overrides(args.overrides)
    for key, value in (
        ("max_steps", args.max_steps),
        ("output_dir", args.output_dir),
        ("device", args.device),
    ):
        if value is not None:
            overrides[key] = value
    config = TrainConfig.from_yaml(args.config, **overrides)
    progress = ProgressCallback(console)
    try:
        result = train(config, callbacks=[progress], resume=args.resume, overwrite=args.overwrite)
    finally:
        if progress.progress is not None:
            progress.progress.stop()
    if is_main_process():
        console.print(
            f"trained {result.step} steps; model and tokenizer saved to [bold]{result.output_dir}[/]"
        )
    return 0
