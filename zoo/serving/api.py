"""The OpenAI-compatible HTTP layer: /v1/models, /v1/completions, /v1/chat/completions (FastAPI).

Thin on purpose: a handler checks the body, tokenises, submits ``n`` `Completion`s to the `Engine` and
relays its events. The engine calls ``emit`` from its own thread; ``loop.call_soon_threadsafe`` hands each
event to the request's asyncio queue, so no torch work ever runs on the event loop. A streamed response is
server-sent events (``data: {chunk}\\n\\n`` ..., ``data: [DONE]``); when the client goes away, Starlette
cancels the stream and its completions are cancelled, which frees their slots at the engine's next step.

Errors are OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``: 400 a bad parameter (named in
``param``), 401 a missing or wrong API key, 404 an unknown model or route, 413 a prompt longer than the model
takes, 503 the queue is full.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TYPE_CHECKING, Any

from zoo._extras import install_hint
from zoo.generation.chat import end_of_turn_ids
from zoo.serving.chat import check_messages, render_chat
from zoo.serving.engine import Engine
from zoo.serving.requests import (
    Completion,
    Delta,
    Done,
    Event,
    Failed,
    PromptTooLong,
    QueueFull,
    RequestError,
    valid_text,
)

if TYPE_CHECKING:
    from fastapi import FastAPI

EXTRA = install_hint("serve")


class HTTPError(Exception):
    def __init__(
        self, status: int, message: str, *, kind: str, param: str | None = None, code: str | None = None
    ):
        super().__init__(message)
        self.status, self.message, self.kind, self.param, self.code = status, message, kind, param, code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


def bad(message: str, param: str | None) -> HTTPError:
    return HTTPError(400, message, kind="invalid_request_error", param=param)


class ServeExtraMissing(ValueError, ImportError):
    """FastAPI or uvicorn is not installed; the message names the extra to install (a ValueError too, so the
    CLI reports it in one line, as `zoo.evaluation`'s missing lm-eval is)."""

    def __init__(self) -> None:
        super().__init__(f"zoo serve needs FastAPI and uvicorn: {EXTRA}")


def default_request_bytes(engine: Engine) -> int:
    """The largest request body a server takes by default: 1 MiB for the JSON around the text, plus 64 bytes
    for each token a sequence may hold (a token seldom covers more than 16 characters, 4 bytes each at most
    in UTF-8). A body past it could only be refused after tokenising it."""
    most = engine.model.spec.max_positions if engine.seq2seq else engine.limit
    return (1 << 20) + 64 * most


class ClientGone(Exception):
    """The client closed the connection before its answer was ready: its sequences were cancelled."""


def check_api_key(key: str | None, *, where: str = "api_key") -> None:
    """Refuse a key that would leave the server open (empty) or that no client can send (a header carries
    printable ASCII only); ``where`` names it (``--api-key``, ``$ZOO_API_KEY``). None: no key, on purpose."""
    if key is None:
        return
    if not key.strip():
        raise ValueError(
            f"{where} is empty: that would serve without a key; leave it out to serve without one"
        )
    if not (key.isascii() and key.isprintable()) or key != key.strip():
        raise ValueError(
            f"{where} must be printable ASCII without surrounding spaces (an HTTP header carries no other "
            "characters, so no client could ever send it)"
        )


def import_fastapi() -> Any:
    """fastapi, or `ServeExtraMissing`."""
    try:
        import fastapi
    except ImportError as error:
        raise ServeExtraMissing() from error
    return fastapi


# ---- request bodies ----


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


# ---- the app ----


def create_app(
    engine: Engine,
    tokenizer: Any,
    *,
    model_name: str,
    api_key: str | None = None,
    default_max_tokens: int = 16,
    max_request_bytes: int | None = None,
) -> FastAPI:
    """The FastAPI app serving ``engine`` under ``model_name``; ``api_key``: required as a bearer token;
    ``max_request_bytes``: larger bodies are a 413 before they are read whole (default:
    `default_request_bytes`). Parsing, tokenising and rendering run on worker threads, never on the event
    loop, so one large request never stalls the others."""
    check_api_key(api_key)
    cap = max_request_bytes if max_request_bytes is not None else default_request_bytes(engine)
    if cap < 1:
        raise ValueError(f"max_request_bytes must be >= 1, got {cap}")
    fastapi = import_fastapi()
    from fastapi.responses import JSONResponse, StreamingResponse
    from starlette.exceptions import HTTPException as StarletteHTTPException

    app = fastapi.FastAPI(title="zoo serve", docs_url=None, redoc_url=None, openapi_url=None)
    created = int(time.time())
    bos = getattr(tokenizer, "bos_id", None)
    eos = getattr(tokenizer, "eos_id", None)
    # A chat answer also ends at the token its template closes an assistant turn with (Llama 3's <|eot_id|>
    # where the model's eos is <|end_of_text|>); computed once, from a rendered sample.
    turn_ends = () if engine.seq2seq else end_of_turn_ids(tokenizer)

    @app.exception_handler(HTTPError)
    async def _http_error(request: Any, error: HTTPError) -> Any:
        return JSONResponse(error.body(), status_code=error.status)

    @app.exception_handler(ClientGone)
    async def _client_gone(request: Any, error: ClientGone) -> Any:
        return JSONResponse({}, status_code=499)  # nginx's "client closed request": no one reads it

    @app.exception_handler(RequestError)
    async def _request_error(request: Any, error: RequestError) -> Any:
        return JSONResponse(bad(str(error), error.param).body(), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def _starlette_error(request: Any, error: Any) -> Any:
        kind = "not_found_error" if error.status_code == 404 else "invalid_request_error"
        return JSONResponse(
            HTTPError(error.status_code, str(error.detail), kind=kind).body(), status_code=error.status_code
        )

    def authorize(request: Any) -> None:
        if api_key is None:
            return
        given = request.headers.get("authorization", "")
        token = given[7:] if given.lower().startswith("bearer ") else ""
        if not hmac.compare_digest(token.encode(), api_key.encode()):
            raise HTTPError(
                401,
                "missing or wrong API key (Authorization: Bearer KEY)",
                kind="invalid_request_error",
                code="invalid_api_key",
            )

    def too_large(size: str) -> HTTPError:
        return HTTPError(
            413,
            f"the request body is {size} bytes; this server takes at most {cap:,} (--max-request-bytes)",
            kind="invalid_request_error",
            code="request_too_large",
        )

    async def read_body(request: Any) -> dict[str, Any]:
        authorize(request)
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > cap:  # refused before a byte of it is read
            raise too_large(f"{int(declared):,}")
        chunks, size = [], 0
        async for chunk in request.stream():  # a body without a length (chunked) is counted as it comes
            size += len(chunk)
            if size > cap:
                raise too_large(f"over {cap:,}")
            chunks.append(chunk)
        try:
            body = await asyncio.to_thread(json.loads, b"".join(chunks))
        except ValueError:
            raise bad("the request body is not valid JSON", None) from None
        except RecursionError:  # json's parser recurses per level: thousands of levels exhaust the stack
            raise bad("the request body is nested too deeply to be an OpenAI request", None) from None
        if not isinstance(body, dict):
            raise bad("the request body must be a JSON object", None)
        model = body.get("model")
        if model is not None and model != model_name:
            raise HTTPError(
                404,
                f"model {model!r} is not served here (this server serves {model_name!r})",
                kind="invalid_request_error",
                param="model",
                code="model_not_found",
            )
        return body

    def encode(text: str) -> list[int]:
        if not engine.seq2seq:
            return tokenizer.encode(text, add_bos=bos is not None, add_eos=False)
        return tokenizer.encode(text, add_eos=eos is not None)

    async def models(request: Any) -> Any:
        authorize(request)
        return JSONResponse(
            {
                "object": "list",
                "data": [{"id": model_name, "object": "model", "created": created, "owned_by": "zoo"}],
            }
        )

    async def completions(request: Any) -> Any:
        body = await read_body(request)
        sampling = Sampling(body, max_tokens_names=("max_tokens",))
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if isinstance(prompt, str):
            ids = await asyncio.to_thread(encode, valid_text(prompt, "prompt"))
        elif (
            isinstance(prompt, list)
            and prompt
            and all(isinstance(i, int) and not isinstance(i, bool) for i in prompt)
        ):
            ids = list(prompt)
        else:
            raise bad("prompt must be a string or a list of token ids (one prompt per request)", "prompt")
        if sampling.max_tokens is None:
            sampling.max_tokens = default_max_tokens  # OpenAI's default for completions
        return await respond(request, sampling, ids, chat=False)

    async def chat_completions(request: Any) -> Any:
        body = await read_body(request)
        sampling = Sampling(body, max_tokens_names=("max_tokens", "max_completion_tokens"))
        messages = check_messages(body.get("messages"))
        if engine.seq2seq:
            prompt = await asyncio.to_thread(encode, messages[-1]["content"])
        else:
            prompt = await asyncio.to_thread(render_chat, tokenizer, messages)
        return await respond(request, sampling, prompt, chat=True)

    async def respond(request: Any, sampling: Sampling, prompt: list[int], *, chat: bool) -> Any:
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[tuple[int, Event]] = asyncio.Queue()

        def emit(index: int) -> Callable[[Event], None]:
            def put(event: Event) -> None:
                loop.call_soon_threadsafe(events.put_nowait, (index, event))

            return put

        most = engine.model.spec.max_positions if engine.seq2seq else engine.limit
        requests = sampling.completions(
            prompt,
            max(most - len(prompt), 1),
            emit,
            stop_token_ids=turn_ends if chat else (),
            continues_prompt=not chat,  # a chat answer is a message of its own: no space before it
        )
        try:
            engine.submit(requests)
        except PromptTooLong as error:
            raise HTTPError(
                413,
                str(error),
                kind="invalid_request_error",
                param="messages" if chat else "prompt",
                code="context_length_exceeded",
            ) from None
        except RequestError as error:
            raise bad(str(error), error.param) from None
        except QueueFull as error:
            raise HTTPError(503, str(error), kind="server_error", code="overloaded") from None
        ident = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        head = {
            "id": ident,
            "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()),
            "model": model_name,
        }

        async def gone() -> None:
            # The body is read: the next ASGI message is the client's disconnect, whenever it comes.
            while (await request.receive())["type"] != "http.disconnect":
                pass

        # A streaming response listens for the disconnect itself (Starlette cancels it); a plain one writes
        # nothing until the end, so it must watch, or a client that left would hold its slots to the end.
        watcher = None if sampling.stream else asyncio.ensure_future(gone())

        async def next_event() -> tuple[int, Event]:
            if watcher is None:
                return await events.get()
            getting = asyncio.ensure_future(events.get())
            await asyncio.wait({getting, watcher}, return_when=asyncio.FIRST_COMPLETED)
            if getting.done():
                return getting.result()
            getting.cancel()
            raise ClientGone

        async def results() -> AsyncIterator[tuple[int, Event]]:
            left = len(requests)
            try:
                while left:
                    index, event = await next_event()
                    if isinstance(event, Failed):
                        raise HTTPError(500, event.message, kind="server_error")
                    left -= isinstance(event, Done)
                    yield index, event
            finally:  # the client went away (or we failed): free the slots
                if watcher is not None:
                    watcher.cancel()
                for r in requests:
                    r.cancel()

        if not sampling.stream:
            done: dict[int, Done] = {}
            async for index, event in results():
                if isinstance(event, Done):
                    done[index] = event
            choices = [
                {
                    "index": i,
                    "message": {"role": "assistant", "content": d.text},
                    "logprobs": None,
                    "finish_reason": d.finish_reason,
                }
                if chat
                else {"index": i, "text": d.text, "logprobs": None, "finish_reason": d.finish_reason}
                for i, d in sorted(done.items())
            ]
            return JSONResponse({**head, "choices": choices, "usage": usage(len(prompt), done.values())})

        async def sse() -> AsyncIterator[str]:
            chunk = {**head, "object": "chat.completion.chunk" if chat else "text_completion"}
            done: list[Done] = []
            if chat:
                for i in range(len(requests)):
                    yield _event(
                        {**chunk, "choices": [_chat_choice(i, {"role": "assistant", "content": ""}, None)]}
                    )
            try:
                async for index, event in results():
                    if isinstance(event, Delta):
                        choice = (
                            _chat_choice(index, {"content": event.text}, None)
                            if chat
                            else _text_choice(index, event.text, None)
                        )
                    else:
                        assert isinstance(event, Done)
                        done.append(event)
                        choice = (
                            _chat_choice(index, {}, event.finish_reason)
                            if chat
                            else _text_choice(index, "", event.finish_reason)
                        )
                    yield _event({**chunk, "choices": [choice]})
            except HTTPError as error:
                yield _event(error.body())
                return
            if sampling.include_usage:
                yield _event({**chunk, "choices": [], "usage": usage(len(prompt), done)})
            yield "data: [DONE]\n\n"

        return StreamingResponse(sse(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    # Plain Starlette routes: each handler reads its own body, so errors keep OpenAI's shape (FastAPI's
    # body models would answer 422 in theirs), and no annotation needs resolving.
    app.add_route("/v1/models", models, methods=["GET"])
    app.add_route("/v1/completions", completions, methods=["POST"])
    app.add_route("/v1/chat/completions", chat_completions, methods=["POST"])
    return app


def usage(prompt_tokens: int, done: Any) -> dict[str, int]:
    completion = sum(len(d.token_ids) for d in done)
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": prompt_tokens + completion,
    }


def _text_choice(index: int, text: str, finish: str | None) -> dict[str, Any]:
    return {"index": index, "text": text, "logprobs": None, "finish_reason": finish}


def _chat_choice(index: int, delta: dict[str, str], finish: str | None) -> dict[str, Any]:
    return {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}


def _event(data: dict[str, Any]) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"
