"""``zoo train CONFIG``: run a training config (one process, or each process under torchrun).

    zoo train examples/translate.yaml
    zoo train examples/translate.yaml --set batch.max_tokens=2048 --set schedule.warmup_steps=800
    zoo train examples/translate.yaml --resume            # continue from the latest checkpoint
    torchrun --nproc-per-node 2 -m zoo train examples/translate.yaml
    zoo train examples/translate.yaml --no-progress > train.log   # validation lines only
    zoo train examples/classify.yaml --init-from hf/bert-base-uncased   # fine-tune a trained model
    zoo train examples/finetune_lora.yaml --set lora.r=16     # LoRA adapters on runs/demo (its lora section)

Ctrl-C (SIGINT) or a scheduler's SIGTERM lets the step under way finish, keeps a checkpoint of it, prints the
command that continues the run and exits with 130 (SIGINT) or 143 (SIGTERM); a second Ctrl-C stops at once.
A loss that is no longer finite stops the run with one line naming the step (`zoo.training.stopping`).

Only rank 0 draws and prints. The bar is the library's (`zoo.training.report.progress`), drawn on stdout when
stdout is a terminal; otherwise (a log file, a pipe) validation results and checkpoints come as lines.
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import sys
from pathlib import Path
from typing import Any

import yaml

from zoo.cli import kinds
from zoo.cli.errors import writing
from zoo.cli.options import add_device_option
from zoo.cli.sanitize import clean, markup
from zoo.spec.files import load_yaml
from zoo.training.report.progress import ProgressBar, ProgressLines, RunHeader, wants_progress


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
    parser.add_argument(
        "--init-from",
        type=Path,
        metavar="MODEL_DIR",
        help="start from a trained model instead of the config's: a zoo model folder (spec.json) or a "
        "Hugging Face one (config.json + safetensors); its tokenizer.json too, unless tokenizer.path is set",
    )
    add_device_option(parser, default=None, default_help="the config's device: shortcut for --set device=")
    parser.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress bar (validation results still print); default: a bar when stdout is a terminal",
    )
    parser.set_defaults(run=run)


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """``["a.b=1", "c=[1, 2]"]`` -> ``{"a.b": 1, "c": [1, 2]}``; values are parsed as YAML.

    A value that is not YAML (``a=[b``) is a ValueError naming the ``--set`` and what YAML expected.
    """
    overrides = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--set expects KEY=VALUE, got {item!r}")
        try:
            overrides[key.strip()] = load_yaml(value)  # bounded: no alias bombs from a command line
        except yaml.YAMLError as error:
            raise ValueError(
                f"--set {item!r}: the value is not valid YAML ({_yaml_problem(error)})"
            ) from None
    return overrides


def _yaml_problem(error: yaml.YAMLError) -> str:
    """PyYAML's complaint without its multi-line excerpt: "expected ',' or ']', but got '<stream end>'"."""
    if isinstance(error, yaml.MarkedYAMLError):
        problem = error.problem or error.context or "unparsable"
        mark = error.problem_mark
        return f"{problem} at column {mark.column + 1}" if mark is not None else problem
    return str(error).splitlines()[0] if str(error) else type(error).__name__


def is_main_process() -> bool:
    return os.environ.get("RANK", "0") == "0"


def setup_logging() -> None:
    """Warnings from the library (truncated data, resume notes) through rich, on rank 0 only."""
    from rich.logging import RichHandler

    from zoo.cli import err_console

    logger = logging.getLogger("zoo")
    if is_main_process() and not any(isinstance(h, RichHandler) for h in logger.handlers):
        handler = RichHandler(console=err_console, show_path=False, show_time=False)
        handler.addFilter(_clean_record)  # warnings quote data files: no escape sequences to the terminal
        logger.addHandler(handler)
    logger.setLevel(logging.WARNING if is_main_process() else logging.ERROR)


