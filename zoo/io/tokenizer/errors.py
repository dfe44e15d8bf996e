"""The errors the ``tokenizers`` library raises while encoding, as one line naming the tokenizer and the fix.

``tokenizers`` raises a bare ``Exception`` (a vocabulary without the unknown token its model names, a Unigram
model without ``unk_id``) or, from a panic inside Rust, a ``PanicException`` that is not even an
``Exception`` (a pre-tokenizer regex that backtracks past Oniguruma's retry limit). Both would reach the user
as tracebacks, in ``zoo train`` too. `encode_checked` turns them into a `TokenizerError` (a ``ValueError``:
the CLI prints it as one line) naming the tokenizer's file, the text that failed and what is wrong.

What is bounded and what is not: Oniguruma stops one match after 10 million backtracking steps, so a
catastrophic pattern fails rather than hangs on one word; but a long text holds many words, each tried, so
its time still grows with the text's length. Training cuts each line before encoding it
(`zoo.io.tokenizer.lengths`); a prompt or a ``zoo tokenizer encode`` text is encoded as given.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")


class TokenizerError(ValueError):
    """A tokenizer that cannot encode a text; the message names the tokenizer file and the problem."""


# (what tokenizers says, what it means): the first that matches explains the error.
_EXPLAINED: tuple[tuple[re.Pattern[str], str], ...] = (
    (
        re.compile(r"Missing (?P<token>.+?) token from the vocabulary|Unk token `(?P<unk>.+?)` not found"),
        "its model names the unknown token {token}, which its vocabulary lacks, so a piece outside the "
        "vocabulary cannot be encoded; add {token} to the vocabulary (or fix the model's unk_token)",
    ),
    (
        re.compile(r"unknown token but `unk_id` is missing"),
        "its Unigram model has no unk_id, so a piece outside its vocabulary cannot be encoded; set unk_id "
        "(the id of its unknown token)",
    ),
    (
        re.compile(r"retry-limit-in-match|Regex search error"),
        "a regular expression of its pre-tokenizer backtracks without bound on this text (Oniguruma stopped "
        "it at its retry limit); fix the pattern, which is catastrophic (nested repetition such as (a+)+)",
    ),
)


def explain(message: str) -> str:
    """What a ``tokenizers`` error message means, in zoo's words (the message itself when not recognised)."""
    for pattern, meaning in _EXPLAINED:
        match = pattern.search(message)
        if match:
            token = next((value for value in match.groupdict().values() if value), "")
            return meaning.format(token=token)
    return (
        f"tokenizers says: {message.strip().splitlines()[0][:200] if message.strip() else 'no reason given'}"
    )


def is_library_error(error: BaseException) -> bool:
    """Whether ``error`` is what ``tokenizers`` raises for a failed encode: a bare ``Exception`` or a Rust
    panic (``pyo3_runtime.PanicException``, a ``BaseException``). Typed errors (a TypeError for a wrong
    argument) and interrupts are not."""
    return type(error) is Exception or type(error).__name__ == "PanicException"


def encode_checked(encode: Callable[[Sequence[T]], list], items: Sequence[T], *, source: str) -> list:
    """``encode(items)`` (a batch call); when ``tokenizers`` fails, a `TokenizerError` naming ``source`` and
    the first item that fails alone (found by encoding them one at a time: the cost only of a failure)."""
    try:
        return encode(items)
    except BaseException as error:
        broken = next((i for i, item in enumerate(items) if lone_surrogate(item) is not None), None)
        if broken is not None:  # tokenizers' TypeError ("TextEncodeInput must be ..."), said plainly
            raise TokenizerError(
                f"{source}: cannot encode text {broken} ({_snippet(items[broken])}): it holds a lone UTF-16 "
                f"surrogate at character {lone_surrogate(items[broken])}, which is not valid Unicode"
            ) from None
        if not is_library_error(error):
            raise
        first = _first_failing(encode, items) if len(items) > 1 else 0
        what = "the text" if first is None else f"text {first} ({_snippet(items[first])})"
        what = _snippet(items[0]) if len(items) == 1 else what
        raise TokenizerError(f"{source}: cannot encode {what}: {explain(str(error))}") from None


def lone_surrogate(item: object) -> int | None:
    """Where a lone UTF-16 surrogate (JSON's ``"\\ud800"`` decodes to one) sits in a text, or in the texts of
    a pair or a list of words; None when there is none. No tokenizer can encode one."""
    if isinstance(item, str):
        try:
            item.encode("utf-8")
        except UnicodeEncodeError as error:
            return error.start
        return None
    if isinstance(item, list | tuple):
        return next((at for part in item if (at := lone_surrogate(part)) is not None), None)
    return None


def _first_failing(encode: Callable[[Sequence[T]], list], items: Sequence[T]) -> int | None:
    for i, item in enumerate(items):
        try:
            encode([item])
        except BaseException as error:
            if not is_library_error(error):
                raise
            return i
    return None


def _snippet(item: object) -> str:
    text = (
        item if isinstance(item, str) else " ".join(map(str, item)) if isinstance(item, list) else str(item)
    )
    return repr(text[:40] + ("..." if len(text) > 40 else ""))
