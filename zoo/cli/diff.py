"""``zoo diff A B``: what two specs or presets differ in, field by field (stacks resolved)."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "diff",
        help="what two presets, spec files or checkpoints differ in (exit 1 if they differ, as diff(1))",
        description="What two specs differ in, field by field. Exit status as diff(1): 0 when they are "
        "the same, 1 when they differ, 2 on an error.",
    )
    parser.add_argument("a", metavar="A", help="preset, spec file, zoo checkpoint or Hugging Face folder")
    parser.add_argument("b", metavar="B", help="preset, spec file, zoo checkpoint or Hugging Face folder")
    parser.add_argument(
        "--json",
        action="store_true",
        help="print a JSON list of {field, a, b} (a side without the field: no key)",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from zoo.analysis import diff_specs
    from zoo.analysis.diff import MISSING
    from zoo.cli import console
    from zoo.cli.options import load_target_spec
    from zoo.cli.sanitize import json_text, markup
    from zoo.cli.tables import Column, print_table

    rows = diff_specs(load_target_spec(args.a), load_target_spec(args.b))
    # As diff(1), so that scripts can ask "same model?" with `zoo diff A B >/dev/null`.
    status = 1 if rows else 0
    if args.json:
        data = [
            {"field": path} | ({} if a is MISSING else {"a": a}) | ({} if b is MISSING else {"b": b})
            for path, a, b in rows
        ]
        print(json_text(data))  # C1 controls escaped too: valid JSON, nothing for a terminal to act on
        return status
    if not rows:
        console.print(
            f"{markup(args.a)} and {markup(args.b)} are identical: every field, every stack resolved"
        )
        return status

    def show(value: object) -> str:
        return "—" if value is MISSING else json_text(value, indent=None)

    print_table(
        [Column("field", whole=True), Column(args.a, fold=True), Column(args.b, fold=True)],
        [(path, show(a), show(b)) for path, a, b in rows],
        title=f"{len(rows)} fields differ (stacks resolved; — = the field does not exist there)",
    )
    return status
