"""The ``zoo`` command. Each subcommand is a module here with ``register(subparsers)``; this package is
the only place in zoo that prints or uses rich.

Exit status: 0 success; 1 `zoo diff` found differences (as diff(1)); 2 an error, reported in one line
(argparse's usage errors included); 130 interrupted; 141 stdout closed early (``zoo schema | head``).
Which errors are the user's (one line) and which are bugs (a traceback): `zoo.cli.errors`. Text from files
is printed through `zoo.cli.sanitize`, so that no file can send escape sequences to the terminal.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import os
import sys

from rich.console import Console
from rich.markup import escape

from zoo.cli.errors import is_user_error, one_line

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
    "quantize",
    "generate",
    "export",
)

# The distribution's name, new and old; the package itself is `zoo` either way.
DISTRIBUTIONS = ("transformer-zoo", "zoo")
# What a shell reports for a process killed by SIGPIPE (128 + 13), as `yes | head` gives under pipefail.
EXIT_BROKEN_PIPE = 141


class _StdoutConsole(Console):
    def on_broken_pipe(self) -> None:
        # rich's default exits with 1, which `zoo diff` already means "they differ": hand the error to
        # main, which answers every broken pipe the same way.
        self.quiet = True
        raise BrokenPipeError


console = _StdoutConsole()
err_console = Console(stderr=True)


def version() -> str:
    """The installed distribution's version; ``zoo.__version__`` when zoo runs from a bare checkout."""
    for name in DISTRIBUTIONS:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    import zoo

    return getattr(zoo, "__version__", "unknown")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="zoo", description="A config-driven Transformer model zoo for PyTorch."
    )
    parser.add_argument("--version", action="version", version=f"zoo {version()}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        importlib.import_module(f"zoo.cli.{name}").register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``zoo`` console script; returns the exit status."""
    args = build_parser().parse_args(argv)
    try:
        status = int(args.run(args) or 0)
        sys.stdout.flush()  # a reader gone away shows here, inside the try, not at interpreter exit
        return status
    except BrokenPipeError:
        _silence_stdout()
        return EXIT_BROKEN_PIPE
    except KeyboardInterrupt:
        err_console.print("interrupted")
        return 130
    except Exception as error:
        if not is_user_error(error):
            raise  # a bug: its traceback is what a report needs
        # zoo's errors already name the file, field or tensor: show the message, not a traceback.
        # soft_wrap: one line, however long; the terminal folds it, rich does not break it into several.
        err_console.print(f"[bold red]error:[/] {escape(one_line(error))}", highlight=False, soft_wrap=True)
        return 2


def _silence_stdout() -> None:
    """After EPIPE: point stdout at devnull so Python's flush at exit does not raise again (the recipe in
    https://docs.python.org/3/library/signal.html#note-on-sigpipe)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout without a file descriptor (captured, replaced): nothing to flush
        pass


if __name__ == "__main__":
    sys.exit(main())
