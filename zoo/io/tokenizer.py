"""A thin wrapper over Hugging Face ``tokenizers``: train BPE / WordPiece / Unigram, load any ``tokenizer.json``.

Trained tokenizers reserve ids 0-4 for :data:`SPECIAL_TOKENS` (pad, bos, eos, unk, mask) and are built so
that ``decode(encode(text)) == text`` for NFC text whose words are separated by single spaces (the toy
corpus, Hangul included):

* ``bpe`` and ``unigram`` split on whitespace and mark word starts with ``▁``, as SentencePiece does; the
  Metaspace decoder turns ``▁`` back into spaces.
* ``wordpiece`` splits on whitespace only (not punctuation, unlike BERT) and marks continuations with
  ``##``; its decoder runs without BERT's "cleanup", which would rewrite ``" ."`` as ``"."``.

Special tokens are added by :meth:`Tokenizer.encode` itself rather than by a post-processor, so the same
``add_bos`` / ``add_eos`` switches work for foreign tokenizers (BERT's ``[CLS]``/``[SEP]`` included).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from itertools import chain
from pathlib import Path
from typing import Literal

from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, normalizers, pre_tokenizers, trainers

SPECIAL_TOKENS: dict[str, str] = {
    "pad": "<pad>",
    "bos": "<s>",
    "eos": "</s>",
    "unk": "<unk>",
    "mask": "<mask>",
}

# Names looked up, in order, to find each special token in a tokenizer we did not train.
SPECIAL_TOKEN_ALIASES: dict[str, tuple[str, ...]] = {
    "pad": ("<pad>", "[PAD]", "<|pad|>"),
    "bos": ("<s>", "[CLS]", "<bos>", "<|begin_of_text|>", "<|endoftext|>"),
    "eos": ("</s>", "[SEP]", "<eos>", "<|end_of_text|>", "<|endoftext|>"),
    "unk": ("<unk>", "[UNK]"),
    "mask": ("<mask>", "[MASK]"),
}

TokenizerKind = Literal["bpe", "wordpiece", "unigram"]
PathLike = str | os.PathLike[str]


class Tokenizer:
    """A ``tokenizers.Tokenizer`` with zoo's conventions: explicit bos/eos switches and named special ids."""

    def __init__(self, tokenizer: HFTokenizer) -> None:
        self._tok = tokenizer

    @classmethod
    def from_file(cls, path: PathLike) -> Tokenizer:
        """Load a ``tokenizer.json`` (ours or a Hugging Face one); a directory means its ``tokenizer.json``."""
        file = Path(path)
        if file.is_dir():
            file = file / "tokenizer.json"
        if not file.is_file():
            raise FileNotFoundError(f"tokenizer file not found: {file}")
        try:
            tok = HFTokenizer.from_file(str(file))
        except Exception as err:  # tokenizers raises a bare Exception for unparsable files
            raise ValueError(f"{file} is not a Hugging Face tokenizers JSON file: {err}") from err
        return cls(tok)

    def save(self, path: PathLike) -> None:
        """Write ``tokenizer.json`` atomically: a reader sees the old file or the new one, never half of one."""
        file = Path(path)
        file.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=file.parent, prefix=f".{file.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(self._tok.to_str(pretty=True))
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, 0o644)  # mkstemp creates 0600; a saved tokenizer is meant to be shared
            os.replace(tmp, file)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise

    @property
    def hf(self) -> HFTokenizer:
        """The wrapped ``tokenizers.Tokenizer``."""
        return self._tok

    # --- encoding ---------------------------------------------------------------------------------------
    def encode(self, text: str, *, add_bos: bool = False, add_eos: bool = True) -> list[int]:
        """Token ids of ``text``, optionally framed by bos / eos."""
        return self._frame(self._tok.encode(text, add_special_tokens=False).ids, add_bos, add_eos)

    def encode_batch(
        self, texts: Sequence[str], *, add_bos: bool = False, add_eos: bool = True
    ) -> list[list[int]]:
        """:meth:`encode` for many texts (tokenized in parallel by the Rust backend)."""
        encodings = self._tok.encode_batch(list(texts), add_special_tokens=False)
        return [self._frame(e.ids, add_bos, add_eos) for e in encodings]

    def _frame(self, ids: list[int], add_bos: bool, add_eos: bool) -> list[int]:
        if add_bos:
            ids = [self._required("bos"), *ids]
        if add_eos:
            ids = [*ids, self._required("eos")]
        return ids

    def _required(self, name: str) -> int:
        token_id = self._special_id(name)
        if token_id is None:
            looked_for = ", ".join(SPECIAL_TOKEN_ALIASES[name])
            raise ValueError(
                f"add_{name}=True but the tokenizer has no {name} token (looked for {looked_for})"
            )
        return token_id

    def decode(self, ids: Iterable[int], *, skip_special_tokens: bool = True) -> str:
        """Text of ``ids``. Does not stop at eos: truncate generated ids first."""
        # int() accepts tensor / numpy scalars, so callers need not convert.
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def decode_batch(self, batch: Iterable[Iterable[int]], *, skip_special_tokens: bool = True) -> list[str]:
        """:meth:`decode` for many id sequences."""
        return [self.decode(ids, skip_special_tokens=skip_special_tokens) for ids in batch]

    # --- vocabulary ---------------------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        """Number of tokens, added (special) tokens included."""
        return self._tok.get_vocab_size(with_added_tokens=True)

    def token_to_id(self, token: str) -> int | None:
        """Id of ``token``, or None when it is not in the vocabulary."""
        return self._tok.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        """Token with id ``token_id``, or None when out of range."""
        return self._tok.id_to_token(token_id)

    def _special_id(self, name: str) -> int | None:
        for token in SPECIAL_TOKEN_ALIASES[name]:
            token_id = self._tok.token_to_id(token)
            if token_id is not None:
                return token_id
        return None

    def special_ids(self) -> dict[str, int | None]:
        """``{"pad": id, "bos": id, "eos": id, "unk": id, "mask": id}``, None where absent."""
        return {name: self._special_id(name) for name in SPECIAL_TOKENS}

    @property
    def pad_id(self) -> int | None:
        """Id of the padding token, if any."""
        return self._special_id("pad")

    @property
    def bos_id(self) -> int | None:
        """Id of the beginning-of-sequence token (``[CLS]`` for BERT-style tokenizers), if any."""
        return self._special_id("bos")

    @property
    def eos_id(self) -> int | None:
        """Id of the end-of-sequence token (``[SEP]`` for BERT-style tokenizers), if any."""
        return self._special_id("eos")

    @property
    def unk_id(self) -> int | None:
        """Id of the unknown token, if any."""
        return self._special_id("unk")

    @property
    def mask_id(self) -> int | None:
        """Id of the mask token (masked language modelling), if any."""
        return self._special_id("mask")

    def __repr__(self) -> str:
        return f"Tokenizer({type(self._tok.model).__name__}, vocab_size={self.vocab_size})"


