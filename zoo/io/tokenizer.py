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

Calling the tokenizer (:meth:`Tokenizer.__call__`) is Hugging Face's batch interface instead: a foreign
tokenizer's own post-processor frames each row, so the ids equal ``transformers.AutoTokenizer``'s; a tokenizer
without one (those zoo trains) gets zoo's framing, ``[*ids, eos]``. :meth:`Tokenizer.save_pretrained` writes
that framing into the exported ``tokenizer.json`` so that transformers agrees there too.

Padding and truncation stored in a foreign ``tokenizer.json`` (sentence-transformers ships files padded to a
fixed 128) are dropped on load: padding is a property of a batch, asked for per call, as in transformers.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from itertools import chain
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, normalizers, pre_tokenizers, trainers

if TYPE_CHECKING:
    import torch

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
Padding = bool | Literal["longest", "max_length", "do_not_pad"]
Truncation = bool | Literal["longest_first", "only_first", "do_not_truncate"] | None

# transformers writes this for "no limit" (VERY_LARGE_INTEGER, int(1e30)); anything this large means unknown.
_NO_LIMIT = 10**18


class Tokenizer:
    """A ``tokenizers.Tokenizer`` with zoo's conventions: explicit bos/eos switches and named special ids.

    ``tokenizer(texts, padding=True, return_tensors="pt")`` is the batch interface of transformers
    (:meth:`__call__`); :meth:`encode` / :meth:`decode` work on one row of plain ids.
    """

    def __init__(
        self,
        tokenizer: HFTokenizer,
        *,
        model_max_length: int | None = None,
        special_tokens: dict[str, str] | None = None,
    ) -> None:
        """Wrap ``tokenizer`` (its stored padding and truncation are dropped, on a copy).

        ``special_tokens`` (``{"pad": "[PAD]", ...}``, as a ``tokenizer_config.json`` names them) take
        precedence over the lookup by :data:`SPECIAL_TOKEN_ALIASES`; ``model_max_length`` is the default
        ``max_length`` of :meth:`__call__`.
        """
        names = dict(special_tokens or {})
        stored_pad = tokenizer.padding
        if stored_pad is not None or tokenizer.truncation is not None:
            # Stored settings would pad every encode to a fixed length (with zoo's eos landing after the
            # pads) and cut long texts silently. A copy, so the caller's tokenizer keeps its settings.
            tokenizer = HFTokenizer.from_str(tokenizer.to_str())
            tokenizer.no_padding()
            tokenizer.no_truncation()
        # transformers takes the pad token of stored padding when no tokenizer_config.json names one.
        if stored_pad and tokenizer.token_to_id(stored_pad["pad_token"]) == stored_pad["pad_id"]:
            names.setdefault("pad", stored_pad["pad_token"])
        self._tok = tokenizer
        self._names = names
        self.model_max_length = model_max_length

    @classmethod
    def from_file(cls, path: PathLike) -> Tokenizer:
        """Load a ``tokenizer.json`` (ours or a Hugging Face one); a directory means its ``tokenizer.json``.

        A ``tokenizer_config.json`` beside it (a transformers folder) supplies ``model_max_length`` and the
        special tokens it names, as ``AutoTokenizer.from_pretrained`` would use them.
        """
        file = Path(path)
        if file.is_dir():
            file = file / "tokenizer.json"
        if not file.is_file():
            raise FileNotFoundError(f"tokenizer file not found: {file}")
        try:
            tok = HFTokenizer.from_file(str(file))
        except Exception as err:  # tokenizers raises a bare Exception for unparsable files
            raise ValueError(f"{file} is not a Hugging Face tokenizers JSON file: {err}") from err
        model_max_length, special_tokens = _read_tokenizer_config(file.parent / TOKENIZER_CONFIG)
        return cls(tok, model_max_length=model_max_length, special_tokens=special_tokens)

    def save(self, path: PathLike) -> None:
        """Write ``tokenizer.json`` atomically: a reader sees the old file or the new one, never half of one."""
        file = Path(path)
        file.parent.mkdir(parents=True, exist_ok=True)
        _atomic_write_text(file, self._tok.to_str(pretty=True))

    def save_pretrained(self, directory: PathLike, *, model_max_length: int | None = None) -> Path:
        """Write a folder from which ``transformers.AutoTokenizer`` gives the ids of :meth:`__call__`.

        Three files, each written atomically: ``tokenizer.json``; ``tokenizer_config.json`` (class
        ``PreTrainedTokenizerFast``, the special tokens that exist, ``model_max_length`` when given or
        known); ``special_tokens_map.json``. Without the config, transformers picks a tokenizer class from
        ``config.json``'s model_type instead (GPT-2's byte-level one for an exported gpt2), which splits
        and frames differently. Returns the folder.
        """
        limit = self.model_max_length if model_max_length is None else model_max_length
        if limit is not None and (not _is_int(limit) or limit < 1):
            raise ValueError(f"model_max_length must be an int >= 1 or None, got {limit!r}")
        backend = self._export_backend()
        specials = {
            f"{name}_token": self._tok.id_to_token(token_id)
            for name, token_id in self.special_ids().items()
            if token_id is not None
        }
        post_processor = json.loads(backend.to_str()).get("post_processor")
        config: dict[str, Any] = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            **specials,
            # Only what the model reads: GPT-2 in transformers would add token_type_ids through its wte.
            "model_input_names": [
                "input_ids",
                *(["token_type_ids"] if _has_segment_ids(post_processor) else []),
                "attention_mask",
            ],
            # transformers' extra cleanup would rewrite " ." as "." and make its decode differ from ours.
            "clean_up_tokenization_spaces": False,
            "padding_side": "right",
        }
        if limit is not None:
            config["model_max_length"] = limit
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        _atomic_write_text(out / "tokenizer.json", backend.to_str(pretty=True))
        _atomic_write_text(out / TOKENIZER_CONFIG, json.dumps(config, indent=2, ensure_ascii=False) + "\n")
        _atomic_write_text(
            out / "special_tokens_map.json", json.dumps(specials, indent=2, ensure_ascii=False) + "\n"
        )
        return out

    def _export_backend(self) -> HFTokenizer:
        """The backend to export: zoo's framing written as a post-processor when the tokenizer has none.

        transformers frames rows only through the post-processor, so without one ``AutoTokenizer`` would
        give ``[*ids]`` where :meth:`__call__` gives ``[*ids, eos]``. Built as JSON rather than from a
        template string, which cannot hold a token with ``:`` or spaces. All type ids are 0: zoo models have
        no segment embeddings.
        """
        eos = self.eos_id
        if self._tok.post_processor is not None or eos is None:
            return self._tok
        token = self._tok.id_to_token(eos)
        sequence = [{"Sequence": {"id": "A", "type_id": 0}}, {"SpecialToken": {"id": token, "type_id": 0}}]
        pair = [*sequence, {"Sequence": {"id": "B", "type_id": 0}}, sequence[1]]
        data = json.loads(self._tok.to_str())
        data["post_processor"] = {
            "type": "TemplateProcessing",
            "single": sequence,
            "pair": pair,
            "special_tokens": {token: {"id": token, "ids": [eos], "tokens": [token]}},
        }
        return HFTokenizer.from_str(json.dumps(data))

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

    # --- the batch interface of transformers ------------------------------------------------------------
    def __call__(
        self,
        text: str | Sequence[str],
        *,
        padding: Padding = False,
        truncation: Truncation = None,
        max_length: int | None = None,
        padding_side: Literal["right", "left"] = "right",
        return_tensors: Literal["pt"] | None = None,
        add_special_tokens: bool = True,
    ) -> dict[str, Any]:
        """Encode a text or a batch as transformers does: ``{"input_ids": ..., "attention_mask": ...}``.

        ``text``: one string (lists of ids, or (1, T) tensors) or a list of strings (lists of rows, or
        (B, T) int64 tensors with ``return_tensors="pt"``).

        Args:
            padding: False / "do_not_pad"; True / "longest" (to the longest row); "max_length" (to
                ``max_length``, longer rows left as they are). Pads with :attr:`pad_id`.
            truncation: True / "longest_first" / "only_first" cut each row to ``max_length`` tokens, special
                tokens included; None (the default) truncates when ``max_length`` is given without padding,
                as transformers does.
            max_length: the length for truncation and ``padding="max_length"``; default
                :attr:`model_max_length`.
            padding_side: "right", or "left" for decoder prompts (``generate`` needs them left-padded).
            return_tensors: None for lists, "pt" for torch tensors (rows must then have one length).
            add_special_tokens: frame each row. A tokenizer with a post-processor (BERT's ``[CLS] … [SEP]``,
                RoBERTa's, Llama's bos) frames as transformers does, giving ``AutoTokenizer``'s ids; one
                without (zoo-trained) gets zoo's ``[*ids, eos]``, as :meth:`encode`.

        Bad arguments raise ``ValueError`` naming the argument, before anything is encoded.
        """
        texts, single = _texts_arg(text)
        pad_to = _padding_arg(padding)
        truncate = _truncation_arg(truncation, max_length=max_length, padding=pad_to)
        if max_length is not None and (not _is_int(max_length) or max_length < 1):
            raise ValueError(f"max_length must be an int >= 1 or None, got {max_length!r}")
        if padding_side not in ("right", "left"):
            raise ValueError(f"padding_side must be 'right' or 'left', got {padding_side!r}")
        if return_tensors not in (None, "pt"):
            raise ValueError(
                f"return_tensors must be None (lists) or 'pt' (torch tensors), got {return_tensors!r}"
            )
        if not isinstance(add_special_tokens, bool):
            raise ValueError(f"add_special_tokens must be True or False, got {add_special_tokens!r}")
        limit = self.model_max_length if max_length is None else max_length
        if limit is None and (truncate or pad_to == "max_length"):
            wanted = f"truncation={truncation!r}" if truncate else "padding='max_length'"
            raise ValueError(f"{wanted} needs max_length (the tokenizer has no model_max_length)")
        pad_id = None
        if pad_to is not None:
            pad_id = self.pad_id
            if pad_id is None:
                looked_for = ", ".join(SPECIAL_TOKEN_ALIASES["pad"])
                raise ValueError(
                    f"padding={padding!r} needs a pad token but the tokenizer has none (looked for "
                    f"{looked_for}); pass padding=False"
                )

        rows = self._rows(texts, add_special_tokens=add_special_tokens, limit=limit if truncate else None)
        masks = [[1] * len(row) for row in rows]
        if pad_id is not None:
            width = limit if pad_to == "max_length" else max(map(len, rows), default=0)
            assert width is not None  # checked above: "max_length" padding has a limit
            for row, mask in zip(rows, masks):
                fill = max(width - len(row), 0)  # rows longer than max_length stay as they are
                at = 0 if padding_side == "left" else len(row)
                row[at:at] = [pad_id] * fill
                mask[at:at] = [0] * fill
        if return_tensors == "pt":
            return _as_tensors(rows, masks)
        if single:
            return {"input_ids": rows[0], "attention_mask": masks[0]}
        return {"input_ids": rows, "attention_mask": masks}

    def _rows(self, texts: list[str], *, add_special_tokens: bool, limit: int | None) -> list[list[int]]:
        """Framed ids of each text, each cut to ``limit`` tokens (special tokens included) when given."""
        encodings = self._tok.encode_batch(texts, add_special_tokens=False)
        processor = self._tok.post_processor if add_special_tokens else None
        eos = self.eos_id
        frame = [eos] if add_special_tokens and processor is None and eos is not None else []
        added = processor.num_special_tokens_to_add(False) if processor is not None else len(frame)
        if limit is not None and limit < added:
            raise ValueError(
                f"max_length ({limit}) is shorter than the {added} special tokens added to every row; "
                "raise it or pass add_special_tokens=False"
            )
        rows = []
        for encoding in encodings:
            if limit is not None and len(encoding.ids) > limit - added:
                # The text is cut, never the special tokens, as in transformers.
                encoding.truncate(limit - added)
            if processor is not None:
                encoding = self._tok.post_process(encoding, add_special_tokens=True)
            rows.append([*encoding.ids, *frame])
        return rows

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
        named = self._names.get(name)
        if named is not None and self._tok.token_to_id(named) is not None:
            return self._tok.token_to_id(named)
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


