"""Structured output: a grammar (a JSON schema, any JSON object, a regex, a choice of strings, a Lark grammar)
held by each sequence as a token mask, applied to its row of logits before the next token is chosen.

Shapes: R rows of a step, V the model's vocabulary, W = ceil(V / 32) words of a row's bitmask.

    grammar = Grammar.json_schema({"type": "object", ...})         # checked when made: GrammarError
    vocab = vocabulary(tokenizer, model.spec.vocab_size)           # once per tokenizer (cached)
    rows = [Constraint(grammar, vocab, stop=(eos,)) for _ in range(R)]
    scores = constrain(logits, rows)     # (R, V): -inf where a row's grammar forbids; None rows untouched
    for row, token in zip(rows, tokens): row.advance(token)
    row.done                             # nothing but an end token may follow: the text is complete

The engine is llguidance (Microsoft's, the one vLLM, SGLang and llama.cpp use; the ``grammar`` extra): a
small Rust wheel with no dependencies, CPU-native (its mask is computed on the CPU, a few microseconds a
token, while the model's step runs); xgrammar pulls triton and transformers, outlines-core builds a regex
index per schema up front. A sequence's stop tokens (the model's eos, a chat template's end of turn) are
allowed where the grammar accepts the text so far, and are the only tokens allowed once it is complete.

JSON is written without free whitespace, with json.dumps' separators (``{"a": 1, "b": [2, 3]}``): a model
cannot loop on spaces or newlines between tokens, and the text is the one most JSON in training data has.
"""

from __future__ import annotations

import json
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from zoo._extras import install_hint

# llguidance's JSON options: json.dumps' separators, no other whitespace (see the module docstring)
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class GrammarError(ValueError):
    """A grammar the engine cannot compile, or a text it cannot continue: one line, the engine's reason."""


class GrammarMissing(ImportError):
    """Structured output asked for where llguidance (the ``grammar`` extra) is not installed."""


MISSING = f"structured output needs llguidance: {install_hint('grammar')}"


def _llguidance() -> Any:
    try:
        import llguidance
    except ImportError:
        raise GrammarMissing(MISSING) from None
    return llguidance


@dataclass(frozen=True)
class Grammar:
    """A grammar in the engine's form (``source``), checked when made; ``kind`` says what it came from."""

    kind: str  # "json_schema", "json_object", "regex", "choice" or "lark"
    source: str

    @classmethod
    def json_schema(cls, schema: Mapping[str, Any] | str) -> Grammar:
        """The JSON texts ``schema`` (a JSON Schema, as a dict or as JSON text) validates."""
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as error:
                raise GrammarError(f"the JSON schema is not valid JSON: {error}") from None
        if not isinstance(schema, Mapping):
            raise GrammarError(f"a JSON schema must be an object, got {type(schema).__name__}")
        llg = _llguidance()
        try:
            source = llg.LLMatcher.grammar_from_json_schema(dict(schema), overrides=JSON_OPTIONS)
        except ValueError as error:
            raise GrammarError(f"the JSON schema cannot be compiled: {_one_line(error)}") from None
        return cls._checked("json_schema", source)

    @classmethod
    def json_object(cls) -> Grammar:
        """Any JSON object (OpenAI's ``response_format: {type: json_object}``)."""
        return cls.json_schema({"type": "object"})._as("json_object")

    @classmethod
    def regex(cls, pattern: str) -> Grammar:
        """The texts the regular expression ``pattern`` matches whole (Rust's regex syntax)."""
        return cls._checked("regex", _llguidance().LLMatcher.grammar_from_regex(pattern))

    @classmethod
    def choice(cls, options: Sequence[str]) -> Grammar:
        """Exactly one of ``options`` (non-empty strings)."""
        if not options or not all(isinstance(o, str) and o for o in options):
            raise GrammarError("a choice must be a non-empty list of non-empty strings")
        lark = "start: " + " | ".join(json.dumps(option) for option in options)
        return cls._checked("choice", _llguidance().LLMatcher.grammar_from_lark(lark))

    @classmethod
    def lark(cls, text: str) -> Grammar:
        """A Lark grammar in llguidance's dialect (``start`` is the text; ``%json {...}`` embeds a JSON
        schema; ``<|name|>`` matches a special token), e.g. a tool call framed by a template's tags."""
        return cls._checked("lark", _llguidance().LLMatcher.grammar_from_lark(text))

    @classmethod
    def _checked(cls, kind: str, source: str) -> Grammar:
        reason = _llguidance().LLMatcher.validate_grammar(source)
        if reason:
            raise GrammarError(f"the {kind.replace('_', ' ')} cannot be compiled: {_one_line(reason)}")
        return cls(kind, source)

    def _as(self, kind: str) -> Grammar:
        return Grammar(kind, self.source)


