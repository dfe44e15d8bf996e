"""What a client asks the engine for, and what the engine tells it back.

One `Completion` is one sequence (an OpenAI request with ``n`` > 1 is n of them, `zoo.serving.api`). The
engine reports through the request's ``emit`` callback, from its own thread: zero or more `Delta` events,
then exactly one `Done` (or one `Failed`). The HTTP layer hands them to the event loop thread-safely.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from zoo.generation.constrain import Grammar

FinishReason = Literal["stop", "length"]
EarlyStopping = bool | Literal["never"]


class RequestError(ValueError):
    """A request parameter the engine cannot take: ``param`` names it (OpenAI's error ``param``)."""

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def valid_text(text: str, param: str) -> str:
    """``text``, or `RequestError` naming ``param`` when it holds a lone UTF-16 surrogate (JSON's ``"\\ud800"``
    decodes to one): no tokenizer can encode it, and it is no character."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise RequestError(
            f"{param} holds a lone UTF-16 surrogate at character {error.start}: not valid Unicode text",
            param=param,
        ) from None
    return text


class PromptTooLong(RequestError):
    """The prompt leaves no room for a new token (HTTP 413)."""


class QueueFull(RuntimeError):
    """Every slot is busy and the waiting queue is full (HTTP 503)."""


MAX_LOGPROBS = 20  # the most alternatives a position reports (OpenAI's bound)


@dataclass(frozen=True)
class TokenLogprob:
    """A token and the model's log-probability of it (None: the first token of a prompt, which nothing
    predicts), with the ``top`` most likely tokens at its position, as (id, log-probability), best first."""

    token: int
    logprob: float | None
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class Delta:
    text: str  # new text, safe to show (never part of a stop string)
    token_ids: tuple[int, ...]  # the tokens produced since the last event
    logprobs: tuple[TokenLogprob, ...] = ()  # the log-probabilities not yet sent (a request that asks)


@dataclass(frozen=True)
class Done:
    text: str  # the whole completion, cut before a stop string
    token_ids: tuple[int, ...]  # every generated token (an end-of-sequence token included)
    finish_reason: FinishReason
    prompt_tokens: int
    logprobs: tuple[TokenLogprob, ...] = ()  # one per token of token_ids (a request that asks)
    prompt_logprobs: tuple[TokenLogprob, ...] = ()  # one per prompt token (``echo`` with ``logprobs``)
    choice: int = 0  # a beam request's: which of its returned hypotheses (0: the best)


@dataclass(frozen=True)
class Failed:
    message: str


Event = Delta | Done | Failed


@dataclass(frozen=True)
class BeamSettings:
    """Beam search for one request (vLLM's ``use_beam_search`` with ``best_of``): ``width`` beams, the
    ``n`` best finished hypotheses returned, best first, scored sum(log p) / length ** ``length_penalty``;
    ``early_stopping`` as transformers' (True, False or "never"). `zoo.serving.beams` runs it."""

    width: int
    n: int = 1
    length_penalty: float = 1.0
    early_stopping: EarlyStopping = False

    def check(self) -> None:
        """Raise `RequestError` naming the first bad setting (HTTP's field names)."""
        if not isinstance(self.width, int) or self.width < 2:
            raise RequestError(
                f"best_of must be an integer >= 2 for beam search, got {self.width!r}", param="best_of"
            )
        if not isinstance(self.n, int) or not 1 <= self.n <= self.width:
            raise RequestError(
                f"n ({self.n!r}) must be in [1, best_of ({self.width})]: beam search returns the best of its beams",
                param="n",
            )
        if not math.isfinite(self.length_penalty):
            raise RequestError(
                f"length_penalty must be a finite number, got {self.length_penalty!r}", param="length_penalty"
            )
        if not (isinstance(self.early_stopping, bool) or self.early_stopping == "never"):
            raise RequestError(
                f'early_stopping must be true, false or "never", got {self.early_stopping!r}',
                param="early_stopping",
            )


# What beam search does not combine with: each is a request field, refused by name when it asks for
# something (its value is not the neutral one).
_NOT_WITH_BEAMS = (
    (
        "temperature",
        lambda r: r.temperature != 0.0,
        "beam search is deterministic: leave temperature out or give 0",
    ),
    ("top_p", lambda r: r.top_p != 1.0, "a sampling setting"),
    ("top_k", lambda r: r.top_k != 0, "a sampling setting"),
    ("min_p", lambda r: r.min_p != 0.0, "a sampling setting"),
    ("logprobs", lambda r: r.logprobs is not None, "not reported for beam hypotheses"),
    ("echo", lambda r: r.echo, "not reported for beam hypotheses"),
    ("stop", lambda r: bool(r.stop), "a hypothesis ends at an end token or max_tokens"),
    ("repetition_penalty", lambda r: r.repetition_penalty != 1.0, "not applied to beams yet"),
    ("presence_penalty", lambda r: r.presence_penalty != 0.0, "not applied to beams yet"),
    ("frequency_penalty", lambda r: r.frequency_penalty != 0.0, "not applied to beams yet"),
    ("logit_bias", lambda r: bool(r.logit_bias), "not applied to beams yet"),
    ("response_format", lambda r: r.grammar is not None, "structured output is not applied to beams"),
)


@dataclass
class Completion:
    """One sequence to generate. ``temperature`` 0 is greedy search; ``seed`` makes sampling reproducible
    (its own `torch.Generator`, whatever else runs beside it); ``stop``: strings that end the text (cut
    before them); ``stop_token_ids``: tokens that end it besides the model's eos (a chat template's
    end-of-turn token, vLLM's ``stop_token_ids``), not part of the text; ``max_tokens``: new tokens at most;
    ``continues_prompt``: the text goes on from the prompt's (a completion: " sat" after "the cat"), or starts
    a message of its own (a chat answer: decoded alone, as transformers decodes the new tokens, so a
    word-joining decoder puts no space before its first word).

    Logits processors, per request inside the batched step (`zoo.serving.sampling`), in this order:
    ``repetition_penalty`` (CTRL's, over the prompt and the generated tokens, as transformers and vLLM; 1 =
    off), ``presence_penalty`` and ``frequency_penalty`` (OpenAI's: minus penalty * [count > 0] and penalty *
    count, counted over the generated tokens), ``logit_bias`` (token id -> a number added to its logit);
    all four at any temperature, greedy included. Then, when sampling: temperature, ``top_k`` (0 = off),
    ``top_p``, ``min_p`` (0 = off), which change nothing at temperature 0 and are refused there.
    ``ignore_eos``: the model's eos does not end the text (vLLM's).

    ``logprobs``: report each generated token's log-probability with that many alternatives (0 to 20;
    None: none), the model's own (a log-softmax of its logits, before any processor or temperature, as
    vLLM reports by default); ``echo``: with ``logprobs``, the prompt's too (`Done.prompt_logprobs`), and
    ``max_tokens`` may be 0 (score the prompt only). ``skip_special_tokens``: special tokens the model
    writes are left out of the text (vLLM's; False for an answer read for tool calls, whose format may start
    with one: Mistral's ``[TOOL_CALLS]``, Llama's ``<|python_tag|>``).

    ``grammar``: the text must follow it (structured output, `zoo.generation.constrain`): each step's
    tokens are masked to those it allows, the stop tokens (eos unless ``ignore_eos``, ``stop_token_ids``)
    where it accepts the text; the text ends ("stop") as soon as it is complete. At ``max_tokens`` it ends
    ("length") where it is, possibly incomplete, as OpenAI's does.

    ``beam``: beam search (`BeamSettings`, `zoo.serving.beams`) instead: the request runs in ``width`` slots
    and ends with ``n`` `Done` events (``Done.choice``), the best first, equal to ``model.generate`` with
    ``num_beams`` and ``num_return_sequences``; its eos ids are the model's (unless ``ignore_eos``) and
    ``stop_token_ids``. It sends no `Delta`, and refuses what does not combine with it (`_NOT_WITH_BEAMS`)."""

    prompt: Sequence[int]  # token ids: a decoder's prompt, an encoder-decoder's source
    max_tokens: int
    emit: Callable[[Event], None]
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop: Sequence[str] = ()
    stop_token_ids: Sequence[int] = ()
    continues_prompt: bool = True
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: Mapping[int, float] = field(default_factory=dict)
    ignore_eos: bool = False
    logprobs: int | None = None
    echo: bool = False
    skip_special_tokens: bool = True
    grammar: Grammar | None = None
    beam: BeamSettings | None = None  # beam search (None: greedy search or sampling)
    cancelled: bool = field(default=False, init=False)  # set by any thread; the engine drops it next step

    def cancel(self) -> None:
        """Stop generating (a client went away): the slot is freed at the next step, nothing more is emitted."""
        self.cancelled = True

    @property
    def rows(self) -> int:
        """The slots it runs in: its beams, or one."""
        return self.beam.width if self.beam is not None else 1

    @property
    def choices(self) -> int:
        """The `Done` events it ends with: a beam request's n hypotheses, or one."""
        return self.beam.n if self.beam is not None else 1

    def check(self) -> None:
        """Raise `RequestError` naming the first bad parameter."""
        if not self.prompt:
            raise RequestError("the prompt is empty", param="prompt")
        if self.beam is not None:
            self.beam.check()
            for name, asks, why in _NOT_WITH_BEAMS:
                if asks(self):
                    raise RequestError(f"{name} does not combine with use_beam_search ({why})", param=name)
        least = 0 if self.echo else 1  # 0 new tokens: the prompt is only scored
        if not isinstance(self.max_tokens, int) or self.max_tokens < least:
            raise RequestError(
                f"max_tokens must be an integer >= {least} (0 only with echo), got {self.max_tokens!r}",
                param="max_tokens",
            )
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_LOGPROBS:
            raise RequestError(
                f"logprobs must be an integer in [0, {MAX_LOGPROBS}], got {self.logprobs!r}", param="logprobs"
            )
        if not math.isfinite(self.temperature) or not 0.0 <= self.temperature <= 2.0:
            raise RequestError(
                f"temperature must be in [0, 2], got {self.temperature!r}", param="temperature"
            )
        if not math.isfinite(self.top_p) or not 0.0 < self.top_p <= 1.0:
            raise RequestError(f"top_p must be in (0, 1], got {self.top_p!r}", param="top_p")
        if len(self.stop) > 4 or any(not isinstance(s, str) or not s for s in self.stop):
            raise RequestError("stop must be up to 4 non-empty strings", param="stop")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise RequestError(f"top_k must be an integer >= 0 (0: off), got {self.top_k!r}", param="top_k")
        for name, value, low, high in (
            ("min_p", self.min_p, 0.0, 1.0),
            ("presence_penalty", self.presence_penalty, -2.0, 2.0),
            ("frequency_penalty", self.frequency_penalty, -2.0, 2.0),
        ):
            if not math.isfinite(value) or not low <= value <= high:
                raise RequestError(f"{name} must be in [{low}, {high}], got {value!r}", param=name)
        if not math.isfinite(self.repetition_penalty) or not 0.0 < self.repetition_penalty <= 10.0:
            raise RequestError(
                f"repetition_penalty must be in (0, 10] (1: off), got {self.repetition_penalty!r}",
                param="repetition_penalty",
            )
        if any(not -100.0 <= bias <= 100.0 for bias in self.logit_bias.values()):
            raise RequestError("logit_bias values must lie in [-100, 100]", param="logit_bias")
        if self.temperature == 0.0:  # greedy search: a warper changes nothing, as `zoo generate` refuses it
            unused = [
                name
                for name, value, off in (
                    ("top_k", self.top_k, 0),
                    ("top_p", self.top_p, 1.0),
                    ("min_p", self.min_p, 0.0),
                )
                if value != off
            ]
            if unused:
                raise RequestError(
                    f"{unused[0]} has no effect at temperature 0, which is greedy search: give a temperature "
                    "above 0 to sample, or leave it out",
                    param=unused[0],
                )


class StopText:
    """The text of a completion as it grows, held back where it could be the start of a stop string.

    ``add`` returns (text safe to emit, whether a stop string was found); on a stop the text is cut before it.
    """

    def __init__(self, stop: Sequence[str]) -> None:
        self.stop = tuple(stop)
        self.text = ""  # everything decoded so far (cut at a stop string once found)
        self.emitted = 0

    def add(self, piece: str) -> tuple[str, bool]:
        before = len(self.text)
        self.text += piece
        # a stop string found now ends at or after the old end: look from the longest one's reach back
        reach = max(before - max((len(s) for s in self.stop), default=0) + 1, 0)
        found = [i for s in self.stop if (i := self.text.find(s, reach)) >= 0]
        if found:
            self.text = self.text[: min(found)]
            return self._emit(len(self.text)), True
        return self._emit(len(self.text) - self._held()), False

    def _held(self) -> int:
        """How many trailing characters could begin a stop string."""
        for n in range(min(max((len(s) for s in self.stop), default=1) - 1, len(self.text)), 0, -1):
            tail = self.text[-n:]
            if any(s.startswith(tail) for s in self.stop):
                return n
        return 0

    def rest(self) -> str:
        """The text still held back (the completion ended without a stop string)."""
        return self._emit(len(self.text))

    def _emit(self, upto: int) -> str:
        piece, self.emitted = self.text[self.emitted : upto], max(self.emitted, upto)
        return piece