# --- helpers of the batch interface and of the transformers folder -----------------------------------------
TOKENIZER_CONFIG = "tokenizer_config.json"


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _texts_arg(text: object) -> tuple[list[str], bool]:
    """``text`` as a list of strings, and whether it was a single string."""
    if isinstance(text, str):
        return [text], True
    if isinstance(text, (list, tuple)):
        for i, item in enumerate(text):
            if not isinstance(item, str):
                raise ValueError(f"text must be a str or a list of str; text[{i}] is {type(item).__name__}")
        return list(text), False
    raise ValueError(f"text must be a str or a list of str, got {type(text).__name__}")


def _padding_arg(padding: object) -> Literal["longest", "max_length"] | None:
    if padding is True or padding == "longest":
        return "longest"
    if padding == "max_length":
        return "max_length"
    if padding is False or padding == "do_not_pad":
        return None
    raise ValueError(f"padding must be False, True, 'longest', 'max_length' or 'do_not_pad', got {padding!r}")


def _truncation_arg(truncation: object, *, max_length: int | None, padding: str | None) -> bool:
    if truncation is None:  # transformers' default: a max_length without padding means "truncate"
        return max_length is not None and padding is None
    if truncation is True or truncation in ("longest_first", "only_first"):
        return True
    if truncation is False or truncation == "do_not_truncate":
        return False
    raise ValueError(
        f"truncation must be None, True, False, 'longest_first', 'only_first' or 'do_not_truncate', "
        f"got {truncation!r}"
    )


