"""Tables that never cut a name: a rich table on a terminal wide enough for it, plain aligned text otherwise.

Rich fits a table to the console by wrapping and then truncating cells (``transformer-ba…``), and it draws
boxes into pipes too. Names are what people copy into the next command, so here a name column never wraps
or truncates (`Column.whole`); when the table cannot fit with every name whole, or stdout is not a
terminal (``| grep``, ``> file``), the rows are printed as plain space-aligned text, one row per line,
nothing cut.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.table import Table


_ROOM = 100_000  # columns, more than any table here needs
_FOLD_WIDTH = 12  # the narrowest a folding column (JSON values) may be and still read


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
        # The narrowest the table can be drawn: whole columns whole, folding columns at _FOLD_WIDTH, the
        # rest at their longest word (measured with room to spare: rich clamps a measurement to the space
        # it is given). If even that does not fit, rich would cut names, so the plain form it is.
        narrowest = _rich_table(columns, rows, title=title, fold_width=_FOLD_WIDTH)
        if Measurement.get(console, console.options.update_width(_ROOM), narrowest).minimum <= console.width:
            console.print(_rich_table(columns, rows, title=title, fold_width=None))
            return
    for line in plain_lines(columns, rows):
        console.out(line, highlight=False)


def _rich_table(
    columns: Sequence[Column], rows: Sequence[Sequence[str]], *, title: str | None, fold_width: int | None
) -> Table:
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=escape(title) if title else None)
    for column in columns:
        table.add_column(
            escape(column.header),
            justify="right" if column.right else "left",
            no_wrap=column.whole,
            overflow="fold" if column.fold else "ellipsis",
            max_width=fold_width if column.fold else None,
        )
    for row in rows:
        table.add_row(*(escape(cell) for cell in row))
    return table


def plain_lines(columns: Sequence[Column], rows: Sequence[Sequence[str]]) -> list[str]:
    """The header and rows, columns padded to their widest cell, two spaces apart, no trailing blanks."""
    table = [[column.header for column in columns], *([str(cell) for cell in row] for row in rows)]
    widths = [max(len(row[i]) for row in table) for i in range(len(columns))]
    lines = []
    for row in table:
        cells = [
            cell.rjust(width) if column.right else cell.ljust(width)
            for cell, width, column in zip(row, widths, columns)
        ]
        lines.append("  ".join(cells).rstrip())
    return lines
