"""A request body's fields, checked: the sampling parameters a completion and a chat completion share
(`Sampling`), and the OpenAI-shaped error a bad one answers (`HTTPError`, 400 naming the field in ``param``).

Nothing is ignored (`check_fields`): every field of a body is one zoo acts on, one it accepts as a label
(``user``, ``safety_identifier``), or a 400 naming it: an unknown key (``max_tokns``: "did you mean
max_tokens?"), or an OpenAI field zoo does not support yet (``functions``, ...), unless it is null or the
value that asks for nothing (``echo: false``). Structured output (``response_format`` and vLLM's
``guided_*``) is read by `zoo.serving.structured` into ``Sampling.grammar``, tools by `zoo.serving.tools`.
Booleans must be JSON booleans (``1`` or ``"true"`` is a 400). docs/serving.md has the table.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

from zoo.generation.constrain import Grammar
from zoo.serving.requests import MAX_LOGPROBS, BeamSettings, Completion, Event, valid_text


class HTTPError(Exception):
    """An answer other than 200, in OpenAI's error shape: ``kind`` is its ``type``, ``param`` the field at
    fault, ``code`` a machine-readable reason."""

    def __init__(
        self, status: int, message: str, *, kind: str, param: str | None = None, code: str | None = None
    ):
        super().__init__(message)
        self.status, self.message, self.kind, self.param, self.code = status, message, kind, param, code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


def bad(message: str, param: str | None) -> HTTPError:
    """A 400 naming ``param`` (None: the body as a whole)."""
    return HTTPError(400, message, kind="invalid_request_error", param=param)


Endpoint = Literal["completions", "chat"]

# The fields zoo acts on, by endpoint (``model`` is checked by `zoo.serving.api.read_body`, the prompt or
# messages by the handler, the rest by `Sampling`). vLLM's extensions keep vLLM's names.
SHARED = (
    "model",
    "max_tokens",
    "temperature",
    "top_p",
    "n",
    "seed",
    "stop",
    "stream",
    "stream_options",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "top_k",
    "min_p",
    "repetition_penalty",
    "stop_token_ids",
    "ignore_eos",
    # structured output (`zoo.serving.structured`): OpenAI's, and vLLM's extensions
    "response_format",
    "guided_json",
    "guided_regex",
    "guided_choice",
    # beam search (`zoo.serving.beams`): vLLM's
    "use_beam_search",
    "best_of",
    "length_penalty",
    "early_stopping",
)
# The fields a grammar comes from, with the values that ask for one (`zoo.serving.structured`, tools).
GRAMMARS: tuple[tuple[str, Callable[[Any], bool]], ...] = (
    ("response_format", lambda value: not (isinstance(value, dict) and value.get("type") == "text")),
    ("guided_json", lambda value: True),
    ("guided_regex", lambda value: True),
    ("guided_choice", lambda value: True),
    ("tool_choice", lambda value: value not in ("auto", "none")),  # "required" or a function: forced
)
ACTED: dict[Endpoint, tuple[str, ...]] = {
    "completions": ("prompt", *SHARED, "logprobs", "echo"),
    "chat": (
        "messages",
        *SHARED,
        "max_completion_tokens",
        "logprobs",
        "top_logprobs",
        "tools",  # these three: zoo.serving.tools
        "tool_choice",
        "parallel_tool_calls",
    ),
}
LABELS = ("user", "safety_identifier")  # accepted strings that only label the request: nothing to act on

# OpenAI (and vLLM) fields zoo does not support yet -> the values that ask for nothing, accepted (null too).
NOT_YET: dict[Endpoint, dict[str, tuple[Any, ...]]] = {
    "completions": {"suffix": (), "min_tokens": (0,)},
    "chat": {
        "functions": (),
        "function_call": (),
        "metadata": (),
        "store": (False,),
        "service_tier": (),
        "modalities": (["text"],),
        "audio": (),
        "prediction": (),
        "reasoning_effort": (),
        "web_search_options": (),
        "prompt_cache_key": (),
        "verbosity": (),
        "min_tokens": (0,),
    },
}


def check_fields(body: Mapping[str, Any], endpoint: Endpoint) -> None:
    """Refuse, naming it, the first field of ``body`` that zoo would not act on: an unknown key, a label that
    is not a string, or a field not supported yet given a value that asks for something."""
    acted, not_yet = ACTED[endpoint], NOT_YET[endpoint]
    for name, value in body.items():
        if name in acted:
            continue
        if name in LABELS:
            if value is not None and not isinstance(value, str):
                raise bad(f"{name} must be a string, got {value!r}", name)
        elif name in not_yet:
            if value is not None and not any(
                value == off and type(value) is type(off) for off in not_yet[name]
            ):
                raise bad(f"{name} is not supported by zoo serve yet", name)
        else:
            known = (*acted, *LABELS, *not_yet)
            close = difflib.get_close_matches(name, known, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            route = "/v1/completions" if endpoint == "completions" else "/v1/chat/completions"
            raise bad(f"unknown field {name!r} for {route}{hint}", name)


def _number(body: dict[str, Any], name: str, default: float, *, low: float, high: float) -> float:
    value = body.get(name, default)
    value = default if value is None else value
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise bad(f"{name} must be a number in [{low}, {high}], got {value!r}", name)
    return float(value)


def _integer(body: dict[str, Any], name: str, default: int | None, *, low: int, high: int) -> int | None:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise bad(f"{name} must be an integer in [{low}, {high}], got {value!r}", name)
    return value


def _boolean(body: dict[str, Any], name: str) -> bool:
    """A JSON boolean (absent or null: false); 1, "true" and the like are refused, not read as true."""
    value = body.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise bad(f"{name} must be a boolean (true or false), got {value!r}", name)
    return value


def _stop(body: dict[str, Any]) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else stop
    if (
        not isinstance(stops, list)
        or not 0 < len(stops) <= 4
        or not all(isinstance(s, str) and s for s in stops)
    ):
        raise bad("stop must be a non-empty string or a list of up to 4 of them", "stop")
    return [valid_text(s, "stop") for s in stops]


def _max_tokens(body: dict[str, Any], endpoint: Endpoint, *, echo: bool) -> int | None:
    """``max_tokens``, or chat's ``max_completion_tokens`` (OpenAI's newer name): both only when equal; 0
    only with ``echo`` (the prompt is scored, nothing generated)."""
    names = ("max_tokens", "max_completion_tokens") if endpoint == "chat" else ("max_tokens",)
    if echo and body.get("max_tokens") == 0 and type(body["max_tokens"]) is int:
        return 0
    given = {name: _integer(body, name, None, low=1, high=1 << 30) for name in names}
    values = {value for value in given.values() if value is not None}
    if len(values) > 1:
        raise bad(
            "max_tokens and max_completion_tokens are both given and differ: give one of them",
            "max_completion_tokens",
        )
    return values.pop() if values else None


def _logit_bias(value: Any) -> dict[int, float]:
    """OpenAI's ``logit_bias``: an object from token ids (as strings, JSON's keys) to numbers in [-100, 100]."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise bad("logit_bias must be an object from token ids to numbers in [-100, 100]", "logit_bias")
    bias = {}
    for key, number in value.items():
        if not (isinstance(key, str) and key.isascii() and key.isdigit()):
            raise bad(f"logit_bias keys must be token ids (decimal strings), got {key!r}", "logit_bias")
        if isinstance(number, bool) or not isinstance(number, int | float) or not -100 <= number <= 100:
            raise bad(f"logit_bias[{key!r}] must be a number in [-100, 100], got {number!r}", "logit_bias")
        bias[int(key)] = float(number)
    return bias