def _one_line(reason: object) -> str:
    """The engine's reason on one line, without its state dump."""
    return " ".join(str(reason).split("<state>")[0].split())


class Vocabulary:
    """What the engine needs of a tokenizer: each token's bytes, for a model of ``size`` logits (V); ids past
    the tokenizer's (a vocabulary padded to a multiple of 64) are never allowed. Built by `vocabulary`."""

    def __init__(self, engine_tokenizer: Any, size: int) -> None:
        self.engine = engine_tokenizer  # llguidance.LLTokenizer
        self.size = size  # V


_VOCABULARIES: weakref.WeakKeyDictionary[Any, dict[int, Vocabulary]] = weakref.WeakKeyDictionary()


def vocabulary(tokenizer: Any, size: int) -> Vocabulary:
    """The `Vocabulary` of ``tokenizer`` (zoo's `Tokenizer`, a ``tokenizers.Tokenizer`` or a transformers
    fast tokenizer) for a model of ``size`` logits, built once (about a second for 128k tokens) and cached."""
    held = _VOCABULARIES.setdefault(tokenizer, {})
    if size not in held:
        held[size] = Vocabulary(_engine_tokenizer(_backend(tokenizer), size), size)
    return held[size]


def _backend(tokenizer: Any) -> Any:
    """The ``tokenizers.Tokenizer`` behind ``tokenizer``."""
    for name in ("hf", "backend_tokenizer"):  # zoo's Tokenizer, transformers' fast tokenizers
        inner = getattr(tokenizer, name, None)
        if inner is not None:
            return inner
    if hasattr(tokenizer, "to_str") and hasattr(tokenizer, "id_to_token"):
        return tokenizer
    raise GrammarError(
        f"structured output needs a tokenizer backed by a tokenizer.json, got {type(tokenizer).__name__}"
    )


def _engine_tokenizer(backend: Any, size: int) -> Any:
    """llguidance's tokenizer for ``backend``, with ``size`` + 1 ids (or the tokenizer's, if more): the
    last one, past the model's, is the engine's own end token (allowed where the grammar accepts), which
    `Constraint` replaces by a request's stop tokens.

    Each token's bytes: llguidance reads byte-level BPE (GPT-2, Llama 3, Qwen) and byte-fallback (Llama 2)
    tokenizers itself; the ``▁``-marked (Metaspace) BPE and Unigram tokenizers zoo trains are read here."""
    llg = _llguidance()
    known = backend.get_vocab_size(with_added_tokens=True)
    total = max(size, known) + 1
    try:
        native = llg.LLTokenizer(backend.to_str())
    except ValueError:
        native = None
    if native is not None:
        special = {i for i in range(known) if native.is_special_token(i)}
        tokens = [native.decode_bytes([i]) for i in range(known)]
        encode = native.tokenize_bytes
    else:
        decoder = (json.loads(backend.to_str()).get("decoder") or {}).get("type")
        if decoder != "Metaspace":
            raise GrammarError(
                f"structured output cannot read this tokenizer's tokens as bytes (its decoder is {decoder!r}; "
                "byte-level BPE, byte fallback and Metaspace are read)"
            )
        special = {i for i, added in backend.get_added_tokens_decoder().items() if added.special}
        tokens = [(backend.id_to_token(i) or "").replace("▁", " ").encode() for i in range(known)]

        def encode(text: bytes) -> list[int]:
            spaced = text.decode("utf-8", errors="replace").replace(" ", "▁")
            return [t.id for t in backend.model.tokenize(spaced)]

    tokens = [b"\xff" + t if i in special else t for i, t in enumerate(tokens)]  # llguidance's special mark
    tokens += [b""] * (total - known)  # ids past the tokenizer's: never allowed

    class Tokens:  # what llguidance.TokenizerWrapper reads
        eos_token_id = total - 1
        bos_token_id = None
        special_token_ids = sorted(special)

        def __init__(self) -> None:
            self.tokens = tokens

        def __call__(self, text: bytes) -> list[int]:
            return encode(text)

    return llg.LLTokenizer(llg.TokenizerWrapper(Tokens()))


class TokenConstraint(Protocol):
    """One sequence's constraint on its next token (`Constraint` is the grammar's; a caller may write its own).

    ``fill`` writes the tokens allowed next into a bitmask row; ``advance`` takes the token chosen; ``done``
    says that nothing but a stop token may follow (a server ends the text there)."""

    def fill(self, bits: torch.Tensor) -> None:
        """Write the allowed tokens into ``bits`` (W,) int32 on the CPU: token t is bit t % 32 of word
        t // 32 (a set bit: allowed)."""

    def advance(self, token: int) -> None:
        """The sequence continues with ``token`` (allowed by the last ``fill``)."""

    @property
    def done(self) -> bool:
        """Nothing but a stop token may follow (the text is complete, or a stop token ended it)."""


