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
import textwrap
from typing import Any

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
    "data",
    "show",
    "diff",
    "plot",
    "convert",
    "quantize",
    "generate",
    "chat",
    "embed",
    "transcribe",
    "eval",
    "export",
    "serve",
)

# The distribution's name, new and old; the package itself is `zoo` either way.
DISTRIBUTIONS = ("transformer-zoo", "zoo")
# What a shell reports for a process killed by SIGPIPE (128 + 13), as `yes | head` gives under pipefail.
EXIT_BROKEN_PIPE = 141


class _Console(Console):
    """rich's Console, except that a line of text stays one line however long: rich breaks text at the
    console's width, 80 columns when piped, so a script reading the output would see half a path (a terminal
    folds a long line itself). Tables and trees are still laid out to the width."""

    def print(self, *objects: Any, soft_wrap: bool | None = None, **kwargs: Any) -> None:
        if soft_wrap is None and all(isinstance(thing, str) for thing in objects):
            soft_wrap = True
        super().print(*objects, soft_wrap=soft_wrap, **kwargs)


class _StdoutConsole(_Console):
    def on_broken_pipe(self) -> None:
        # rich's default exits with 1, which `zoo diff` already means "they differ": hand the error to
        # main, which answers every broken pipe the same way.
        self.quiet = True
        raise BrokenPipeError


console = _StdoutConsole()
err_console = _Console(stderr=True)


def version() -> str:
    """The installed distribution's version; ``zoo.__version__`` when zoo runs from a bare checkout."""
    for name in DISTRIBUTIONS:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    import zoo

    return getattr(zoo, "__version__", "unknown")


class HelpFormatter(argparse.HelpFormatter):
    """argparse's formatter, with usage lines that fit the terminal: argparse keeps a group of
    alternatives, ``(--from-hf DIR | --to-hf DIR | ...)``, on one line however long; here it breaks after
    a ``|``, the next line indented inside the group. Help text breaks at spaces only, never after a
    hyphen inside an option's name."""

    def _metavar_formatter(self, action: argparse.Action, default_metavar: str) -> Any:
        # argparse writes choices as the metavar, "{seq2seq,causal_lm,...}": one word, however long. A long
        # list becomes the option's name (TASK) here, and the help lists the choices, where it can wrap.
        if _long_choices(action):
            return super()._metavar_formatter(_named(action, default_metavar), default_metavar)
        return super()._metavar_formatter(action, default_metavar)

    def _get_help_string(self, action: argparse.Action) -> str | None:
        help = super()._get_help_string(action)
        if not _long_choices(action):
            return help
        assert action.choices is not None  # _long_choices checked
        choices = ", ".join(str(choice) for choice in action.choices).replace("%", "%%")
        return f"{help} (one of: {choices})" if help else f"one of: {choices}"

    def _split_lines(self, text: str, width: int) -> list[str]:
        # textwrap breaks after hyphens by default: "--forced-bos-" / "token", "KV-" / "cache"; not here.
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        return textwrap.fill(
            " ".join(text.split()),
            width,
            initial_indent=indent,
            subsequent_indent=indent,
            break_on_hyphens=False,
        )

    def _format_usage(self, usage: Any, actions: Any, groups: Any, prefix: Any) -> str:
        text = super()._format_usage(usage, actions, groups, prefix)
        width = self._width - self._current_indent
        lines = [wrapped for line in text.split("\n") for wrapped in wrap_alternatives(line, width)]
        return "\n".join(_shift_left(line, width) for line in lines)


# Choices longer than this, written out, go into the help rather than the metavar (`HelpFormatter`).
CHOICES_WIDTH = 30


def _long_choices(action: argparse.Action) -> bool:
    return (
        action.metavar is None
        and action.choices is not None
        and not isinstance(action, argparse._SubParsersAction)
        and len(",".join(str(choice) for choice in action.choices)) + 2 > CHOICES_WIDTH
    )


def _named(action: argparse.Action, metavar: str) -> argparse.Action:
    """A copy of ``action`` whose metavar is ``metavar`` (the option's name in capitals)."""
    import copy

    named = copy.copy(action)
    named.metavar = metavar
    return named


def _shift_left(line: str, width: int) -> str:
    """A continuation line of a usage, indented less if that makes it fit (argparse aligns the lines under
    the program's name, however long one option and its metavar are)."""
    text = line.lstrip(" ")
    if len(line) <= width or len(text) == len(line):
        return line
    return " " * max(len(line) - len(text) - (len(line) - width), 2) + text


def wrap_alternatives(line: str, width: int) -> list[str]:
    """``line`` broken after ``" |"`` so that each piece fits ``width`` where it can; the pieces after the
    first are indented one past the bracket that opens the group. A line without ``" | "`` stays whole."""
    if len(line) <= width or " | " not in line:
        return [line]
    first_bar = line.index(" | ")
    opening = max(line.rfind("(", 0, first_bar), line.rfind("[", 0, first_bar))
    indent = " " * (opening + 1 if opening >= 0 else len(line) - len(line.lstrip()) + 1)
    pieces = line.split(" | ")
    lines, current = [], pieces[0]
    for piece in pieces[1:]:
        if len(current) + len(" | ") + len(piece) <= width:
            current += " | " + piece
        else:
            lines.append(current + " |")
            current = indent + piece
    return [*lines, current]


class ArgumentParser(argparse.ArgumentParser):
    """The top-level parser: zoo's `HelpFormatter` unless told otherwise."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)


class CommandParser(ArgumentParser):
    """A subcommand's parser. argparse hands an argument a subcommand does not know back up to the top-level
    parser, whose error shows ``usage: zoo [-h] [--version] COMMAND ...``; here the subcommand reports it
    itself, under its own usage (``usage: zoo generate [-h] --prompt PROMPT ...``)."""

    def parse_known_args(self, *args: Any, **kwargs: Any) -> Any:  # argparse's overloads, passed through
        namespace, extras = super().parse_known_args(*args, **kwargs)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return namespace, extras


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="zoo", description="A config-driven Transformer model zoo for PyTorch.")
    parser.add_argument("--version", action="version", version=f"zoo {version()}")
    # Nested subcommands (`zoo plot masks`, `zoo tokenizer train`) inherit CommandParser from their parent.
    subparsers = parser.add_subparsers(
        dest="command", metavar="COMMAND", required=True, parser_class=CommandParser
    )
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
