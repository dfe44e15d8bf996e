"""A ``tokenizer.json`` as GGUF tokenizer metadata (``tokenizer.ggml.*``, ``tokenizer.chat_template``).

Two kinds of BPE tokenizer are expressible, told apart by how the tokenizer marks spaces:

    byte-level BPE (GPT-2, Llama 3, Qwen2)     ByteLevel pre-tokenizer   tokenizer.ggml.model "gpt2" + merges
    SentencePiece-style BPE (Llama 2, Mistral,  Metaspace "▁"              tokenizer.ggml.model "llama" + scores
    Gemma, zoo's own trained "bpe")

A byte-level tokenizer's pre-tokenizer split is named for llama.cpp (``tokenizer.ggml.pre``): GPT-2's own
regex, Llama 3's or Qwen2's; any other split, WordPiece and Unigram tokenizers are refused by name. A
SentencePiece-style token's score is minus the rank of the merge that makes it (llama.cpp merges the pair
whose result scores highest, which is BPE's order), and its merges are written too. Token types: special
added tokens are control tokens, other added tokens user-defined, ``<0xNN>`` byte-fallback tokens bytes.
A vocabulary shorter than the model's embedding table is padded with ``[PAD{id}]`` tokens, unused.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from zoo.export.errors import ExportError
from zoo.export.gguf.arches import ValueKind
from zoo.io.tokenizer import Tokenizer

# llama.cpp's token types (gguf.TokenType)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

_GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)
# A byte-level tokenizer's split regex -> llama.cpp's name for it (tokenizer.ggml.pre)
PRE_TOKENIZERS = {_GPT2_SPLIT: "gpt-2", _LLAMA3_SPLIT: "llama-bpe", _QWEN2_SPLIT: "qwen2"}


@dataclass(frozen=True)
class Entry:
    """One metadata key and its value; ``kind`` is the GGUF type (an array's element type for a list)."""

    key: str
    value: Any
    kind: ValueKind


def vocab_metadata(
    tokenizer: Tokenizer, *, vocab_size: int, add_bos: bool, special_ids: dict[str, int | None]
) -> list[Entry]:
    """The ``tokenizer.*`` entries for ``tokenizer`` feeding a model of ``vocab_size`` embeddings.

    ``add_bos``: whether a prompt starts with bos (llama.cpp's ``add_bos_token``); ``special_ids``: bos, eos,
    unk and pad ids where the tokenizer names none (the model spec's).
    """
    doc = json.loads(tokenizer.hf.to_str())
    model = doc.get("model") or {}
    if model.get("type") != "BPE":
        raise ExportError(
            f"{tokenizer.source}: a {model.get('type', 'unknown')} tokenizer has no GGUF form llama.cpp reads "
            "(byte-level or SentencePiece-style BPE only)"
        )
    byte_level = _has(doc.get("pre_tokenizer"), "ByteLevel")
    if not byte_level and not (_has(doc.get("pre_tokenizer"), "Metaspace") or _replaces_spaces(doc)):
        raise ExportError(
            f"{tokenizer.source}: a BPE tokenizer that marks spaces neither byte-level (GPT-2) nor with "
            "SentencePiece's '▁' has no GGUF form llama.cpp reads"
        )
    size = tokenizer.hf.get_vocab_size(with_added_tokens=True)
    if size > vocab_size:
        raise ExportError(f"{tokenizer.source}: {size} tokens, more than the model's {vocab_size} embeddings")
    by_id = {i: t for t, i in tokenizer.hf.get_vocab(with_added_tokens=True).items()}
    added = {a["id"]: bool(a.get("special")) for a in doc.get("added_tokens") or []}
    tokens, types = [], []
    for i in range(vocab_size):
        token = by_id.get(i)
        if token is None:
            tokens.append(f"[PAD{i}]")
            types.append(UNUSED)
        else:
            tokens.append(token)
            types.append(_token_type(token, i, added, byte_level, model.get("unk_token")))
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges") or []]
    ids = {name: tokenizer.special_ids().get(name) for name in ("bos", "eos", "unk", "pad")}
    ids = {name: value if value is not None else special_ids.get(name) for name, value in ids.items()}
    entries = [
        Entry("tokenizer.ggml.model", "gpt2" if byte_level else "llama", "str"),
        Entry("tokenizer.ggml.tokens", tokens, "str"),
        Entry("tokenizer.ggml.token_type", types, "i32"),
        Entry("tokenizer.ggml.merges", merges, "str"),
    ]
    if byte_level:
        entries.append(Entry("tokenizer.ggml.pre", _pre_name(tokenizer, doc), "str"))
    else:
        entries.append(Entry("tokenizer.ggml.scores", _scores(tokens, merges), "f32"))
        entries.append(Entry("tokenizer.ggml.add_space_prefix", True, "bool"))
    entries += special_entries(ids)
    entries += [
        Entry("tokenizer.ggml.add_bos_token", add_bos and ids["bos"] is not None, "bool"),
        Entry("tokenizer.ggml.add_eos_token", False, "bool"),
    ]
    if tokenizer.chat_template is not None:
        entries.append(Entry("tokenizer.chat_template", tokenizer.chat_template, "str"))
    return entries


def special_entries(ids: dict[str, int | None]) -> list[Entry]:
    """The bos / eos / unk / pad ids that are set (llama.cpp and transformers read them from here)."""
    keys = {
        "bos": "bos_token_id",
        "eos": "eos_token_id",
        "unk": "unknown_token_id",
        "pad": "padding_token_id",
    }
    return [Entry(f"tokenizer.ggml.{keys[n]}", v, "u32") for n, v in ids.items() if v is not None]


def _has(node: Any, kind: str) -> bool:
    """Whether a pre-tokenizer (or a Sequence of them) includes one of type ``kind``."""
    if not isinstance(node, dict):
        return False
    return node.get("type") == kind or any(_has(child, kind) for child in node.get("pretokenizers") or [])


def _replaces_spaces(doc: dict[str, Any]) -> bool:
    """Llama 2's tokenizer.json marks spaces in its normalizer: Replace " " -> "▁"."""
    text = json.dumps(doc.get("normalizer") or {}, ensure_ascii=False)
    return '"Replace"' in text and "\u2581" in text


def _token_type(token: str, i: int, added: dict[int, bool], byte_level: bool, unk: str | None) -> int:
    if i in added:
        return CONTROL if added[i] else USER_DEFINED
    if not byte_level and token == unk:
        return UNKNOWN
    if not byte_level and len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
        return BYTE
    return NORMAL


def _pre_name(tokenizer: Tokenizer, doc: dict[str, Any]) -> str:
    """llama.cpp's name for a byte-level tokenizer's split: its own regex (a Split pre-tokenizer) or
    GPT-2's (ByteLevel with use_regex)."""
    splits = _splits(doc.get("pre_tokenizer"))
    if not splits:
        return "gpt-2"
    name = PRE_TOKENIZERS.get(splits[0])
    if name is None or len(splits) > 1:
        raise ExportError(
            f"{tokenizer.source}: its pre-tokenizer split {splits[0][:60]!r}... is none llama.cpp names "
            f"(GPT-2's, Llama 3's or Qwen2's)"
        )
    return name


def _splits(node: Any) -> list[str]:
    """The regexes of a pre-tokenizer's Split steps, and GPT-2's when a ByteLevel step splits itself."""
    if not isinstance(node, dict):
        return []
    if node.get("type") == "Sequence":
        return [r for child in node.get("pretokenizers") or [] for r in _splits(child)]
    if node.get("type") == "Split":
        return [str((node.get("pattern") or {}).get("Regex", ""))]
    if node.get("type") == "ByteLevel" and node.get("use_regex", True):
        return [_GPT2_SPLIT]
    return []


def _scores(tokens: list[str], merges: list[str]) -> list[float]:
    """SentencePiece scores that make llama.cpp merge in BPE's order: minus the rank of the merge that
    makes each token; a token no merge makes (a character, a special token) scores 0."""
    rank: dict[str, int] = {}
    for r, merge in enumerate(merges):
        rank.setdefault(merge.replace(" ", ""), r)
    return [-float(rank[t] + 1) if t in rank else 0.0 for t in tokens]
