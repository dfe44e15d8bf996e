"""Tables that never cut a name: a rich table on a terminal wide enough for it, plain aligned text otherwise.

Rich fits a table to the console by wrapping and then truncating cells (``transformer-ba…``), and it draws
boxes into pipes too. Names are what people copy into the next command, so here a name column never wraps
or truncates (`Column.whole`); when the table cannot fit with every name whole, or stdout is not a
terminal (``| grep``, ``> file``), the rows are printed as plain space-aligned text (`plain_lines`), which
fits the console's width (``COLUMNS`` when piped, 80 if unset) in the first of these layouts that does
(in a pipe, a table without values to wrap, such as `zoo presets`, keeps one row a line for grep and awk):

    one line a row           field       gpt2      llama-3.2-1b
    values wrapped under     source      "Radford  "Meta Llama 3.2
      their column                       et al."   1B; ..."
    two lines a row          decoder.position.scaling.original_max_positions
      (the first column                —         8192
      alone, the rest below)

Values (`Column.fold`) wrap at spaces, and a word longer than its column is folded; names and numbers are
never broken, so a name longer than the width itself is the one thing that can make a line longer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.table import Table


_ROOM = 100_000  # columns, more than any table here needs
_FOLD_WIDTH = 12  # the narrowest a folding column (JSON values) may be and still read
_GAP = "  "  # between plain columns
_INDENT = "    "  # the second line of a two-line row
_COMFORTABLE = 24  # a value column this wide (or as wide as its longest word) folds no word


@dataclass(frozen=True)
class Column:
    """One column: its header and how its cells may be laid out."""

    header: str
    whole: bool = False  # never wrapped or cut: a preset name, a field path, a number
    right: bool = False  # numbers
    fold: bool = False  # long values (JSON): fold onto more lines in the rich table


def print_table(
    columns: Sequence[Column], rows: Sequence[Sequence[str]], *, title: str | None = None
) -> None:
    """Print ``rows`` (plain text cells, no markup) under ``columns``; ``title`` only above a rich table.

    Headers and cells may come from files (a spec's name, a path): they are `zoo.cli.sanitize.clean`.
    """
    from rich.measure import Measurement

    from zoo.cli import console
    from zoo.cli.sanitize import clean

    columns = [replace(column, header=clean(column.header)) for column in columns]
    rows = [[clean(cell) for cell in row] for row in rows]
    title = clean(title) if title is not None else None

    if console.is_terminal:
        # The narrowest the table can be drawn: whole columns whole, folding columns as wide as their longest
        # word (`_COMFORTABLE` at most), the rest at their longest word (measured with room to spare: rich
        # clamps a measurement to the space it is given). If even that does not fit, rich would cut names or
        # split words, so the plain form it is.
        needs = _fold_needs(columns, rows)
        narrowest = _rich_table(columns, rows, title=title, needs=needs, narrowest=True)
        if Measurement.get(console, console.options.update_width(_ROOM), narrowest).minimum <= console.width:
            console.print(_rich_table(columns, rows, title=title, needs=needs, narrowest=False))
            return
    # In a pipe, a table of names and numbers alone keeps one row a line (for grep and awk), however narrow;
    # a table with values to wrap fits the width there too. On a terminal everything fits where it can.
    fit = console.is_terminal or any(column.fold for column in columns)
    for line in plain_lines(columns, rows, width=console.width if fit else None):
        console.out(line, highlight=False)


def _fold_needs(columns: Sequence[Column], rows: Sequence[Sequence[str]]) -> list[int]:
    """How wide each folding column must be for no word of it to be split (and its header whole): its
    longest word, `_COMFORTABLE` at most, `_FOLD_WIDTH` at least; 0 for the other columns."""
    return [
        max(
            len(column.header),
            _FOLD_WIDTH,
            min(_COMFORTABLE, max((len(w) for row in rows for w in row[i].split()), default=0)),
        )
        if column.fold
        else 0
        for i, column in enumerate(columns)
    ]


def _rich_table(
    columns: Sequence[Column],
    rows: Sequence[Sequence[str]],
    *,
    title: str | None,
    needs: Sequence[int],
    narrowest: bool,
) -> Table:
    """The rich table; a folding column at least ``needs`` wide (``narrowest``: exactly, to measure)."""
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=escape(title) if title else None)
    for column, need in zip(columns, needs):
        table.add_column(
            escape(column.header),
            justify="right" if column.right else "left",
            no_wrap=column.whole,
            overflow="fold" if column.fold else "ellipsis",
            max_width=need if column.fold and narrowest else None,
            min_width=need if column.fold else None,  # a header is a name, and a word stays whole
        )
    for row in rows:
        table.add_row(*(escape(cell) for cell in row))
    return table


def plain_lines(
    columns: Sequence[Column], rows: Sequence[Sequence[str]], *, width: int | None = None
) -> list[str]:
    """The header and rows as plain text, no trailing blanks, fitted to ``width`` (None: one line a row).

    One line a row, columns padded to their widest cell, when that fits. Else the values wrap under their
    columns, and the first column is made as wide as the values allow: a name longer than it gets a line of
    its own, its row's values on the next (as argparse lays out a long option and its help). The values'
    columns are made wide enough for their longest word where they can be (`_COMFORTABLE` at most), so that
    only a word longer than that is folded. A table without values to wrap that still does not fit: each
    row's first cell alone, the others on the next line, indented.
    """
    table = [[column.header for column in columns], *([str(cell) for cell in row] for row in rows)]
    natural = [max(len(row[i]) for row in table) for i in range(len(columns))]
    if width is None or _line_width(natural) <= width:
        return [_join(columns, row, natural) for row in table]
    words = [
        max((len(word) for row in table for word in row[i].split()), default=0) for i in range(len(columns))
    ]
    for comfortable in (True, False):
        needs = [
            max(len(column.header), min(natural[i], words[i], _COMFORTABLE) if comfortable else _FOLD_WIDTH)
            for i, column in enumerate(columns)
        ]
        for first in range(natural[0], len(_INDENT) - len(_GAP) - 1, -1):
            widths = _fit(columns, [first, *natural[1:]], width, needs)
            if widths is not None:
                return [line for row in table for line in _hanging_row(columns, row, widths)]
    # Nothing folds, or not enough: the first cell alone; the rest on the next line, at their full width.
    rest = [0, *natural[1:]]
    return [line for row in table for line in [row[0], _INDENT + _join(columns[1:], row[1:], rest[1:])]]


def _line_width(widths: Sequence[int]) -> int:
    return sum(widths) + len(_GAP) * (len(widths) - 1)


def _fit(
    columns: Sequence[Column], natural: Sequence[int], width: int, needs: Sequence[int]
) -> list[int] | None:
    """Column widths within ``width``: the first column and the whole ones at ``natural``, the folding ones
    sharing what is left (one narrower than its share keeps its natural width). None when a folding column
    would get less than it ``needs`` (or none folds)."""
    folding = [i for i, column in enumerate(columns) if column.fold and i > 0]
    room = width - _line_width([0 if i in folding else n for i, n in enumerate(natural)])
    widths = list(natural)
    pending = sorted(folding, key=lambda i: natural[i])
    while pending:  # the narrowest first: a column needing less than its share leaves the rest to others
        i = pending.pop(0)
        widths[i] = min(natural[i], room // (len(pending) + 1))
        room -= widths[i]
    if not folding or any(widths[i] < min(natural[i], needs[i]) for i in folding):
        return None
    return widths


def _hanging_row(columns: Sequence[Column], row: Sequence[str], widths: Sequence[int]) -> list[str]:
    """`_wrapped_row`, with a first cell wider than its column on a line of its own."""
    if len(row[0]) <= widths[0]:
        return _wrapped_row(columns, row, widths)
    return [row[0], *_wrapped_row(columns, ["", *row[1:]], widths)]


def _wrapped_row(columns: Sequence[Column], row: Sequence[str], widths: Sequence[int]) -> list[str]:
    """One row as lines: folding cells wrapped at spaces to their width (a longer word folded), the
    others whole."""
    import textwrap

    cells = [
        textwrap.wrap(cell, width, break_on_hyphens=False) or [""] if column.fold else [cell]
        for column, cell, width in zip(columns, row, widths)
    ]
    height = max(map(len, cells))
    return [
        _join(columns, [lines[k] if k < len(lines) else "" for lines in cells], widths) for k in range(height)
    ]


def _join(columns: Sequence[Column], cells: Sequence[str], widths: Sequence[int]) -> str:
    padded = [
        cell.rjust(width) if column.right else cell.ljust(width)
        for cell, width, column in zip(cells, widths, columns)
    ]
    return _GAP.join(padded).rstrip()