def _logprobs(body: dict[str, Any], endpoint: Endpoint) -> int | None:
    """How many alternatives each position reports (0: the chosen token's log-probability alone), or None:
    no log-probabilities. Completions: ``logprobs`` 0-20 (``false``: none); chat: ``logprobs: true`` with
    ``top_logprobs`` 0-20, which asks for nothing without it (a 400, as OpenAI's)."""
    if endpoint == "completions":
        if body.get("logprobs") is False:
            return None
        return _integer(body, "logprobs", None, low=0, high=MAX_LOGPROBS)
    top = _integer(body, "top_logprobs", None, low=0, high=MAX_LOGPROBS)
    if not _boolean(body, "logprobs"):
        if top is not None:
            raise bad("top_logprobs needs logprobs: true", "top_logprobs")
        return None
    return top or 0


def _token_ids(value: Any, name: str) -> list[int]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(
        isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in value
    ):
        raise bad(f"{name} must be a list of token ids (integers >= 0)", name)
    return value


def _stream_options(options: Any, *, stream: bool) -> bool:
    """Whether a stream ends with a usage chunk. As OpenAI, ``stream_options`` only with ``stream: true``."""
    if options is None:
        return False
    if not stream:
        raise bad("stream_options is only allowed when stream is true", "stream_options")
    if not isinstance(options, dict):
        raise bad("stream_options must be an object", "stream_options")
    for key in options:
        if key != "include_usage":
            raise bad(
                f"stream_options.{key} is not supported by zoo serve (only include_usage is)",
                f"stream_options.{key}",
            )
    return _boolean(options, "include_usage")


