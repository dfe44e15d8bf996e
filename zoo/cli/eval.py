"""``zoo eval``: lm-evaluation-harness tasks on a model, a table of the scores, and lm-eval's JSON.

    zoo eval runs/gpt/final --tasks hellaswag,arc_easy --batch-size 16
    zoo eval runs/gpt/final --tasks my_task --include-path tasks/ --limit 100 --output results.json

A thin layer over `zoo.evaluation.evaluate` (the model is a zoo checkpoint or a Hugging Face folder, with
its tokenizer). The table lists every metric of every task (and group): value and standard error. With
``--output`` the whole results dictionary lm-eval returns is written as JSON, atomically; an existing file
is refused unless ``--overwrite``, before the model loads. lm-eval is the ``eval`` extra; without it the
command says so in one line.
"""

from __future__ import annotations

import argparse
import logging
import math
from pathlib import Path
from typing import Any

from zoo.cli.options import add_device_option, add_dtype_option, non_negative_int, parse_seed, positive_int


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "eval",
        help="score a model on lm-evaluation-harness tasks (hellaswag, arc, your own YAML tasks...)",
        description="Run lm-evaluation-harness tasks on a zoo checkpoint or a Hugging Face folder and print "
        "each metric with its standard error. Needs the eval extra: pip install -e '.[eval]'.",
    )
    parser.add_argument(
        "model", metavar="MODEL", help="a zoo checkpoint or Hugging Face folder, with tokenizer"
    )
    parser.add_argument(
        "--tasks", required=True, metavar="T1,T2", help="lm-eval task, group or tag names, joined by commas"
    )
    parser.add_argument(
        "--include-path",
        action="append",
        default=None,
        metavar="DIR",
        help="a folder of task YAML files of your own (may be given more than once)",
    )
    parser.add_argument(
        "--num-fewshot",
        type=non_negative_int,
        default=None,
        metavar="N",
        help="examples before each question",
    )
    parser.add_argument(
        "--limit", type=_limit, default=None, metavar="N", help="documents per task (a fraction when < 1)"
    )
    parser.add_argument(
        "--batch-size", type=positive_int, default=1, metavar="N", help="rows per forward pass (default: 1)"
    )
    add_device_option(parser)
    add_dtype_option(parser, default=None, help="cast the weights (default: as saved)")
    parser.add_argument("--seed", type=parse_seed, default=None, help="seed every generator lm-eval seeds")
    parser.add_argument(
        "--bootstrap-iters",
        type=non_negative_int,
        default=100_000,
        metavar="N",
        help="resamples for standard errors without a closed form (default: 100000; 0: none)",
    )
    parser.add_argument(
        "--apply-chat-template",
        action="store_true",
        help="ask through the tokenizer's chat template, as an instruction-tuned model is asked",
    )
    parser.add_argument(
        "--fewshot-as-multiturn",
        action="store_true",
        help="with --apply-chat-template: the few-shot examples as earlier turns of the chat",
    )
    parser.add_argument("--system-instruction", metavar="TEXT", default=None, help="a system message first")
    parser.add_argument("--output", metavar="FILE.json", default=None, help="write lm-eval's results as JSON")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --output file")
    parser.add_argument(
        "--log-samples", action="store_true", help="put every request and response in the --output JSON"
    )
    parser.set_defaults(run=run_eval)


def run_eval(args: argparse.Namespace) -> int:
    from zoo.cli.tables import Column, print_table
    from zoo.evaluation import evaluate, result_rows, results_json
    from zoo.io.atomic import write_text_atomic

    if args.log_samples and args.output is None:
        raise ValueError("--log-samples: the samples go into the --output JSON; give --output FILE.json")
    out = _check_output(Path(args.output).expanduser(), overwrite=args.overwrite) if args.output else None
    logging.getLogger("lm_eval").setLevel(logging.ERROR)  # its per-task notes on default metric settings
    results = evaluate(
        args.model,
        tasks=args.tasks,
        include_path=args.include_path,
        num_fewshot=args.num_fewshot,
        limit=args.limit,
        batch_size=args.batch_size,
        device=args.device,
        dtype=args.dtype,
        seed=args.seed,
        bootstrap_iters=args.bootstrap_iters,
        log_samples=args.log_samples,
        apply_chat_template=args.apply_chat_template,
        fewshot_as_multiturn=args.fewshot_as_multiturn,
        system_instruction=args.system_instruction,
    )
    columns = [
        Column("task", whole=True),
        Column("metric", whole=True),
        Column("value", whole=True, right=True),
        Column("stderr", whole=True, right=True),
    ]
    rows = [
        [task, metric, _number(value), "–" if stderr is None else f"± {stderr:.4f}"]
        for task, metric, value, stderr in result_rows(results)
    ]
    print_table(columns, rows, title=f"zoo eval {Path(args.model).name}")
    if out is not None:
        write_text_atomic(out, results_json(results))
        from zoo.cli import console

        console.out(f"wrote {out}", highlight=False)
    return 0


def _number(value: Any) -> str:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return f"{value:.4f}" if math.isfinite(value) else str(value)
    return str(value)


def _check_output(out: Path, *, overwrite: bool) -> Path:
    """``--output``: a ``.json`` path whose folder exists; an existing file only with ``--overwrite``."""
    from zoo.io.outputs import OutputExistsError

    if out.suffix != ".json":
        raise ValueError(f"--output {out}: expected a .json file name (lm-eval's results are JSON)")
    if out.is_dir():
        raise IsADirectoryError(f"--output {out}: a folder; give the .json file to write")
    if out.exists() and not overwrite:
        raise OutputExistsError(f"{out} already exists: choose another file, or replace it (--overwrite)")
    if not out.parent.is_dir():
        raise FileNotFoundError(f"--output {out}: the folder {out.parent} does not exist")
    return out


def _limit(text: str) -> int | float:
    """``--limit``: a count of documents (>= 1) or a fraction of them (0 < x < 1)."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"invalid limit {text!r} (expected a count >= 1 or a fraction < 1)")
    return value if value < 1 else int(value)
