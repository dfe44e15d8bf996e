"""Log-probabilities: computed for many rows at once inside the engine's step, and written in OpenAI's shapes.

Shapes: N scored positions (a step's rows, or a prompt chunk's positions), V vocab, k alternatives.

The values are the model's own: a log-softmax of its logits in float32, before any logits processor,
temperature or truncation (as vLLM reports by default), so they do not depend on the sampling settings.
A position's token and its ``k`` best alternatives come from one ``log_softmax`` + ``gather`` + ``topk``
over all N rows, and one copy to the host.

Two shapes on the wire (`completion_logprobs`, `chat_logprobs`):

    completions   {"tokens": [...], "token_logprobs": [...], "top_logprobs": [{text: logprob}], "text_offset"}
                  top_logprobs holds the k best and the chosen token (up to k + 1, as OpenAI's legacy API);
                  the first prompt token (echo) has null for both.
    chat          {"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob",
                  "bytes"}]}], "refusal": null}, top_logprobs the k best.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from zoo.serving.requests import TokenLogprob

FLOOR = -9999.0  # a log-probability of -inf is no JSON number: reported as this (vLLM's choice too)


def score(logits: torch.Tensor, targets: torch.Tensor, top: int) -> list[TokenLogprob]:
    """logits (N, V) and the token taken at each row (N,) -> each token's log-probability with the ``top``
    most likely tokens of its row."""
    logp = logits.float().log_softmax(dim=-1).clamp(min=FLOOR)  # (N, V)
    chosen = logp.gather(1, targets[:, None].long()).squeeze(1).tolist()  # (N,)
    ids = targets.tolist()
    if top == 0:
        return [TokenLogprob(t, c) for t, c in zip(ids, chosen)]
    values, indices = logp.topk(min(top, logp.shape[-1]), dim=-1)  # (N, k) best first
    return [
        TokenLogprob(t, c, tuple(zip(i, v)))
        for t, c, i, v in zip(ids, chosen, indices.tolist(), values.tolist())
    ]


def _text(tokenizer: Any, token: int) -> str:
    return str(tokenizer.decode([token], skip_special_tokens=False))


def completion_logprobs(
    tokenizer: Any, entries: Sequence[TokenLogprob], *, top: int, offset: int = 0
) -> dict[str, Any]:
    """OpenAI's legacy completions ``logprobs`` of ``entries``: ``top`` alternatives a position plus the
    chosen token; ``text_offset`` counts characters from ``offset`` (where the entries' text starts)."""
    tokens: list[str] = []
    token_logprobs: list[float | None] = []
    tops: list[dict[str, float] | None] = []
    offsets: list[int] = []
    for entry in entries:
        text = _text(tokenizer, entry.token)
        tokens.append(text)
        token_logprobs.append(entry.logprob)
        offsets.append(offset)
        offset += len(text)
        if entry.logprob is None:
            tops.append(None)
            continue
        best: dict[str, float] = {}
        for token, logprob in entry.top[:top]:
            best.setdefault(_text(tokenizer, token), logprob)  # two ids of one text: the likelier one
        best.setdefault(text, entry.logprob)
        tops.append(best)
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": tops, "text_offset": offsets}


def _chat_token(tokenizer: Any, token: int, logprob: float) -> dict[str, Any]:
    text = _text(tokenizer, token)
    return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}


def chat_logprobs(tokenizer: Any, entries: Sequence[TokenLogprob], *, top: int) -> dict[str, Any]:
    """OpenAI's chat ``logprobs`` of ``entries`` with ``top`` alternatives each (``top_logprobs``)."""
    content = []
    for entry in entries:
        assert entry.logprob is not None  # a generated token always has one
        item = _chat_token(tokenizer, entry.token, entry.logprob)
        item["top_logprobs"] = [_chat_token(tokenizer, t, lp) for t, lp in entry.top[:top]]
        content.append(item)
    return {"content": content, "refusal": None}
