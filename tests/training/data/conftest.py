"""Shared pieces of the prepared-data tests: a small BPE tokenizer and a prepare call for plain text sides."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer

from zoo.io.tokenizer import train_tokenizer
from zoo.training.data.prepare import encode_text_sides, prepare, tokenizer_fingerprint
from zoo.training.data.shards import Manifest, SideInfo
from zoo.training.data.sources import Source

WORDS = [
    "the",
    "cat",
    "sat",
    "on",
    "a",
    "mat",
    "while",
    "dogs",
    "ran",
    "far",
    "away",
    "and",
    "birds",
    "sang",
    "sweet",
    "songs",
    "in",
    "tall",
    "green",
    "trees",
]


def sentence(i: int, words: int = 6) -> str:
    """A deterministic sentence of ``words`` words, different for each ``i``."""
    return " ".join(WORDS[(i * 7 + j * 3) % len(WORDS)] for j in range(words + i % 4))


@pytest.fixture(scope="session")
def tokenizer() -> Tokenizer:
    """A 120-token BPE tokenizer (the library's own class, as `prepare` takes it)."""
    lines = iter([sentence(i) for i in range(200)])
    return train_tokenizer(lines, kind="bpe", vocab_size=120).hf


def text_sides(tokenizer: Tokenizer, names: tuple[str, ...]) -> dict[str, SideInfo]:
    side = SideInfo(vocab_size=tokenizer.get_vocab_size(), tokenizer=tokenizer_fingerprint(tokenizer))
    return dict.fromkeys(names, side)


def prepare_text(source: Source, tokenizer: Tokenizer, out: Path, **options: Any) -> Manifest:
    """`prepare` of ``source``'s fields as plain text sides of the same names."""
    names = source.fields
    return prepare(
        source, encode_text_sides(tokenizer, names), out, sides=text_sides(tokenizer, names), **options
    )


def direct(tokenizer: Tokenizer, texts: list[str]) -> list[list[int]]:
    """The tokenizer's own ids for ``texts``, no special tokens: what the shards must hold."""
    return [tokenizer.encode(text, add_special_tokens=False).ids for text in texts]
