"""Training a subword tokenizer (BPE, WordPiece or Unigram) on text files or strings.

Trained tokenizers give ids 0-4 to :data:`SPECIAL_TOKENS` and are built so that
``decode(encode(text)) == text`` for NFC text whose words are separated by single spaces (the toy corpus,
Hangul included):

* ``bpe`` and ``unigram`` split on whitespace and mark word starts with ``▁``, as SentencePiece does; the
  Metaspace decoder turns ``▁`` back into spaces.
* ``wordpiece`` splits on whitespace only (not punctuation, unlike BERT) and marks continuations with
  ``##``; its decoder runs without BERT's "cleanup", which would rewrite ``" ."`` as ``"."``.

They have no post-processor: :class:`Tokenizer` adds bos / eos itself.

Words longer than :data:`MAX_WORD_CHARS` are cut into pieces of that length for training only. The BPE and
WordPiece trainers rescan a word for every merge that touches it, so one unbroken line of megabytes (a
minified file, a base64 blob) takes hours; cut, it costs what ordinary text does. The pieces after the first
carry no word-start mark, so they count as the middle of a word, as they are. The saved tokenizer does not
cut: it encodes a long word whole, as any other.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from itertools import chain
from pathlib import Path
from typing import Literal

from tokenizers import Regex, decoders, models, normalizers, pre_tokenizers, trainers
from tokenizers import Tokenizer as HFTokenizer

from zoo.io.tokenizer.core import PathLike, Tokenizer
from zoo.io.tokenizer.specials import SPECIAL_TOKENS
from zoo.spec.errors import number, short_repr
from zoo.spec.limits import MAX_MIN_FREQUENCY, VOCAB, over_limit

TokenizerKind = Literal["bpe", "wordpiece", "unigram"]

# Longer words are cut into pieces this long for training. 100 characters: the longest words of natural
# text (German compounds, chemical names) stay whole, and it is the limit past which Hugging Face's
# WordPiece already gives up on a word (max_input_chars_per_word). Training then costs at most
# 100 x 100 per distinct piece rather than the square of a line's length.
MAX_WORD_CHARS = 100


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

    Words longer than :data:`MAX_WORD_CHARS` characters are split into pieces of that length for training
    (only: the tokenizer returned encodes them whole). A file that is not UTF-8 raises ``ValueError``
    naming the file, the line and the byte offset; so does a ``vocab_size`` over ``ZOO_MAX_VOCAB``
    (16,777,216: the BPE trainer allocates by it) or a ``min_frequency`` over 2**32 - 1.
    """
    for name, value in (("vocab_size", vocab_size), ("min_frequency", min_frequency)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{name} must be an integer, got {short_repr(value)}")
    if min_frequency < 0:
        raise ValueError(f"min_frequency ({number(min_frequency)}) must be >= 0")
    if min_frequency > MAX_MIN_FREQUENCY:  # a count of occurrences; tokenizers takes a u64
        raise ValueError(f"min_frequency ({number(min_frequency)}) must be at most {MAX_MIN_FREQUENCY:,}")
    if vocab_size <= len(SPECIAL_TOKENS):
        raise ValueError(
            f"vocab_size ({number(vocab_size)}) must exceed the {len(SPECIAL_TOKENS)} special tokens"
        )
    if (problem := over_limit("vocab_size", vocab_size, VOCAB)) is not None:
        raise ValueError(problem)  # the BPE trainer allocates by it: 10**12 aborts the process
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
    saved = tok.pre_tokenizer
    # Training only: cut long words after the word-start mark, so that later pieces read as continuations.
    tok.pre_tokenizer = pre_tokenizers.Sequence([saved, _cut_long_words()])
    tok.train_from_iterator(_texts(files_or_iterator), trainer=trainer)
    tok.pre_tokenizer = saved
    return Tokenizer(tok)


def _cut_long_words() -> pre_tokenizers.PreTokenizer:
    """A pre-tokenizer that splits every word into pieces of at most :data:`MAX_WORD_CHARS` characters."""
    return pre_tokenizers.Split(Regex(f".{{1,{MAX_WORD_CHARS}}}"), behavior="isolated")


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
    try:
        with path.open(encoding="utf-8") as f:
            yield from (line.rstrip("\n") for line in f)
    except UnicodeDecodeError:
        raise ValueError(_not_utf8(path)) from None


def _not_utf8(path: Path) -> str:
    """Where ``path`` first stops being UTF-8: ``"data.txt:3: not UTF-8 text (byte 0xff at byte offset 41)..."``.

    Read again as bytes, line by line: a newline byte never occurs inside a UTF-8 character, so each line
    decodes alone, and the first that fails holds the bad byte.
    """
    offset = 0
    with path.open("rb") as f:
        for number, line in enumerate(f, start=1):
            try:
                line.decode("utf-8")
            except UnicodeDecodeError as error:
                where = offset + error.start
                return (
                    f"{path}:{number}: not UTF-8 text (byte 0x{line[error.start]:02x} at byte offset {where}); "
                    "convert the file to UTF-8 (e.g. iconv -f latin1 -t utf-8)"
                )
            offset += len(line)
    return f"{path}: not UTF-8 text"  # only if the file changed between the two reads
