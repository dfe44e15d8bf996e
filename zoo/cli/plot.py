"""``zoo plot KIND ...``: attention heatmaps, masks, sinusoidal positions, the lr schedule, training curves.

Every plot is a PNG written to ``--out`` (a default name otherwise); the command prints where it wrote.
Needs matplotlib (the ``viz`` extra).
"""

from __future__ import annotations

import argparse
import re
import warnings
from collections.abc import Callable
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("plot", help="plots: attention, masks, positions, schedule, training")
    kinds = parser.add_subparsers(dest="kind", metavar="KIND", required=True)

    def kind(name: str, help: str, run: Callable[[argparse.Namespace], Path], default_out: str | None):
        sub = kinds.add_parser(name, help=help, description=help)
        sub.add_argument("--out", default=default_out, help=f"PNG file to write (default: {default_out})")
        sub.add_argument("--dpi", type=int, default=100, help="pixels per inch (default: 100)")
        sub.set_defaults(run=_runner(run))
        return sub

    sub = kind(
        "attention", "attention heatmaps per layer and head of a saved model", _attention, "attention.png"
    )
    sub.add_argument("checkpoint", metavar="DIR", help="a saved model with its tokenizer (zoo.save)")
    sub.add_argument("source", help="the source sentence")
    sub.add_argument("--target", help="teacher-force this target (default: generate one greedily)")
    sub.add_argument("--max-new-tokens", type=int, default=32, help="length limit when generating")

    sub = kind("masks", "encoder, decoder and cross masks of a padded example batch", _masks, None)
    sub.add_argument(
        "preset", metavar="PRESET", help="preset, spec file, zoo checkpoint or Hugging Face folder"
    )

    sub = kind("positions", "the sinusoidal position table as a heatmap", _positions, "positions.png")
    sub.add_argument("--d-model", type=int, default=128, help="table width (default: 128)")
    sub.add_argument("--length", type=int, default=50, help="positions (default: 50)")
    sub.add_argument("--layout", choices=("interleaved", "half"), default="interleaved")

    sub = kind("schedule", "the learning-rate schedule of the paper (noam)", _schedule, "schedule.png")
    sub.add_argument("--d-model", type=int, default=512, help="model width (default: 512)")
    sub.add_argument("--warmup", type=int, default=4000, help="warmup steps (default: 4000)")
    sub.add_argument("--steps", type=int, default=None, help="steps to draw (default: 5 × warmup)")
    sub.add_argument("--scale", type=float, default=1.0, help="multiplier on the rate (default: 1)")

    sub = kind("training", "loss, lr, BLEU and throughput curves of a run", _training, None)
    sub.add_argument("run_dir", metavar="RUN", help="a run folder with metrics.jsonl (or the file itself)")


def _runner(plot: Callable[[argparse.Namespace], Path]) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        from zoo.cli import console, err_console
        from zoo.cli.errors import writing
        from zoo.cli.sanitize import markup
        from zoo.viz.backend import VizDependencyError, require_matplotlib

        try:  # before loading anything: a missing extra is the first thing to hear about
            require_matplotlib()
        except VizDependencyError as error:
            err_console.print(f"[bold red]error:[/] {markup(error)}")  # escaped: '[viz]' is not markup
            return 2
        with warnings.catch_warnings(record=True) as caught, writing(args.out or f"the {args.kind} plot"):
            warnings.simplefilter("always")
            path = plot(args)
        for warning in caught:
            err_console.print(f"[yellow]warning:[/] {markup(warning.message)}")
        console.print(f"wrote {markup(path)}", highlight=False)
        return 0

    return run


def _attention(args: argparse.Namespace) -> Path:
    import zoo
    from zoo.viz import attention_maps, plot_attention

    model, tokenizer = zoo.load(args.checkpoint), zoo.load_tokenizer(args.checkpoint)
    maps = attention_maps(
        model, tokenizer, args.source, target=args.target, max_new_tokens=args.max_new_tokens
    )
    return plot_attention(maps, args.out, dpi=args.dpi)


def _masks(args: argparse.Namespace) -> Path:
    from zoo.cli.options import load_target_spec
    from zoo.cli.sanitize import clean
    from zoo.viz import example_masks, plot_masks

    spec = load_target_spec(args.preset)
    name = clean(spec.name or Path(args.preset).stem)
    title = f"{name} ({spec.family}): who may attend to whom in a padded batch (blue = may attend)"
    # The default file name comes from the spec, a file: only name characters, no path separators.
    default = "masks-" + re.sub(r"[^\w.-]+", "_", name).lstrip(".") + ".png"
    return plot_masks(example_masks(spec), args.out or default, title=title, dpi=args.dpi)


def _positions(args: argparse.Namespace) -> Path:
    from zoo.blocks.position import sinusoidal_table
    from zoo.viz import plot_positions

    if args.d_model < 2 or args.d_model % 2 or args.length < 1:
        raise ValueError(f"--d-model ({args.d_model}) must be even and --length ({args.length}) positive")
    table = sinusoidal_table(args.length, args.d_model, layout=args.layout).numpy()
    title = f"sinusoidal positions, {args.layout} layout ({args.length} positions × d_model {args.d_model})"
    return plot_positions(table, args.out, title=title, dpi=args.dpi)


def _schedule(args: argparse.Namespace) -> Path:
    from zoo.viz import plot_schedule, schedule_curve

    if args.d_model < 1 or args.warmup < 1:
        raise ValueError(f"--d-model ({args.d_model}) and --warmup ({args.warmup}) must be positive")
    steps = args.steps or 5 * args.warmup
    rates = schedule_curve(d_model=args.d_model, warmup=args.warmup, steps=steps, scale=args.scale)
    title = f"lr = {args.scale:g} · d_model^-0.5 · min(step^-0.5, step · warmup^-1.5), d_model {args.d_model}"
    return plot_schedule(rates, args.out, warmup=args.warmup, title=title, dpi=args.dpi)


def _training(args: argparse.Namespace) -> Path:
    from zoo.viz import plot_training, read_metrics

    metrics = read_metrics(args.run_dir)
    if metrics.skipped:
        warnings.warn(f"{metrics.source}: skipped {metrics.skipped} unreadable line(s)", stacklevel=1)
    return plot_training(metrics, args.out or metrics.source.parent / "training.png", dpi=args.dpi)
