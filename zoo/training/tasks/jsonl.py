"""JSON-lines records. Of text fields, as dpo, kto and contrastive read them: each named field must hold a
string (a missing key, a null or an empty text are bad lines already, `zoo.training.data.sources`), and each
field becomes its side's raw ids, cut before encoding where it is longer than the limit can cover. Or whole
lines that a task parses itself (chat's conversations, grpo's prompts): `parsed_lines`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from zoo.io.tokenizer import Tokenizer
from zoo.training.data import DataError
from zoo.training.data.sources import ReadStats, Record, Source, iter_records
from zoo.training.tasks.base import LengthCuts, cut_texts, field_text, raw_ids


def checked_records(
    source: Source,
    *,
    strings: Sequence[str],
    stats: ReadStats | None = None,
    problem: Callable[[Record], str | None] | None = None,
) -> Iterator[Record]:
    """The records of ``source`` whose ``strings`` fields hold strings (not JSON lists) and in which
    ``problem`` (asked only then) finds nothing wrong: it returns what is wrong, or None. A bad line is
    refused with a `DataError` naming it (``on_bad_line: error``) or counted in ``stats`` (``skip``)."""
    for record in iter_records(source, stats=stats):  # a missing key, null or empty text: bad lines there
        wrong = next((name for name in strings if not isinstance(record.fields[name], str)), None)
        found = None if wrong is not None or problem is None else problem(record)
        if wrong is None and found is None:
            yield record
            continue
        message = (
            f"{record.origin}: {wrong!r} must be a string, found a list"
            if wrong is not None
            else f"{record.origin}: {found}"
        )
        if source.on_bad_line == "error":
            raise DataError(f"{message} (on_bad_line: skip passes over bad lines, counting them)")
        if stats is not None:
            stats.add(message)


def parsed_lines(
    source: Source,
    *,
    task: str,
    stats: ReadStats | None,
    parse: Callable[[Record, str], Record | str],
) -> Iterator[Record]:
    """The records of a task that reads its JSON lines itself: ``source`` holds the files as text (its one
    field, ``json``, the line) and ``parse(record, line)`` returns the record to yield or what is wrong with
    the line. A bad line is refused with a `DataError` naming it (``on_bad_line: error``) or counted in
    ``stats`` (``skip``)."""
    if source.format != "text":
        raise DataError(
            f"{', '.join(map(str, source.paths))}: {task} reads JSON lines itself; give the files without "
            f"a format or fields (got format {source.format})"
        )
    stats = stats if stats is not None else ReadStats()
    for record in iter_records(source, stats=stats):
        line = record.fields["json"]
        assert isinstance(line, str)  # a text source's one field
        found = parse(record, line)
        if isinstance(found, Record):
            yield found
            continue
        message = f"{record.origin}: {found}"
        if source.on_bad_line == "error":
            raise DataError(f"{message} (data.on_bad_line: skip passes over bad lines, counting them)")
        stats.add(message)


def encode_fields(
    records: list[Record], sides: Sequence[str], tokenizer: Tokenizer, cuts: LengthCuts | None
) -> tuple[dict[str, list[Any]], set[int]]:
    """Each side's field of ``records`` -> its raw ids (no special tokens), a text longer than the limit can
    cover cut before encoding (`zoo.training.tasks.base.cut_texts`); and the indices of the records cut on
    any side, for `LengthCuts.apply`."""
    over: set[int] = set()
    ids: dict[str, list[Any]] = {}
    for side in sides:
        texts, cut = cut_texts([field_text(r, side) for r in records], tokenizer, cuts)
        ids[side] = raw_ids(tokenizer, texts)
        over.update(cut)
    return ids, over
