"""JSON-lines records of text fields, as dpo, kto and contrastive read them: each named field must hold a
string (a missing key, a null or an empty text are bad lines already, `zoo.training.data.sources`), and each
field becomes its side's raw ids, cut before encoding where it is longer than the limit can cover.
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
