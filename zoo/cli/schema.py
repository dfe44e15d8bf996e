"""``zoo schema``: the JSON Schema of the model spec, for editors and validators."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from zoo.cli.errors import writing


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("schema", help="print the JSON Schema of the model spec")
    parser.add_argument("--out", help="write to this file instead of standard output")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from zoo.spec import json_schema

    text = json.dumps(json_schema(), indent=2)
    if args.out:
        from zoo.io.atomic import write_text_atomic

        with writing(args.out):
            write_text_atomic(Path(args.out), text + "\n")
    else:
        print(text)
    return 0