class Constraint:
    """A sequence held to ``grammar``: its tokens so far and what may follow. ``stop``: the tokens that end
    the sequence (the model's eos, a template's end of turn), allowed where the grammar accepts the text."""

    def __init__(self, grammar: Grammar, vocab: Vocabulary, *, stop: Sequence[int] = ()) -> None:
        llg = _llguidance()
        self.vocab = vocab
        self.stop = tuple(s for s in stop if 0 <= s < vocab.size)
        self.matcher = llg.LLMatcher(vocab.engine, grammar.source)
        self._bits = torch.empty((vocab.engine.vocab_size + 31) // 32, dtype=torch.int32)  # the engine's row
        if self.matcher.is_error():
            raise GrammarError(f"the {grammar.kind.replace('_', ' ')}: {_one_line(self.matcher.get_error())}")
        self.ended = False  # a stop token was taken

    @property
    def done(self) -> bool:
        return self.ended or self.matcher.is_stopped()

    @property
    def accepting(self) -> bool:
        """The text so far is complete by the grammar (it may go on, or stop here)."""
        return self.ended or self.matcher.is_accepting()

    def fill(self, bits: torch.Tensor) -> None:
        if self.ended:
            bits.zero_()
        else:
            self.matcher.unsafe_compute_mask_ptr(self._bits.data_ptr(), self._bits.numel() * 4)
            if self.matcher.is_error():
                raise GrammarError(f"structured output: {_one_line(self.matcher.get_error())}")
            bits.copy_(self._bits[: bits.numel()])  # the engine's ids past the model's V are cut
        # A stop token ends the text: allowed only where the grammar accepts it, even when its bytes would
        # spell a valid continuation (a model whose eos is an ordinary token, such as "#").
        accepting = self.accepting
        for token in self.stop:
            word, bit = divmod(token, 32)
            if accepting:
                bits[word] |= _bit(bit)
            else:
                bits[word] &= ~_bit(bit)

    def advance(self, token: int) -> None:
        if self.ended:
            return
        if token in self.stop:
            self.ended = True
        elif not self.matcher.consume_token(token):
            raise GrammarError(f"structured output: token {token}: {_one_line(self.matcher.get_error())}")


def _bit(bit: int) -> int:
    """1 << bit as an int32 (bit 31 is the sign)."""
    return 1 << bit if bit < 31 else -(1 << 31)


_SHIFTS: dict[torch.device, torch.Tensor] = {}


def constrain(
    scores: torch.Tensor,
    constraints: Sequence[TokenConstraint | None],
    failures: dict[int, str] | None = None,
) -> torch.Tensor:
    """scores (R, V) -> scores (R, V) with -inf where a row's constraint forbids the token; a row whose
    constraint is None is untouched (the same values). A new tensor: ``scores`` is not changed.

    The bitmasks of the k constrained rows are filled on the CPU (a loop over those rows: the engine's work
    per request), unpacked on the scores' device in one step. A row whose grammar fails (no token may
    continue it) raises `GrammarError`, or, given ``failures``, is recorded there (row -> message) and left
    unmasked: a server fails that request alone, not the batch beside it."""
    picked = [i for i, c in enumerate(constraints) if c is not None]
    if not picked:
        return scores
    R, V = scores.shape
    W = (V + 31) // 32
    bits = torch.empty(len(picked), W, dtype=torch.int32)  # (k, W)
    for row, i in enumerate(picked):
        constraint = constraints[i]
        assert constraint is not None
        try:
            constraint.fill(bits[row])
        except GrammarError as error:
            if failures is None:
                raise
            failures[i] = str(error)
            bits[row] = -1  # every token: the row's choice is thrown away with its request
    device = scores.device
    if device not in _SHIFTS:
        _SHIFTS[device] = torch.arange(32, dtype=torch.int32, device=device)
    unpacked = (bits.to(device)[:, :, None] >> _SHIFTS[device]) & 1  # (k, W, 32)
    allowed = unpacked.flatten(1)[:, :V].bool()  # (k, V)
    empty = ~allowed.any(dim=1)  # (k,)
    if bool(empty.any()):
        rows = [picked[k] for k in empty.nonzero().flatten().tolist()]
        message = "structured output: no token may continue the text (and it has no stop token)"
        if failures is None:
            raise GrammarError(f"{message}: row {rows[0]}")
        failures.update(dict.fromkeys(rows, message))
        allowed[empty] = True
    index = torch.tensor(picked, device=device)
    every = torch.ones(R, V, dtype=torch.bool, device=device)
    every[index] = allowed
    return scores.masked_fill(~every, float("-inf"))
