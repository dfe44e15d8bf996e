"""``zoo show NAME|SPEC_FILE|DIR``: the module tree with parameter counts, and cost estimates.

A preset or spec is built on the meta device (instant, no memory); a zoo checkpoint directory is read for
its spec.json only, a Hugging Face folder for its config.json and the weights' headers (see
`zoo.cli.options.load_target_spec`). ``--json`` prints the same as JSON
(`zoo.analysis.ModelSummary.to_dict`). Names, sources and notes come from files: they are printed through
`zoo.cli.sanitize` (JSON escapes control characters itself).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from zoo.cli.options import add_dtype_option
from zoo.cli.sanitize import markup


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "show",
        help="a model's tree, parameter counts (a dual encoder's by tower), FLOPs, training memory and KV-cache size",
    )
    parser.add_argument(
        "target",
        metavar="NAME|SPEC_FILE|DIR",
        help="preset, spec file, zoo checkpoint or Hugging Face folder",
    )
    parser.add_argument(
        "--seq-len",
        type=int,
        default=None,
        help="sequence length (default: max_positions; an image model: one image's tokens)",
    )
    parser.add_argument("--batch", type=int, default=1, help="batch size of a training step (default: 1)")
    add_dtype_option(parser, default="float32", help="the dtype the estimates assume (default: float32)")
    parser.add_argument("--depth", type=int, default=None, help="show the tree this many levels deep")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a tree and tables")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import zoo
    from zoo.cli.options import load_target_spec

    spec = load_target_spec(args.target)
    result = zoo.summary(spec, seq_len=args.seq_len, batch=args.batch, dtype=args.dtype)
    quantization = _quantization(args.target)
    if args.json:
        extra = {"quantization": quantization.to_dict()} if quantization else {}
        print(json.dumps(result.to_dict() | extra, indent=2))
        return 0
    render(result, title=result.name or str(args.target), depth=args.depth)
    if quantization is not None:
        from zoo.cli import console

        console.print(
            f"[yellow]quantised:[/] {markup(quantization.describe())}; the estimates above assume "
            f"{args.dtype} weights"
        )
    return 0


def _quantization(target: str) -> Any:
    """zoo.quant's record of a zoo checkpoint's weights (read from its header), or None."""
    from pathlib import Path

    from zoo.io.checkpoint import CheckpointError, open_checkpoint

    path = Path(target).expanduser()
    if not path.exists():
        return None  # a preset or a Hub id: no weights to tell about
    try:
        return open_checkpoint(path).quantization
    except CheckpointError:  # a spec file, a Hugging Face folder: not zoo's weights
        return None


def render(s: Any, *, title: str, depth: int | None = None) -> None:
    """Print a `ModelSummary`: header, tree, parameters, estimates, notes and assumptions."""
    from rich.table import Table
    from rich.tree import Tree

    from zoo.cli import console

    console.print(
        f"[bold]{markup(title)}[/] ({markup(s.family)})"
        + (f"  [dim]{markup(s.source)}[/]" if s.source else "")
    )
    tree = Tree(_label(s.tree, title))
    _grow(tree, s.tree, depth=depth)
    console.print(tree)

    p = s.parameters
    params = Table(title="parameters", show_header=False)
    params.add_column("what")
    params.add_column("count", justify="right")
    rows = [
        ("total (distinct tensors)", p.total),
        ("trainable", p.trainable),
        ("embedding tables (lookups)", p.embedding),
        ("body (non-embedding: the stacks' matmuls and norms)", p.body),
        ("heads (own output matrix, MLM head, pooler, classifier)", p.head),
    ]
    if p.tied:
        rows.append(("tied: embedding reused as output matrix (counted once)", p.tied))
    if p.active != p.total:
        rows.append(("active per token (Mixture-of-Experts: top_k of the experts)", p.active))
    if p.body_as_run != p.body:
        rows.append(("body as run (shared layers once per run)", p.body_as_run))
    for what, count in rows:
        params.add_row(what, f"{count:,}")
    console.print(params)
    if s.parts:  # a dual encoder: both towers and the heads between them
        parts = [(part.name, f"{part.params:,}", part.detail) for part in s.parts]
        console.print(_estimates_table(parts, title="parts (they sum to the total)"))

    states = s.training_states
    f = s.flops
    extra = f" + fp32 master {binary(states.master_weights)}" if states.master_weights else ""
    estimates = [
        (
            "forward FLOPs / token",
            si(f.forward),
            f"dense {si(f.dense)} + attention {si(f.attention)} + head {si(f.head)}",
        ),
        ("training FLOPs / token", si(f.training), "3 × forward"),
        ("training FLOPs / step", si(s.training_flops_per_step), f"× {s.batch} × {s.seq_len} tokens"),
        ("weights", binary(states.weights), f"{p.total:,} × {s.dtype_bytes} bytes"),
        (
            "weights + gradients + Adam",
            binary(states.total),
            f"grads {binary(states.gradients)} + 2 fp32 moments {binary(states.optimizer)}{extra}",
        ),
        (
            "activations / step",
            binary(s.activations),
            f"of which attention matrices {binary(s.attention_matrices)} (not kept by fused SDPA kernels)",
        ),
        ("training step total", binary(s.training_step_bytes), "states + activations"),
    ]
    if s.kv_cache_per_token:  # a model that does not generate (an encoder, a dual encoder) caches nothing
        estimates.append(
            (
                "KV cache / token",
                binary(s.kv_cache_per_token),
                "2 × layers × kv heads × head dim × bytes (latent attention: layers × (latent + rope) × bytes)",
            )
        )
    if s.cross_kv_cache_per_source_token:
        estimates.append(
            ("cross KV cache / source token", binary(s.cross_kv_cache_per_source_token), "once per source")
        )
    console.print(
        _estimates_table(estimates, title=f"estimates at seq_len {s.seq_len}, batch {s.batch}, {s.dtype}")
    )
    for note in s.notes:
        _print_item("note: ", note, style="yellow")
    console.print("[dim]assumptions:[/]")
    for assumption in s.assumptions:
        _print_item("  - ", assumption, style="dim")


# Narrower than this, an estimate's explanation goes under its name instead of in a column of its own.
_HOW_MIN_WIDTH = 30


def _estimates_table(rows: list[tuple[str, str, str]], *, title: str) -> Any:
    """The estimates (or a dual encoder's parts): what (never wrapped), value, how. On a console too narrow for a readable third column,
    two columns: the how under the what, dim, wrapped at spaces."""
    from rich.table import Table

    from zoo.cli import console

    table = Table(title=title, show_header=False)
    whats = max(len(what) for what, _, _ in rows)
    values = max(len(value) for _, value, _ in rows)
    three = console.width >= whats + values + _HOW_MIN_WIDTH + 10  # 10: the borders and padding
    table.add_column("what", no_wrap=three)
    table.add_column("value", justify="right", no_wrap=True)
    if three:
        table.add_column("how", style="dim")
    for what, value, how in rows:
        if three:
            table.add_row(markup(what), value, markup(how))
        else:
            table.add_row(f"{markup(what)}\n[dim]{markup(how)}[/]", value)
    return table


def _print_item(lead: str, text: str, *, style: str) -> None:
    """``lead`` + ``text`` wrapped at spaces to the console's width, later lines indented under the text."""
    import textwrap

    from zoo.cli import console

    width = max(console.width - 1, len(lead) + 20)
    lines = textwrap.wrap(
        text, width, initial_indent=lead, subsequent_indent=" " * len(lead), break_on_hyphens=False
    )
    for line in lines:
        console.print(line, style=style, markup=False, highlight=False)


def _label(node: Any, root_title: str | None = None) -> str:
    name = root_title if root_title is not None else node.name
    text = f"[bold]{markup(name)}[/] [cyan]{markup(node.kind)}[/]"
    if node.detail:
        text += f" [dim]{markup(node.detail)}[/]"
    if node.params:
        text += f"  [green]{node.params:,}[/]"
        if node.copies > 1:
            text += f" [green]({node.params // node.copies:,} each)[/]"
    if node.runs > node.copies:
        text += f" [yellow]run ×{node.runs}[/]"
    elif node.copies > 1:
        text += f" [yellow]×{node.copies}[/]"
    return text


def _grow(branch: Any, node: Any, *, depth: int | None) -> None:
    if depth is not None and depth <= 0:
        return
    for child in node.children:
        _grow(branch.add(_label(child)), child, depth=None if depth is None else depth - 1)


def si(value: float) -> str:
    """1234567 -> '1.23 M' (FLOPs)."""
    for unit, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.2f} {unit}"
    return f"{value:.0f}"


def binary(value: float) -> str:
    """Bytes in binary units: 1536 -> '1.50 KiB'."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(value) >= scale:
            return f"{value / scale:.2f} {unit}"
    return f"{value:.0f} B"
