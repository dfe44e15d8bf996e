"""``zoo diff A B``: what two specs or presets differ in, field by field (stacks resolved)."""

from __future__ import annotations

import argparse
import json


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("diff", help="what two presets, spec files or checkpoints differ in")
    parser.add_argument("a", metavar="A", help="preset, spec file or checkpoint dir")
    parser.add_argument("b", metavar="B", help="preset, spec file or checkpoint dir")
    parser.add_argument(
        "--json",
        action="store_true",
        help="print a JSON list of {field, a, b} (a side without the field: no key)",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from rich.markup import escape
    from rich.table import Table

    from zoo.analysis import diff_specs, load_target_spec
    from zoo.analysis.diff import MISSING
    from zoo.cli import console

    rows = diff_specs(load_target_spec(args.a), load_target_spec(args.b))
    if args.json:
        data = [
            {"field": path} | ({} if a is MISSING else {"a": a}) | ({} if b is MISSING else {"b": b})
            for path, a, b in rows
        ]
        print(json.dumps(data, indent=2, ensure_ascii=False))
        return 0
    if not rows:
        console.print(
            f"{escape(args.a)} and {escape(args.b)} are identical: every field, every stack resolved"
        )
        return 0

    def show(value: object) -> str:
        return "—" if value is MISSING else escape(json.dumps(value, ensure_ascii=False))

    table = Table(title=f"{len(rows)} fields differ (stacks resolved; — = the field does not exist there)")
    table.add_column("field")
    table.add_column(escape(args.a), overflow="fold")
    table.add_column(escape(args.b), overflow="fold")
    for path, a, b in rows:
        table.add_row(path, show(a), show(b))
    console.print(table)
    return 0
