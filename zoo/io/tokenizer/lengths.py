"""Cutting a text before it is encoded, to what a token limit can keep.

Encoding a 20 MB line to keep its first 512 tokens costs gigabytes: the Rust encoder builds every token of
the whole line (ids, offsets, words) before anything is truncated. A line can be cut before encoding instead,
to a character budget no kept token can reach past:

    budget = max_tokens × chars_per_token,   chars_per_token = 2 × (longest vocabulary entry + 1)

A token covers at most as many characters of the text as its vocabulary entry has (a byte-level entry has
one character per byte, and a character is at least one byte; a ``##`` or ``▁`` mark only adds to the entry's
length). A WordPiece model maps a word longer than its ``max_input_chars_per_word`` (100) to one unknown
token, so that count is a floor. The ``+ 1`` covers the separator a pre-tokenizer drops before a word, and the
factor 2 runs of whitespace and normalizers that fold several characters into one (NFKC, stripped accents).
So ``max_tokens`` tokens of plain text never reach the budget, and the tokens a cut line keeps are those the
whole line's encoding would keep: a cut falls at least ``max_tokens × chars_per_token / 2`` characters past
them, far from the word it splits.

A conversation is cut before it is rendered (`cut_messages`): its messages' contents are kept, in order,
until they hold more than ``budget`` characters (the last one kept cut there) or number more than
``budget``, and the later messages are left out. A template that writes each message's content as it is,
in order, after the messages before it (one whose renderings are prefixes of each other, as the chat task
requires) then renders the cut conversation's first ``budget`` characters as it renders the whole one's.
Not covered: a template that leaves out part of what it is given (a system message it never writes) may
render a conversation cut sooner than truncation would cut it; the chat task checks that the rendering is
longer than the budget and holds as many characters as the contents kept, else renders it whole.

Not covered, and said so in docs/training.md: a line made mostly of what the tokenizer drops (thousands of
spaces between words, control characters) or of unknown characters fused into one unknown token (Unigram,
BPE with ``fuse_unk``); such a line is cut shorter than truncation would cut it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from zoo.io.tokenizer.core import Tokenizer


def chars_per_token(tokenizer: Tokenizer) -> int:
    """An upper bound on the characters of plain text one token of ``tokenizer`` covers (see the module)."""
    return tokenizer.chars_per_token


def char_budget(tokenizer: Tokenizer, max_tokens: int) -> int:
    """The characters a text may keep when only its first ``max_tokens`` tokens are wanted."""
    return max_tokens * tokenizer.chars_per_token


def cut_before_encoding(texts: Sequence[str], budget: int) -> tuple[list[str], list[int]]:
    """``texts`` with each one longer than ``budget`` characters cut to its first ``budget``, and the
    indices of those cut: by the bound above, each holds more tokens than the limit the budget is for."""
    cut = [i for i, text in enumerate(texts) if len(text) > budget]
    if not cut:
        return list(texts), []
    kept = list(texts)
    for i in cut:
        kept[i] = kept[i][:budget]
    return kept, cut


def cut_words(words: Sequence[str], budget: int) -> tuple[list[str], bool]:
    """The first words of ``words`` that fit ``budget`` characters, one separator counted after each, and
    whether any was left out (pre-tokenized text: a word is never split, so the tags stay aligned)."""
    used = 0
    for i, word in enumerate(words):
        used += len(word) + 1
        if used > budget:  # the first word stays, cut if it must be: its tag is the first to keep
            return list(words[:i]) if i else [word[:budget]], True
    return list(words), False


def cut_messages(contents: Sequence[str], budget: int) -> tuple[list[str], bool]:
    """The contents of a conversation's first messages, kept until they hold ``budget + 1`` characters (the
    last one kept cut there, so that the rendering is certainly over the budget) or number ``budget + 1``
    messages (empty ones, say: a template writes something for each), and whether anything was cut or
    left out."""
    used = 0
    for i, content in enumerate(contents):
        if used + len(content) > budget:
            kept = content[: budget + 1 - used]
            return [*contents[:i], kept], len(kept) < len(content) or i + 1 < len(contents)
        used += len(content)
        if i == budget:
            return list(contents[: i + 1]), i + 1 < len(contents)
    return list(contents), False
