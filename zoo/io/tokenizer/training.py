"""Training a subword tokenizer (BPE, WordPiece or Unigram) on text files or strings.

Trained tokenizers give ids 0-4 to :data:`SPECIAL_TOKENS` and are built so that
``decode(encode(text)) == text`` for NFC text whose words are separated by single spaces (the toy corpus,
Hangul included):

* ``bpe`` and ``unigram`` split on whitespace and mark word starts with ``▁``, as SentencePiece does; the
  Metaspace decoder turns ``▁`` back into spaces.
* ``wordpiece`` splits on whitespace only (not punctuation, unlike BERT) and marks continuations with
  ``##``; its decoder runs without BERT's "cleanup", which would rewrite ``" ."`` as ``"."``.

They have no post-processor: :class:`Tokenizer` adds bos / eos itself.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from itertools import chain
from pathlib import Path
from typing import Literal

from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, normalizers, pre_tokenizers, trainers

from zoo.io.tokenizer.core import PathLike, Tokenizer
from zoo.io.tokenizer.specials import SPECIAL_TOKENS

TokenizerKind = Literal["bpe", "wordpiece", "unigram"]


def train_tokenizer(
    files_or_iterator: PathLike | Sequence[PathLike] | Iterable[str],
    *,
    kind: TokenizerKind,
    vocab_size: int,
    min_frequency: int = 2,
    lowercase: bool = False,
) -> Tokenizer:
    """Train a subword tokenizer whose ids 0-4 are :data:`SPECIAL_TOKENS`.

    ``files_or_iterator`` is a path or a list / tuple of paths (UTF-8 text, one or more sentences a line;
    tabs count as whitespace, so TSV files work), or any other iterable of strings. ``min_frequency``
    applies to BPE and WordPiece merges; the Unigram trainer has no such knob and ignores it.
    """
    if vocab_size <= len(SPECIAL_TOKENS):
        raise ValueError(f"vocab_size ({vocab_size}) must exceed the {len(SPECIAL_TOKENS)} special tokens")
    specials = list(SPECIAL_TOKENS.values())
    unk = SPECIAL_TOKENS["unk"]
    # Whitespace runs (tabs too) separate words; Metaspace then marks each word start with "▁".
    metaspace = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Metaspace()])
    trainer: trainers.Trainer
    if kind == "bpe":
        tok = HFTokenizer(models.BPE(unk_token=unk))
        tok.pre_tokenizer = metaspace
        tok.decoder = decoders.Metaspace()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=specials, show_progress=False
        )
    elif kind == "wordpiece":
        tok = HFTokenizer(models.WordPiece(unk_token=unk))
        tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)
        trainer = trainers.WordPieceTrainer(
            vocab_size=vocab_size,
            min_frequency=min_frequency,
            special_tokens=specials,
            continuing_subword_prefix="##",
            show_progress=False,
        )
    elif kind == "unigram":
        tok = HFTokenizer(models.Unigram())
        tok.pre_tokenizer = metaspace
        tok.decoder = decoders.Metaspace()
        trainer = trainers.UnigramTrainer(
            vocab_size=vocab_size, special_tokens=specials, unk_token=unk, show_progress=False
        )
    else:
        raise ValueError(f"unknown tokenizer kind {kind!r}; expected 'bpe', 'wordpiece' or 'unigram'")
    # NFC so that decomposed Hangul (jamo sequences) and precomposed syllables share tokens.
    steps = [normalizers.NFC(), *([normalizers.Lowercase()] if lowercase else [])]
    tok.normalizer = normalizers.Sequence(steps)
    tok.train_from_iterator(_texts(files_or_iterator), trainer=trainer)
    return Tokenizer(tok)


def _texts(source: PathLike | Sequence[PathLike] | Iterable[str]) -> Iterator[str]:
    """Lines of the given files, or the given strings; raises early for missing files and empty input."""
    if isinstance(source, (str, os.PathLike)):
        source = [source]
    if isinstance(source, Sequence):  # a list or tuple means file paths; pass an iterator for raw text
        paths = [Path(p) for p in source]
        for path in paths:
            if not path.is_file():
                hint = (
                    " (to train on in-memory text, pass an iterator: iter(texts))" if " " in str(path) else ""
                )
                raise FileNotFoundError(f"tokenizer training file not found: {path}{hint}")
        texts: Iterator[str] = (line for path in paths for line in _read_lines(path))
    else:
        texts = iter(source)
    texts = (t for t in texts if t.strip())
    first = next(texts, None)
    if first is None:
        raise ValueError("no text was found to train the tokenizer on (all inputs are empty or blank)")
    return chain([first], texts)


def _read_lines(path: Path) -> Iterator[str]:
    with path.open(encoding="utf-8") as f:
        for line in f:
            yield line.rstrip("\n")
