"""The ``zoo`` command. Each subcommand is a module here with ``register(subparsers)``; this package is
the only place in zoo that prints or uses rich."""

from __future__ import annotations

import argparse
import importlib
import sys

from rich.console import Console
from rich.markup import escape

# One line per subcommand module, in the order `zoo --help` lists them.
COMMANDS = (
    "presets",
    "schema",
    "demo",
    "train",
    "tokenizer",
    "show",
    "diff",
    "plot",
    "convert",
    "generate",
)

console = Console()
err_console = Console(stderr=True)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="zoo", description="A config-driven Transformer model zoo for PyTorch."
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        importlib.import_module(f"zoo.cli.{name}").register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``zoo`` console script; returns the exit status."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except (ValueError, FileNotFoundError, OSError) as error:
        # zoo's errors already name the file, field or tensor: show the message, not a traceback.
        err_console.print(f"[bold red]error:[/] {escape(str(error))}", highlight=False)
        return 2
    except KeyboardInterrupt:
        err_console.print("interrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main())