# --- training ---------------------------------------------------------------------------------------------
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


# --- consistency with a model spec -------------------------------------------------------------------------
def check_special_tokens(
    tokenizer: Tokenizer,
    *,
    pad_token_id: int | None,
    bos_token_id: int | None,
    eos_token_id: int | None,
    vocab_size: int,
    where: str,
) -> None:
    """Raise ``ValueError`` if ``tokenizer`` disagrees with a model spec's special ids or vocabulary size.

    A spec id of None is not checked. ``where`` names the spec in the message (e.g. a preset or file).
    """
    problems = []
    for name, spec_id in (("pad", pad_token_id), ("bos", bos_token_id), ("eos", eos_token_id)):
        if spec_id is None:
            continue
        tok_id = tokenizer.special_ids()[name]
        if tok_id is None:
            looked_for = ", ".join(SPECIAL_TOKEN_ALIASES[name])
            problems.append(
                f"{name}_token_id is {spec_id} but the tokenizer has no {name} token ({looked_for})"
            )
        elif tok_id != spec_id:
            token = tokenizer.id_to_token(tok_id)
            problems.append(
                f"{name} token {token!r} has id {tok_id} in the tokenizer but {name}_token_id is {spec_id}"
            )
    if tokenizer.vocab_size > vocab_size:
        problems.append(
            f"the tokenizer has {tokenizer.vocab_size} tokens but vocab_size is {vocab_size}; "
            "larger ids would index past the embedding"
        )
    if problems:
        raise ValueError(f"{where}: tokenizer does not match the model spec: " + "; ".join(problems))