def _as_tensors(rows: list[list[int]], masks: list[list[int]]) -> dict[str, torch.Tensor]:
    """(B, T) int64 tensors of equal-length rows."""
    import torch  # here, so that tokenizing without tensors does not import torch

    lengths = sorted({len(row) for row in rows})
    if len(lengths) > 1:
        raise ValueError(
            f"return_tensors='pt' needs rows of one length, but they have {lengths[0]} to {lengths[-1]} "
            "tokens; pass padding=True (or padding='max_length' with truncation=True)"
        )
    width = lengths[0] if lengths else 0
    ids = torch.tensor(rows, dtype=torch.int64).view(len(rows), width)  # (B, T), also for B == 0
    mask = torch.tensor(masks, dtype=torch.int64).view(len(rows), width)  # (B, T)
    return {"input_ids": ids, "attention_mask": mask}


def _has_segment_ids(post_processor: Any) -> bool:
    """Whether a post-processor (as JSON) gives a second segment its own type id, as BERT's does."""
    if isinstance(post_processor, dict):
        if post_processor.get("type") == "BertProcessing" or post_processor.get("type_id", 0) != 0:
            return True
        return any(_has_segment_ids(value) for value in post_processor.values())
    if isinstance(post_processor, list):
        return any(_has_segment_ids(value) for value in post_processor)
    return False


def _read_tokenizer_config(path: Path) -> tuple[int | None, dict[str, str]]:
    """``model_max_length`` and the special tokens named by a transformers ``tokenizer_config.json``."""
    if not path.is_file():
        return None, {}
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path} is not valid JSON: {err}") from err
    if not isinstance(config, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(config).__name__}")
    limit = config.get("model_max_length")
    limit = limit if _is_int(limit) and 0 < limit < _NO_LIMIT else None
    names = {}
    for name in SPECIAL_TOKENS:
        token = config.get(f"{name}_token")
        if isinstance(token, dict):  # a serialised AddedToken: {"content": "[PAD]", ...}
            token = token.get("content")
        if isinstance(token, str):
            names[name] = token
    return limit, names


def _atomic_write_text(file: Path, text: str) -> None:
    """Write ``text`` through a temporary file in the same folder, then rename it into place."""
    fd, tmp = tempfile.mkstemp(dir=file.parent, prefix=f".{file.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; a saved tokenizer is meant to be shared
        os.replace(tmp, file)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


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
