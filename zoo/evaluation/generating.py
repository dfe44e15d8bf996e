"""Generation for lm-eval's ``generate_until``: a batch of prompts, left-padded, continued with the KV cache
until each row has produced a stop string, its end-of-sequence token, or ``max_new_tokens``.

Stop strings are text, not tokens, so they are looked for in decoded text: after each step, the last few
tokens of each row still going are decoded together (``lookback`` tokens, enough to hold the longest stop
string) and a row whose tail shows one is done; the search ends when every row is. What a row returns is
its new tokens up to its end-of-sequence token, decoded without special tokens, cut before the first
occurrence of each stop string in turn (as lm-eval cuts them) — so when the search ends changes how much
is generated, never the text returned.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain
from typing import TYPE_CHECKING, Any

import torch

from zoo.generation import stream

if TYPE_CHECKING:
    from zoo.io.tokenizer import Tokenizer
    from zoo.models.base import ZooModel

# Tokens decoded per step beyond the longest stop string's characters: a token is at least one character,
# except special tokens (skipped) and byte pieces of one character; a stop string missed in the tail is
# still cut from the text at the end, it only costs steps.
_LOOKBACK_SLACK = 4


def left_padded(rows: Sequence[Sequence[int]], *, pad_id: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Prompts -> (B, T) ids padded on the left, and the (B, T) attention mask (None when no row is padded,
    so attention takes its unmasked path)."""
    lengths = torch.tensor([len(row) for row in rows], dtype=torch.long)  # (B,)
    width = int(lengths.max())
    real = torch.arange(width) >= (width - lengths).unsqueeze(1)  # (B, T) True = a token, on the right
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    ids[real] = torch.tensor(list(chain.from_iterable(rows)), dtype=torch.long)  # row-major, as `real`
    return ids, (real.long() if int(lengths.min()) < width else None)


def cut_at_stops(text: str, stops: Sequence[str]) -> str:
    """``text`` before the first occurrence of each stop string, in the order given (empty ones ignored)."""
    for stop in stops:
        if stop:
            text = text.split(stop, 1)[0]
    return text


def generate_until(
    model: ZooModel,
    tokenizer: Tokenizer,
    prompts: Sequence[Sequence[int]],
    *,
    stops: Sequence[str],
    max_new_tokens: int,
    eos_id: int | None,
    pad_id: int,
    settings: dict[str, Any],
) -> list[str]:
    """The continuation text of each prompt (ids, left-padded here), cut at ``stops``.

    ``settings`` are `zoo.generation.GenerationConfig` fields (``do_sample``, ``temperature``, ``top_p``...).
    """
    ids, mask = left_padded(prompts, pad_id=pad_id)  # (B, T), (B, T) or None
    B = ids.shape[0]
    stops = [stop for stop in stops if stop]
    lookback = max((len(stop) for stop in stops), default=0) + _LOOKBACK_SLACK
    new = torch.empty(B, max_new_tokens, dtype=torch.long)  # (B, max_new) the tokens so far, on the host
    done = torch.zeros(B, dtype=torch.bool)  # (B,) ended: eos, or a stop string in its text
    eos = [eos_id] if eos_id is not None else []
    steps = 0
    net: Any = model  # a ZooModel is a GenerativeModel; mypy sees its nn.Module attributes as Tensor | Module
    tokens_of: Any = stream(  # a generator: closed when every row is done
        net, ids, mask, max_new_tokens=max_new_tokens, eos_token_id=eos, pad_token_id=pad_id, **settings
    )
    for tokens in tokens_of:  # (B,) one step
        new[:, steps] = tokens.cpu()
        steps += 1
        if eos_id is not None:
            done |= new[:, steps - 1] == eos_id
        if stops:
            _mark_stopped(tokenizer, new[:, :steps], done, stops, lookback)
            if bool(done.all()):
                tokens_of.close()  # the stream's generator: frees its session now
                break
    generated = new[:, :steps]  # (B, n)
    ends = generated == eos_id if eos_id is not None else torch.zeros_like(generated, dtype=torch.bool)
    # Each row's length: up to its first eos (exclusive), else all n.
    lengths = torch.where(ends.any(dim=1), ends.int().argmax(dim=1), steps).tolist()
    rows = [row[:length] for row, length in zip(generated.tolist(), lengths, strict=True)]
    texts = tokenizer.hf.decode_batch(rows, skip_special_tokens=True)
    return [cut_at_stops(text, stops) for text in texts]


def _mark_stopped(
    tokenizer: Tokenizer, generated: torch.Tensor, done: torch.Tensor, stops: Sequence[str], lookback: int
) -> None:
    """Set ``done`` for the rows of ``generated`` (B, n) whose text now holds a stop string."""
    going = (~done).nonzero().squeeze(1)  # (G,)
    if not len(going):
        return
    tails = tokenizer.hf.decode_batch(generated[going, -lookback:].tolist(), skip_special_tokens=True)
    for row, tail in zip(going.tolist(), tails, strict=True):
        if any(stop in tail for stop in stops):
            # A tail's first token may decode differently alone (a word-start marker): the whole text decides.
            text = tokenizer.hf.decode(generated[row].tolist(), skip_special_tokens=True)
            done[row] = any(stop in text for stop in stops)
