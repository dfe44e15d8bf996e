"""A request body's fields, checked: the sampling parameters a completion and a chat completion share
(`Sampling`), and the OpenAI-shaped error a bad one answers (`HTTPError`, 400 naming the field in ``param``).

A field zoo cannot act on as given is refused, never ignored: ``echo``, ``logprobs``, ``best_of`` > 1,
``suffix``; booleans must be JSON booleans (``1`` or ``"true"`` is a 400).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from zoo.serving.requests import Completion, Event, valid_text


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


class Sampling:
    """The parameters a completion and a chat completion share, checked."""

    def __init__(self, body: dict[str, Any], *, max_tokens_names: tuple[str, ...]) -> None:
        if _boolean(body, "echo"):
            raise bad("echo is not supported by zoo serve", "echo")
        if body.get("logprobs") is not None and body.get("logprobs") is not False:
            raise bad("logprobs is not supported by zoo serve", "logprobs")
        if _integer(body, "best_of", None, low=1, high=128) not in (None, 1):
            raise bad("best_of is not supported by zoo serve", "best_of")
        if body.get("suffix") is not None:  # a text after the insertion: zoo's models only continue a prompt
            raise bad("suffix is not supported by zoo serve", "suffix")
        self.max_tokens: int | None = None
        for name in max_tokens_names:
            if body.get(name) is not None:
                self.max_tokens = _integer(body, name, None, low=1, high=1 << 30)
        self.temperature = _number(body, "temperature", 1.0, low=0.0, high=2.0)
        self.top_p = _number(body, "top_p", 1.0, low=0.0, high=1.0)
        if self.top_p == 0.0:
            raise bad("top_p must be in (0, 1]", "top_p")
        n = _integer(body, "n", 1, low=1, high=128)
        self.n = 1 if n is None else n
        self.seed = _integer(body, "seed", None, low=-(1 << 63), high=(1 << 63) - 1)
        self.stop = _stop(body)
        self.stream = _boolean(body, "stream")
        options = body.get("stream_options") or {}
        if not isinstance(options, dict):
            raise bad("stream_options must be an object", "stream_options")
        self.include_usage = self.stream and _boolean(options, "include_usage")

    def completions(
        self,
        prompt: list[int],
        room: int,
        emit: Callable[[int], Callable[[Event], None]],
        *,
        stop_token_ids: Sequence[int] = (),
        continues_prompt: bool = True,
    ) -> list[Completion]:
        """The ``n`` engine requests; a sampled request's seed s gives choice i the seed s + i."""
        return [
            Completion(
                prompt=prompt,
                max_tokens=self.max_tokens if self.max_tokens is not None else room,
                emit=emit(i),
                temperature=self.temperature,
                top_p=self.top_p,
                seed=None if self.seed is None else (self.seed + i) % (1 << 63),
                stop=self.stop,
                stop_token_ids=stop_token_ids,
                continues_prompt=continues_prompt,
            )
            for i in range(self.n)
        ]
