"""``zoo diff A B``: what two specs or presets differ in, field by field (stacks resolved); with
``--weights``, what two checkpoints' tensors differ in too.

A difference in a field that only labels the model (``name``, ``source``: `zoo.analysis.METADATA_FIELDS`) is
printed as a note and does not count: a clean Hugging Face round trip compares equal.
"""

from __future__ import annotations

import argparse
from typing import Any


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "diff",
        help="what two presets, spec files or checkpoints differ in (exit 1 if they differ, as diff(1))",
        description="What two specs differ in, field by field; with --weights, what two checkpoints' "
        "tensors differ in too. Exit status as diff(1): 0 when they are the same, 1 when they differ, "
        "2 on an error. The name and source fields only label a model: a difference there is a note.",
    )
    parser.add_argument("a", metavar="A", help="preset, spec file, zoo checkpoint or Hugging Face folder")
    parser.add_argument("b", metavar="B", help="preset, spec file, zoo checkpoint or Hugging Face folder")
    parser.add_argument(
        "--weights",
        action="store_true",
        help="compare the weights too, tensor by tensor (zoo checkpoints or Hugging Face folders): the "
        "largest absolute difference of each differing tensor, shapes and dtypes that differ, tensors "
        "only one side has",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="print a JSON list of {field, a, b} (a side without the field: no key; metadata: true for a "
        "label) and, with --weights, of {tensor, what, a, b, max_abs_diff}",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from zoo.analysis import diff_specs, is_metadata
    from zoo.analysis.diff import MISSING
    from zoo.cli.options import load_target_spec
    from zoo.cli.sanitize import json_text

    rows = diff_specs(load_target_spec(args.a), load_target_spec(args.b))
    weights = None
    if args.weights:
        from zoo.analysis import diff_weights

        weights = diff_weights(args.a, args.b)
    differs = [row for row in rows if not is_metadata(row[0])]
    # As diff(1), so that scripts can ask "same model?" with `zoo diff A B >/dev/null`.
    status = 1 if differs or (weights is not None and not weights.same) else 0
    if args.json:
        data: list[dict[str, Any]] = [
            {"field": path}
            | ({} if a is MISSING else {"a": a})
            | ({} if b is MISSING else {"b": b})
            | ({"metadata": True} if is_metadata(path) else {})
            for path, a, b in rows
        ]
        if weights is not None:
            data += [
                {"tensor": t.name, "what": t.what, "a": t.a, "b": t.b, "max_abs_diff": t.max_abs_diff}
                for t in weights.tensors
            ]
        print(json_text(data))  # C1 controls escaped too: valid JSON, nothing for a terminal to act on
        return status
    _print_specs(args, rows, differs)
    if weights is not None:
        _print_weights(args, weights)
    return status


def _print_specs(args: argparse.Namespace, rows: list[tuple[str, Any, Any]], differs: list[Any]) -> None:
    from zoo.analysis import is_metadata
    from zoo.analysis.diff import MISSING
    from zoo.cli import console
    from zoo.cli.sanitize import json_text, markup
    from zoo.cli.tables import Column, print_table

    def show(value: object) -> str:
        return "—" if value is MISSING else json_text(value, indent=None)

    if differs:
        print_table(
            [Column("field", whole=True), Column(args.a, fold=True), Column(args.b, fold=True)],
            [(path, show(a), show(b)) for path, a, b in differs],
            title=f"{len(differs)} fields differ (stacks resolved; — = the field does not exist there)",
        )
    for path, a, b in rows:
        if is_metadata(path):  # the values on their own lines, clipped: a source can be a paragraph
            console.print(f"[yellow]note:[/] {markup(path)} differs: a label, never the math; not counted")
            for name, value in ((args.a, a), (args.b, b)):
                line = f"  {name}: {show(value)}"
                room = max(console.width - 1, 20)
                console.print(markup(line if len(line) <= room else line[: room - 1] + "…"), highlight=False)
    if not differs:
        weights = "" if args.weights else " (weights not compared; use --weights)"
        console.print(
            f"{markup(args.a)} and {markup(args.b)}: specs identical, every field, every stack resolved"
            f"{weights}",
            highlight=False,
        )


def _print_weights(args: argparse.Namespace, weights: Any) -> None:
    from zoo.cli import console
    from zoo.cli.tables import Column, print_table

    if weights.same:
        console.print(f"weights identical: {weights.compared:,} tensors, every value equal", highlight=False)
        return

    def gap(value: float | None) -> str:
        return "" if value is None else f"{value:.3g}"

    print_table(
        [
            Column("tensor", whole=True),
            Column("differs in", whole=True),
            Column("max |a - b|", whole=True, right=True),
            Column(args.a, fold=True),
            Column(args.b, fold=True),
        ],
        [(t.name, t.what, gap(t.max_abs_diff), t.a or "—", t.b or "—") for t in weights.tensors],
        title=f"{len(weights.tensors)} tensors differ ({weights.compared:,} compared value by value; "
        "— = the tensor does not exist there)",
    )