def _clean_record(record: logging.LogRecord) -> bool:
    """A logging filter that strips terminal controls from the message (`zoo.cli.sanitize.clean`)."""
    record.msg, record.args = clean(record.getMessage()), None
    return True


class ResumedLine:
    """Says which step a resumed run continues from, once training starts."""

    def __init__(self, console: Any) -> None:
        self.console = console

    def on_train_start(self, state: Any) -> None:
        self.console.print(f"resumed from step {state.step} of {state.total_steps}", highlight=False)


def _report_interrupt(stop: Any, args: argparse.Namespace) -> None:
    """What the interrupt kept and the command that continues the run (on stderr, beside errors)."""
    from zoo.cli import err_console

    if stop.checkpoint is None:
        err_console.print(f"interrupted again ({stop.signal_name}): stopped at once", highlight=False)
        return
    err_console.print(
        f"interrupted ({stop.signal_name}): kept step {stop.step} in {markup(stop.checkpoint)}",
        highlight=False,
        soft_wrap=True,
    )
    err_console.print(f"continue with: {markup(resume_command(args))}", highlight=False, soft_wrap=True)


def resume_command(args: argparse.Namespace) -> str:
    """The ``zoo train`` command that continues the run ``args`` started: the same config, overrides and
    options, ``--resume`` instead of ``--overwrite`` or a ``--resume CHECKPOINT``."""
    words = ["zoo", "train", str(args.config)]
    for item in args.overrides:
        words += ["--set", item]
    for option, value in (
        ("--max-steps", args.max_steps),
        ("--output-dir", args.output_dir),
        ("--init-from", args.init_from),
        ("--device", args.device),
    ):
        if value is not None:
            words += [option, str(value)]
    if args.no_progress:
        words.append("--no-progress")
    return shlex.join([*words, "--resume"])


# The bar moved to the library (zoo.training.report.progress); its old name here stays for existing callers.
ProgressCallback = ProgressBar


def run(args: argparse.Namespace) -> int:
    from zoo.cli import console
    from zoo.training import TrainConfig, train
    from zoo.training.run.rundir import cli_options
    from zoo.training.stopping import TrainingInterrupted

    setup_logging()
    overrides = parse_overrides(args.overrides)
    for key, value in (
        ("max_steps", args.max_steps),
        ("output_dir", args.output_dir),
        ("device", args.device),
    ):
        if value is not None:
            overrides[key] = value
    # --init-from replaces the config's model source (keeping its overrides) before the config is checked,
    # so a config with a lora section may leave model.init_from to the command line.
    with kinds.expecting(args.config, kinds.TRAIN_CONFIG, expected="a training config"):  # a spec, a run...
        config = TrainConfig.from_yaml(args.config, init_from=args.init_from, **overrides)
    # The CLI reports on stdout, bar and lines alike, so `zoo train ... > log` keeps the validation lines.
    progress: ProgressBar | bool
    callbacks: list[Any]
    if not args.no_progress and wants_progress("auto", stream=sys.stdout):
        progress, callbacks = ProgressBar(console, header=RunHeader.of(config)), []
    else:
        # a log or a pipe: a line every log_every steps (--no-progress: the header and validation lines only)
        lines = ProgressLines(console, header=RunHeader.of(config), steps=not args.no_progress)
        progress, callbacks = False, [lines]
    if args.resume and is_main_process():
        callbacks.append(ResumedLine(console))
    try:
        with writing(config.output_dir), cli_options():  # messages name --resume, not resume=True
            result = train(
                config, callbacks=callbacks, progress=progress, resume=args.resume, overwrite=args.overwrite
            )
    except TrainingInterrupted as stop:
        if is_main_process():
            _report_interrupt(stop, args)
        return stop.exit_code
    if is_main_process():
        saved = "model and tokenizer" if result.tokenizer is not None else "model"  # images: no tokenizer
        console.print(f"trained {result.step} steps; {saved} saved to [bold]{markup(result.output_dir)}[/]")
    return 0