def _beam(body: dict[str, Any], n: int) -> BeamSettings | None:
    """vLLM's beam search fields: ``use_beam_search: true`` with ``best_of`` beams (default: ``n``), of
    which the ``n`` best are returned, ``length_penalty`` and ``early_stopping`` (true, false or "never", as
    transformers'); None without it (or with one beam: greedy search). A beam setting that would change
    nothing is refused, naming it."""
    best_of = _integer(body, "best_of", None, low=1, high=128)
    settings = [name for name in ("length_penalty", "early_stopping") if body.get(name) is not None]
    if not _boolean(body, "use_beam_search"):
        if best_of not in (None, 1):
            raise bad(
                "best_of > 1 is beam search's width: give use_beam_search: true (without it zoo serve "
                "returns every sequence it samples: ask for n)",
                "best_of",
            )
        if settings:
            raise bad(f"{settings[0]} is a beam search setting: give use_beam_search: true", settings[0])
        return None
    width = n if best_of is None else best_of
    if n > width:
        raise bad(f"n ({n}) must be <= best_of ({width}): beam search returns the best of its beams", "n")
    if width == 1:
        if settings:
            raise bad(
                f"{settings[0]} has no effect with one beam (greedy search): give best_of > 1", settings[0]
            )
        return None
    early = body.get("early_stopping")
    if early is not None and not (isinstance(early, bool) or early == "never"):
        raise bad(f'early_stopping must be true, false or "never", got {early!r}', "early_stopping")
    return BeamSettings(
        width=width,
        n=n,
        length_penalty=_number(body, "length_penalty", 1.0, low=-1e4, high=1e4),
        early_stopping=False if early is None else early,
    )


