"""Incremental detokenization: turn tokens that arrive one by one into text that is safe to print.

Decoding each token alone loses text: Metaspace and WordPiece decoders drop the space that starts a word
when that word's token is the first they see (the README's old example printed ``willlikethebigmouse``),
and a byte-level token may hold half of a multi-byte character. :class:`TextStream` follows transformers'
``TextStreamer`` and vLLM's incremental detokenizer instead: it keeps every id, decodes a short window
that starts one emission back (so the first token of the window is one whose text is already out, and its
dropped space does not matter), and emits only what the new tokens added, once it no longer ends in an
incomplete character (``"\\ufffd"``)::

    ids:      … | already emitted | emitted last time | new tokens
                                  ^prefix             ^read
    emit = decode(ids[prefix:])[len(decode(ids[prefix:read])):]

Pieces joined equal ``tokenizer.decode(all_ids)`` for decoders whose text only grows at the end (Metaspace,
byte-level, WordPiece without BERT's "cleanup" pass, which may rewrite already emitted text such as
``" ' s"``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Protocol

import torch

from zoo.generation.config import GenerationConfig
from zoo.generation.constrain import Grammar
from zoo.generation.generate import Compile, iterate, prepare_stream, resolve_grammar
from zoo.generation.protocol import GenerativeModel

__all__ = ["TextStream", "stream_text"]

# Tokens of the prompt kept as the window's context (as vLLM does): enough for the first new token to keep
# the space before it, few enough that the first decode stays cheap for a long prompt.
PROMPT_CONTEXT = 5


class Decoder(Protocol):
    """What `TextStream` needs of a tokenizer: a zoo `Tokenizer`, or a transformers one."""

    def decode(self, ids: list[int], *, skip_special_tokens: bool = ...) -> str: ...


class TextStream:
    """Text of a growing sequence of token ids, emitted piece by piece as soon as it is stable.

    One stream per row of a batch. ``push`` takes the new ids and returns the new text (maybe ``""``);
    ``flush`` returns what is still held back, at the end. ``prompt_ids`` (a decoder's prompt) gives context
    only: its text is not emitted, but the first new word keeps the space before it.

    >>> text = TextStream(tokenizer)
    >>> for token in ids:
    ...     print(text.push(token), end="", flush=True)
    >>> print(text.flush())
    """

    def __init__(
        self,
        tokenizer: Decoder,
        *,
        prompt_ids: Iterable[int] | torch.Tensor = (),
        skip_special_tokens: bool = True,
    ) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        context = _ids(prompt_ids)[-PROMPT_CONTEXT:]
        self._ids: list[int] = context
        self._prefix = 0  # start of the decode window
        self._read = len(context)  # end of what has been emitted (or is the prompt)
        self._context_text = self._decode(context)
        self._emitted: list[str] = []

    @property
    def text(self) -> str:
        """Everything emitted so far."""
        return "".join(self._emitted)

    def push(self, token_ids: int | Iterable[int] | torch.Tensor) -> str:
        """Add ids (an int, a list, or a 0-d / 1-d tensor) and return the text that became stable."""
        self._ids.extend(_ids(token_ids))
        prefix = self._decode(self._ids[self._prefix : self._read])
        text = self._decode(self._ids[self._prefix :])
        # Hold back: nothing new (special tokens), half a character, or a decoder that rewrote earlier text.
        if len(text) <= len(prefix) or text.endswith("\ufffd") or not text.startswith(prefix):
            return ""
        return self._emit(text[len(prefix) :])

    def flush(self) -> str:
        """The text still held back (an unfinished character comes out as ``"\\ufffd"``); call at the end."""
        if self._read == len(self._ids):
            return ""
        # One full decode, so that what was emitted plus this equals decode(all ids) whenever it can.
        full = self._decode(self._ids)
        done = self._context_text + self.text
        if full.startswith(done):
            return self._emit(full[len(done) :])
        prefix = self._decode(self._ids[self._prefix : self._read])
        text = self._decode(self._ids[self._prefix :])
        return self._emit(text[len(prefix) :] if text.startswith(prefix) else "")

    def _emit(self, piece: str) -> str:
        self._prefix, self._read = self._read, len(self._ids)
        self._emitted.append(piece)
        return piece

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens) if ids else ""


def stream_text(
    model: GenerativeModel,
    tokenizer: Decoder,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    config: GenerationConfig | None = None,
    *,
    decoder_input_ids: torch.Tensor | None = None,
    decoder_attention_mask: torch.Tensor | None = None,
    skip_special_tokens: bool = True,
    generator: torch.Generator | None = None,
    compile: Compile = False,
    json_schema: Mapping[str, Any] | str | None = None,
    grammar: Grammar | None = None,
    assistant_model: GenerativeModel | None = None,
    **overrides: Any,
) -> Iterator[list[str]]:
    """Like `zoo.generation.stream`, but yield each step's new text: a list of B strings (B * n with
    ``num_return_sequences`` = n; ``""`` when a row has nothing stable to show yet). Once a row ends (eos)
    its last text is flushed; a final item flushes the rest, when there is any.

    A decoder's prompt, or an encoder-decoder's decoder prompt (the real tokens of each row), is context, so
    a continuation keeps its first space. Arguments are checked when `stream_text` is called, as `stream`
    does. ``json_schema`` / ``grammar``: structured output, as `zoo.generation.generate` (with this tokenizer).

    >>> for pieces in stream_text(model, tokenizer, prompt, max_new_tokens=40):
    ...     print(pieces[0], end="", flush=True)
    """
    run = prepare_stream(
        model,
        input_ids,
        attention_mask,
        config,
        overrides,
        generator,
        compile,
        decoder_input_ids=decoder_input_ids,
        decoder_attention_mask=decoder_attention_mask,
        grammar=resolve_grammar(json_schema, grammar, tokenizer),
        tokenizer=tokenizer,
        assistant_model=assistant_model,
    )
    eos = set(run.eos.tolist()) if run.eos is not None else set()
    if run.model.continues_input:  # the prompt is the beginning of the text
        prompts = _real_rows(run.input_ids, run.attention_mask)
    elif run.decoder_prompt is not None:  # so is a decoder prompt (a source is not)
        prompts = _real_rows(*run.decoder_prompt)
    else:
        prompts = [[] for _ in range(run.input_ids.shape[0])]
    rows = [p for p in prompts for _ in range(run.config.rows_per_input)]  # an input's samples together
    streams = [TextStream(tokenizer, prompt_ids=p, skip_special_tokens=skip_special_tokens) for p in rows]
    return _pieces(iterate(run), streams, eos)


def _real_rows(ids: torch.Tensor, mask: torch.Tensor | None) -> list[list[int]]:
    """Each row of ``ids`` (B, T) without its (left) padding."""
    real = torch.ones_like(ids, dtype=torch.bool) if mask is None else mask.bool()
    return [row[keep].tolist() for row, keep in zip(ids, real)]


def _pieces(steps: Iterator[torch.Tensor], streams: list[TextStream], eos: set[int]) -> Iterator[list[str]]:
    ended = [False] * len(streams)
    for tokens in steps:  # (B,)
        pieces = []
        for i, token in enumerate(tokens.tolist()):
            if ended[i]:  # finished rows are padded: nothing more to show
                pieces.append("")
                continue
            piece = streams[i].push(token)
            ended[i] = token in eos
            pieces.append(piece + streams[i].flush() if ended[i] else piece)
        yield pieces
    rest = [text.flush() if not done else "" for text, done in zip(streams, ended)]
    if any(rest):
        yield rest


def _ids(value: int | Iterable[int] | torch.Tensor) -> list[int]:
    """Ids as a list of ints; tensors (0-d or 1-d) and numpy scalars are accepted."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, int):
        return [value]
    return [int(i) for i in value]