class Sampling:
    """The parameters a completion and a chat completion share, checked (every field of the body: see
    `check_fields`)."""

    def __init__(self, body: dict[str, Any], endpoint: Endpoint) -> None:
        check_fields(body, endpoint)
        self.echo = _boolean(body, "echo")  # completions only (`check_fields`)
        self.logprobs = _logprobs(body, endpoint)
        self.max_tokens = _max_tokens(body, endpoint, echo=self.echo)
        self.temperature = _number(body, "temperature", 1.0, low=0.0, high=2.0)
        self.top_p = _number(body, "top_p", 1.0, low=0.0, high=1.0)
        if self.top_p == 0.0:
            raise bad("top_p must be in (0, 1]", "top_p")
        top_k = _integer(body, "top_k", 0, low=-1, high=1 << 30)
        self.top_k = max(top_k or 0, 0)  # vLLM's -1 and 0: off
        self.min_p = _number(body, "min_p", 0.0, low=0.0, high=1.0)
        self.repetition_penalty = _number(body, "repetition_penalty", 1.0, low=0.0, high=10.0)
        if self.repetition_penalty == 0.0:
            raise bad("repetition_penalty must be in (0, 10] (1: off)", "repetition_penalty")
        self.presence_penalty = _number(body, "presence_penalty", 0.0, low=-2.0, high=2.0)
        self.frequency_penalty = _number(body, "frequency_penalty", 0.0, low=-2.0, high=2.0)
        self.logit_bias = _logit_bias(body.get("logit_bias"))
        self.stop_token_ids = _token_ids(body.get("stop_token_ids"), "stop_token_ids")
        self.ignore_eos = _boolean(body, "ignore_eos")
        n = _integer(body, "n", 1, low=1, high=128)
        self.n = 1 if n is None else n
        # A seed is taken at temperature 0 too (greedy search is reproducible without it): lm-eval sends one.
        self.seed = _integer(body, "seed", None, low=-(1 << 63), high=(1 << 63) - 1)
        self.stop = _stop(body)
        self.stream = _boolean(body, "stream")
        self.include_usage = _stream_options(body.get("stream_options"), stream=self.stream)
        self.grammar: Grammar | None = None  # set by the handler (`zoo.serving.structured.grammar_of`)
        if self.echo and self.stream:  # the prompt's text and log-probabilities come with the finished text
            raise bad("echo is not supported with stream: true", "echo")
        self.beam = _beam(body, self.n)
        if self.beam is not None:
            if self.stream:  # the hypotheses are known once the search ends
                raise bad("stream is not supported with use_beam_search", "stream")
            if body.get("temperature") is None:  # OpenAI's default of 1 samples; beam search does not
                self.temperature = 0.0
        # the fields a grammar came from, to name the one beam search refuses (`completions`)
        self._grammar_fields = [
            name for name, asks in GRAMMARS if body.get(name) is not None and asks(body[name])
        ]

    def completions(
        self,
        prompt: list[int],
        room: int,
        emit: Callable[[int], Callable[[Event], None]],
        *,
        stop_token_ids: Sequence[int] = (),
        continues_prompt: bool = True,
        skip_special_tokens: bool = True,
    ) -> list[Completion]:
        """The ``n`` engine requests; a sampled request's seed s gives choice i the seed s + i. A beam
        request is one, which returns the n choices."""
        if self.beam is not None and self.grammar is not None:
            name = self._grammar_fields[0] if self._grammar_fields else "response_format"
            raise bad(f"{name} (structured output) does not combine with use_beam_search", name)
        return [
            Completion(
                prompt=prompt,
                max_tokens=self.max_tokens if self.max_tokens is not None else room,
                emit=emit(i),
                temperature=self.temperature,
                top_p=self.top_p,
                seed=None if self.seed is None else (self.seed + i) % (1 << 63),
                stop=self.stop,
                stop_token_ids=(*stop_token_ids, *self.stop_token_ids),
                continues_prompt=continues_prompt,
                top_k=self.top_k,
                min_p=self.min_p,
                repetition_penalty=self.repetition_penalty,
                presence_penalty=self.presence_penalty,
                frequency_penalty=self.frequency_penalty,
                logit_bias=self.logit_bias,
                ignore_eos=self.ignore_eos,
                logprobs=self.logprobs,
                echo=self.echo,
                skip_special_tokens=skip_special_tokens,
                grammar=self.grammar,
                beam=self.beam,
            )
            for i in range(1 if self.beam is not None else self.n)
        ]
