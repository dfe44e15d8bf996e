"""The OpenAI-compatible HTTP layer: /v1/models, /v1/completions, /v1/chat/completions (FastAPI); /health
and /metrics (`zoo.serving.metrics`). An embedding model's app is `zoo.serving.embeddings`'.

Thin on purpose: a handler checks the body, tokenises, submits ``n`` `Completion`s to the `Engine` and
relays its events. The engine calls ``emit`` from its own thread; ``loop.call_soon_threadsafe`` hands each
event to the request's asyncio queue (`Relay`), so no torch work ever runs on the event loop. A streamed
response is server-sent events (``data: {chunk}\\n\\n`` ..., ``data: [DONE]``); when the client goes away,
Starlette cancels the stream and its completions are cancelled, which frees their slots at the engine's
next step.

The routes are module-level handlers over one `AppState` (``app.state.zoo``); `create_app` only wires them.

Errors are OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``: 400 a bad parameter (named in
``param``), 401 a missing or wrong API key, 404 an unknown model or route, 413 a prompt longer than the model
takes, 503 the queue is full.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from zoo._extras import install_hint
from zoo.generation.chat import end_of_turn_ids
from zoo.generation.constrain import GrammarMissing
from zoo.serving.bodies import HTTPError, Sampling, bad
from zoo.serving.chat import check_messages, render_chat
from zoo.serving.engine import Engine
from zoo.serving.logprobs import chat_logprobs, completion_logprobs
from zoo.serving.metrics import (
    CountRequests,
    Timing,
    health_body,
    make_metrics,
    metrics_response,
)
from zoo.serving.requests import (
    Completion,
    Delta,
    Done,
    Event,
    Failed,
    PromptTooLong,
    QueueFull,
    RequestError,
    TokenLogprob,
    valid_text,
)
from zoo.serving.structured import grammar_of
from zoo.serving.tools import (
    CallStream,
    ToolFormat,
    Tools,
    forced_grammar,
    read_calls,
    read_tools,
    tool_format,
)

if TYPE_CHECKING:
    from fastapi import FastAPI

logger = logging.getLogger(__name__)

EXTRA = install_hint("serve")


class ServeExtraMissing(ValueError, ImportError):
    """FastAPI or uvicorn is not installed; the message names the extra to install (a ValueError too, so the
    CLI reports it in one line, as `zoo.evaluation`'s missing lm-eval is)."""

    def __init__(self) -> None:
        super().__init__(f"zoo serve needs FastAPI and uvicorn: {EXTRA}")


def default_request_bytes(engine: Engine) -> int:
    """The largest request body a server takes by default: 1 MiB for the JSON around the text, plus 64 bytes
    for each token a sequence may hold (a token seldom covers more than 16 characters, 4 bytes each at most
    in UTF-8). A body past it could only be refused after tokenising it."""
    return (1 << 20) + 64 * _positions(engine)


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


def _positions(engine: Engine) -> int:
    """The most tokens one sequence (prompt and answer) may hold."""
    return engine.model.spec.max_positions if engine.seq2seq else engine.limit


# ---- the app ----


class Gate(Protocol):
    """What `authorize` and `read_body` read of an app's state (this module's and the embedding app's)."""

    @property
    def api_key(self) -> str | None: ...
    @property
    def max_request_bytes(self) -> int: ...
    @property
    def model_name(self) -> str: ...


@dataclass(frozen=True)
class AppState:
    """What every handler reads (``app.state.zoo``): the engine, its tokenizer, and `create_app`'s settings."""

    engine: Engine
    tokenizer: Any
    model_name: str
    api_key: str | None
    default_max_tokens: int
    max_request_bytes: int
    created: int  # when the app was made: the model's "created" in /v1/models
    # A chat answer also ends at the token its template closes an assistant turn with (Llama 3's <|eot_id|>
    # where the model's eos is <|end_of_text|>); computed once, from a rendered sample.
    turn_ends: Sequence[int]
    bos: int | None  # the tokenizer's: a decoder's prompt starts with it
    # The chat template's source (the tokenizer's, else zoo's default): message keys it reads are passed on.
    chat_template: str | None
    eos: int | None  # the tokenizer's: an encoder-decoder's source ends with it
    # The format the template writes tool calls in (`zoo.serving.tools`); None: it renders no tools.
    tool_format: ToolFormat | None = None


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
    app = fastapi.FastAPI(title="zoo serve", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.zoo = AppState(
        engine=engine,
        tokenizer=tokenizer,
        model_name=model_name,
        api_key=api_key,
        default_max_tokens=default_max_tokens,
        max_request_bytes=cap,
        created=int(time.time()),
        turn_ends=() if engine.seq2seq else end_of_turn_ids(tokenizer),
        bos=getattr(tokenizer, "bos_id", None),
        eos=getattr(tokenizer, "eos_id", None),
        chat_template=None if engine.seq2seq else _template_source(tokenizer),
        tool_format=None if engine.seq2seq else tool_format(_template_source(tokenizer, tools=True)),
    )
    add_error_handlers(app)
    app.state.metrics = make_metrics(engine.load, engine.prefix_stats)
    # Plain Starlette routes: each handler reads its own body, so errors keep OpenAI's shape (FastAPI's
    # body models would answer 422 in theirs), and no annotation needs resolving.
    app.add_route("/v1/models", models, methods=["GET"])
    app.add_route("/v1/completions", completions, methods=["POST"])
    app.add_route("/v1/chat/completions", chat_completions, methods=["POST"])
    app.add_route("/v1/embeddings", no_embeddings, methods=["POST"])
    add_monitoring(app, health)
    return app


def add_error_handlers(app: Any) -> None:
    """OpenAI's error shape for zoo's errors and Starlette's (404, 405)."""
    from starlette.exceptions import HTTPException as StarletteHTTPException

    app.add_exception_handler(HTTPError, _http_error)
    app.add_exception_handler(ClientGone, _client_gone)
    app.add_exception_handler(RequestError, _request_error)
    app.add_exception_handler(StarletteHTTPException, _starlette_error)


def add_monitoring(app: Any, health_route: Callable[[Any], Any]) -> None:
    """``GET /health`` and ``GET /metrics``, open without the API key (a prober and a scraper hold none;
    they tell counts, never a request's content); every answer counted when prometheus-client is there."""
    app.add_route("/health", health_route, methods=["GET"])
    app.add_route("/metrics", metrics, methods=["GET"])
    if app.state.metrics is not None:
        app.add_middleware(CountRequests, metrics=app.state.metrics)


def _template_source(tokenizer: Any, *, tools: bool = False) -> str | None:
    """The chat template's source; ``tools``: the one rendered when tools are given (a ``tool_use`` one)."""
    named = getattr(tokenizer, "chat_templates", {}) if tools else {}
    source = (
        (named.get("tool_use") if isinstance(named, dict) else None)
        or getattr(tokenizer, "chat_template", None)
        or getattr(tokenizer, "default_chat_template", None)
    )
    return source if isinstance(source, str) else None


def _state(request: Any) -> AppState:
    state: AppState = request.app.state.zoo
    return state


def _json(content: dict[str, Any], status: int = 200) -> Any:
    from starlette.responses import JSONResponse  # the serve extra, there once an app exists

    return JSONResponse(content, status_code=status)


# ---- errors ----


async def _http_error(request: Any, error: HTTPError) -> Any:
    return _json(error.body(), error.status)


async def _client_gone(request: Any, error: ClientGone) -> Any:
    return _json({}, 499)  # nginx's "client closed request": no one reads it


async def _request_error(request: Any, error: RequestError) -> Any:
    return _json(bad(str(error), error.param).body(), 400)


async def _starlette_error(request: Any, error: Any) -> Any:
    kind = "not_found_error" if error.status_code == 404 else "invalid_request_error"
    return _json(HTTPError(error.status_code, str(error.detail), kind=kind).body(), error.status_code)


# ---- reading a request ----


def authorize(state: Gate, request: Any) -> None:
    """Raise a 401 unless the request carries the server's key (if it has one), compared in constant time."""
    if state.api_key is None:
        return
    given = request.headers.get("authorization", "")
    token = given[7:] if given.lower().startswith("bearer ") else ""
    if not hmac.compare_digest(token.encode(), state.api_key.encode()):
        raise HTTPError(
            401,
            "missing or wrong API key (Authorization: Bearer KEY)",
            kind="invalid_request_error",
            code="invalid_api_key",
        )


def _too_large(cap: int, size: str) -> HTTPError:
    return HTTPError(
        413,
        f"the request body is {size} bytes; this server takes at most {cap:,} (--max-request-bytes)",
        kind="invalid_request_error",
        code="request_too_large",
    )


async def read_body(state: Gate, request: Any) -> dict[str, Any]:
    """The request's JSON object, once authorized: a body over the cap is a 413 before it is read whole,
    one that is not a JSON object (or names another model) an OpenAI-shaped error. A client that closes
    the connection mid-body is one log line and `ClientGone`."""
    authorize(state, request)
    cap = state.max_request_bytes
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > cap:  # refused before a byte of it is read
        raise _too_large(cap, f"{int(declared):,}")
    chunks = await _read_chunks(request, cap, declared)
    try:
        body = await asyncio.to_thread(json.loads, b"".join(chunks))
    except ValueError:
        raise bad("the request body is not valid JSON", None) from None
    except RecursionError:  # json's parser recurses per level: thousands of levels exhaust the stack
        raise bad("the request body is nested too deeply to be an OpenAI request", None) from None
    if not isinstance(body, dict):
        raise bad("the request body must be a JSON object", None)
    model = body.get("model")
    if model is not None and model != state.model_name:
        raise HTTPError(
            404,
            f"model {model!r} is not served here (this server serves {state.model_name!r})",
            kind="invalid_request_error",
            param="model",
            code="model_not_found",
        )
    return body


async def _read_chunks(request: Any, cap: int, declared: str) -> list[bytes]:
    from starlette.requests import ClientDisconnect

    chunks, size = [], 0
    try:
        async for chunk in request.stream():  # a body without a length (chunked) is counted as it comes
            size += len(chunk)
            if size > cap:
                raise _too_large(cap, f"over {cap:,}")
            chunks.append(chunk)
    except ClientDisconnect:  # Starlette's exception would be logged as a traceback: a line says it all
        client = request.client
        who = f"the client at {client.host}:{client.port}" if client else "a client"
        of = f" of {int(declared):,}" if declared.isdigit() else ""
        logger.warning(
            "zoo serve: %s closed the connection after %s%s bytes of its %s %s body; nothing was done",
            who,
            f"{size:,}",
            of,
            request.method,
            request.url.path,
        )
        raise ClientGone from None
    return chunks


def encode(state: AppState, text: str) -> list[int]:
    """A prompt's token ids: with a bos for a decoder (when the tokenizer has one), an eos for a source."""
    if not state.engine.seq2seq:
        return state.tokenizer.encode(text, add_bos=state.bos is not None, add_eos=False)
    return state.tokenizer.encode(text, add_eos=state.eos is not None)


# ---- the routes ----


async def models(request: Any) -> Any:
    """GET /v1/models: the one model served."""
    state = _state(request)
    authorize(state, request)
    return _json(
        {
            "object": "list",
            "data": [
                {"id": state.model_name, "object": "model", "created": state.created, "owned_by": "zoo"}
            ],
        }
    )


async def health(request: Any) -> Any:
    """GET /health: 200 while the engine runs, 503 once it stops (shutting down)."""
    state = _state(request)
    body, status = health_body(
        state.engine.running(), state.model_name, "the engine is not running (shutting down)"
    )
    return _json(body, status)


async def metrics(request: Any) -> Any:
    """GET /metrics: Prometheus' text format (`zoo.serving.metrics`)."""
    return await metrics_response(request.app.state.metrics)


async def no_embeddings(request: Any) -> Any:
    """POST /v1/embeddings to a generative model: a 400 saying which server answers it."""
    state = _state(request)
    authorize(state, request)
    raise HTTPError(
        400,
        f"model {state.model_name!r} is a generative model: /v1/embeddings is served for an embedding model "
        "(a sentence-transformers folder or an encoder: zoo serve FOLDER)",
        kind="invalid_request_error",
        code="model_not_supported",
    )


async def completions(request: Any) -> Any:
    """POST /v1/completions: one prompt, a string or token ids (or a list of one of them, as lm-eval's
    ``local-completions`` sends its batch of one)."""
    state = _state(request)
    body = await read_body(state, request)
    sampling = Sampling(body, "completions")
    sampling.grammar = grammar_of(body)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    text: str | None = None
    if isinstance(prompt, str):
        text = valid_text(prompt, "prompt")
        ids = await asyncio.to_thread(encode, state, text)
    elif (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(i, int) and not isinstance(i, bool) for i in prompt)
    ):
        ids = list(prompt)
    else:
        raise bad("prompt must be a string or a list of token ids (one prompt per request)", "prompt")
    if sampling.max_tokens is None:
        sampling.max_tokens = state.default_max_tokens  # OpenAI's default for completions
    return await respond(state, request, sampling, ids, chat=False, prompt_text=text)


async def chat_completions(request: Any) -> Any:
    """POST /v1/chat/completions: messages (and tools) through the chat template (a source: the last one's
    content). A forced tool call's prompt ends with its format's opener (`zoo.serving.tools`)."""
    state = _state(request)
    body = await read_body(state, request)
    sampling = Sampling(body, "chat")
    sampling.grammar = grammar_of(body)
    tools = read_tools(body, state.tool_format)
    if tools is not None and tools.forced:
        if sampling.grammar is not None:
            raise bad(
                "a forced tool call has its own grammar (the call's JSON): give tool_choice or "
                "response_format (guided_*), not both",
                "tool_choice",
            )
        try:
            sampling.grammar = await asyncio.to_thread(forced_grammar, tools)
        except GrammarMissing as error:
            raise HTTPError(501, str(error), kind="server_error", param="tool_choice") from None
    messages = check_messages(body.get("messages"), state.chat_template, state.tool_format)
    if state.engine.seq2seq:
        prompt = await asyncio.to_thread(encode, state, messages[-1]["content"])
    else:
        schemas = tools.schemas if tools is not None else None
        prompt = await asyncio.to_thread(render_chat, state.tokenizer, messages, schemas)
    if tools is not None and tools.forced and tools.format.opener:
        prompt += state.tokenizer.encode(tools.format.opener, add_bos=False, add_eos=False)
    return await respond(state, request, sampling, prompt, chat=True, tools=tools)


# ---- answering ----


async def respond(
    state: AppState,
    request: Any,
    sampling: Sampling,
    prompt: list[int],
    *,
    chat: bool,
    prompt_text: str | None = None,
    tools: Tools | None = None,
) -> Any:
    """Submit the request's ``n`` completions and answer with them: one JSON body once all are done, or
    server-sent events as they come. ``prompt_text``: a completion's prompt as given (None: token ids);
    ``tools``: a chat answer is read for tool calls; ``sampling.grammar``: every choice's text follows it."""
    relay = Relay(request, stream=sampling.stream)
    requests = sampling.completions(
        prompt,
        max(_positions(state.engine) - len(prompt), 1),
        relay.emit,
        stop_token_ids=state.turn_ends if chat else (),
        continues_prompt=not chat,  # a chat answer is a message of its own: no space before it
        skip_special_tokens=tools is None or not tools.reads,  # a call may start with one
    )
    _submit(state.engine, requests, chat=chat)
    # A streaming response listens for the disconnect itself (Starlette cancels it); a plain one writes
    # nothing until the end, so it must watch, or a client that left would hold its slots to the end.
    relay.follow(requests, watch=not sampling.stream)
    head = {
        "id": ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex,
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()),
        "model": state.model_name,
    }
    shape = Shape(state.tokenizer, sampling, prompt, prompt_text, chat=chat, tools=tools)
    if not sampling.stream:
        return _json(await _answer(relay, head, len(prompt), shape))
    from starlette.responses import StreamingResponse

    events = _sse(relay, head, len(prompt), shape, include_usage=sampling.include_usage)
    return StreamingResponse(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


def _submit(engine: Engine, requests: list[Completion], *, chat: bool) -> None:
    """Hand ``requests`` to the engine; its refusals as HTTP errors (413, 400, 503)."""
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


class Relay:
    """The events of one HTTP request's completions, from the engine's thread to the handler: ``emit(i)``
    is choice i's callback (run on the engine's thread, it only schedules a put on the event loop), and
    `results` reads them back in order. ``stream`` False (one JSON body at the end): of a choice's text
    pieces only the first crosses to the event loop (it times the first token); the body is the `Done`'s,
    and a wake-up of the loop per token would take the interpreter from the engine's thread for nothing."""

    def __init__(self, request: Any, *, stream: bool = True) -> None:
        self._request, self._stream = request, stream
        self._loop = asyncio.get_running_loop()
        self._events: asyncio.Queue[tuple[int, Event]] = asyncio.Queue()
        self._watcher: asyncio.Task[None] | None = None
        self.requests: list[Completion] = []
        self._timing = Timing(None)

    def emit(self, index: int) -> Callable[[Event], None]:
        pieces = 0  # Deltas seen for this choice

        def put(event: Event) -> None:
            nonlocal pieces
            if isinstance(event, Delta) and not self._stream:
                pieces += 1
                if pieces > 1:
                    return
            choice = index + event.choice if isinstance(event, Done) else index  # a beam request's k-th best
            self._loop.call_soon_threadsafe(self._events.put_nowait, (choice, event))

        return put

    def follow(self, requests: list[Completion], *, watch: bool) -> None:
        """Relay ``requests`` (submitted); ``watch``: end with `ClientGone` as soon as the client leaves."""
        self.requests = requests
        metrics = self._request.app.state.metrics
        if metrics is not None:
            self._timing = metrics.follow(requests)
        if watch:
            self._watcher = asyncio.ensure_future(self._gone())

    async def _gone(self) -> None:
        # The body is read: the next ASGI message is the client's disconnect, whenever it comes.
        while (await self._request.receive())["type"] != "http.disconnect":
            pass

    async def _next(self) -> tuple[int, Event]:
        if self._watcher is None:
            return await self._events.get()
        getting = asyncio.ensure_future(self._events.get())
        await asyncio.wait({getting, self._watcher}, return_when=asyncio.FIRST_COMPLETED)
        if getting.done():
            return getting.result()
        getting.cancel()
        raise ClientGone

    async def results(self) -> AsyncIterator[tuple[int, Event]]:
        """(choice, event) until every choice is done; a failure is a 500 `HTTPError`. However it ends,
        the requests are cancelled (nothing, once done), so a client that went away frees its slots."""
        left = sum(request.choices for request in self.requests)
        try:
            while left:
                index, event = await self._next()
                if isinstance(event, Failed):
                    raise HTTPError(500, event.message, kind="server_error")
                left -= isinstance(event, Done)
                self._timing.see(index, event)
                yield index, event
        finally:  # the client went away (or we failed): free the slots
            if self._watcher is not None:
                self._watcher.cancel()
            for r in self.requests:
                r.cancel()


class Shape:
    """How a request's answer is written: a chat message or a completion's text, with its log-probabilities
    when asked for (`zoo.serving.logprobs`) and, for ``echo``, the prompt's text before the completion."""

    def __init__(
        self,
        tokenizer: Any,
        sampling: Sampling,
        prompt: list[int],
        prompt_text: str | None,
        *,
        chat: bool,
        tools: Tools | None = None,
    ) -> None:
        self.tokenizer, self.chat, self.top, self.echo = tokenizer, chat, sampling.logprobs, sampling.echo
        self.prompt, self.prompt_text = prompt, prompt_text
        self.tools = tools if tools is not None and tools.reads else None  # read the answer for calls

    def echoed(self) -> str:
        """The prompt's text: as given, or its token ids decoded."""
        if self.prompt_text is None:
            self.prompt_text = str(self.tokenizer.decode(self.prompt, skip_special_tokens=False))
        return self.prompt_text

    def logprobs(self, entries: Sequence[TokenLogprob], offset: int = 0) -> dict[str, Any] | None:
        if self.top is None:
            return None
        if self.chat:
            return chat_logprobs(self.tokenizer, entries, top=self.top)
        return completion_logprobs(self.tokenizer, entries, top=self.top, offset=offset)

    def choice(self, index: int, done: Done) -> dict[str, Any]:
        """A finished choice of a whole (not streamed) response."""
        if self.chat:
            message: dict[str, Any] = {"role": "assistant", "content": done.text}
            finish: str = done.finish_reason
            found = (
                None if self.tools is None else read_calls(done.text, self.tools, forced=self.tools.forced)
            )
            if found is not None:
                message = {"role": "assistant", "content": found[0], "tool_calls": found[1]}
                finish = "tool_calls"
            logprobs = self.logprobs(done.logprobs)
            return {"index": index, "message": message, "logprobs": logprobs, "finish_reason": finish}
        text, entries, offset = done.text, done.logprobs, 0
        if self.echo:
            text, entries = self.echoed() + text, done.prompt_logprobs + entries
        elif self.top is not None:
            offset = len(self.echoed())  # the generated text's offsets count from the prompt's end
        logprobs = self.logprobs(entries, offset)
        return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": done.finish_reason}


async def _answer(relay: Relay, head: dict[str, Any], prompt_tokens: int, shape: Shape) -> dict[str, Any]:
    """The whole response body, once every choice is done."""
    done: dict[int, Done] = {}
    async for index, event in relay.results():
        if isinstance(event, Done):
            done[index] = event
    # log-probabilities decode every token they name: on a worker thread, not the event loop
    choices = await asyncio.to_thread(lambda: [shape.choice(i, d) for i, d in sorted(done.items())])
    return {**head, "choices": choices, "usage": usage(prompt_tokens, done.values())}


async def _sse(
    relay: Relay, head: dict[str, Any], prompt_tokens: int, shape: Shape, *, include_usage: bool
) -> AsyncIterator[str]:
    """The server-sent events of a streamed response: a chunk per piece of text (with its tokens'
    log-probabilities when asked for), one per finished choice (with those not sent yet), the usage when
    asked for, then ``[DONE]``; a failure is an error event."""
    chat = shape.chat
    chunk = {**head, "object": "chat.completion.chunk" if chat else "text_completion"}
    done: list[Done] = []
    sent: dict[int, int] = {}  # log-probabilities streamed, per choice
    offset = len(shape.echoed()) if shape.top is not None and not chat else 0
    offsets = dict.fromkeys(range(len(relay.requests)), offset)
    calls = {i: CallStream(shape.tools) for i in range(len(relay.requests))} if shape.tools else {}
    finish: str | None
    if chat:
        for i in range(len(relay.requests)):
            yield _event({**chunk, "choices": [_chat_choice(i, {"role": "assistant", "content": ""}, None)]})
    try:
        async for index, event in relay.results():
            if isinstance(event, Delta):
                text, entries, finish = event.text, event.logprobs, None
                sent[index] = sent.get(index, 0) + len(entries)
                delta: dict[str, Any] = {"content": calls[index].push(text) if calls else text}
            else:
                assert isinstance(event, Done)
                done.append(event)
                text, entries, finish, delta = (
                    "",
                    event.logprobs[sent.get(index, 0) :],
                    event.finish_reason,
                    {},
                )
                if calls:  # the text held back, as content or as the calls it holds
                    rest, found = calls[index].finish()
                    if found is not None:
                        delta, finish = {"tool_calls": _call_deltas(found)}, "tool_calls"
                    elif rest:
                        delta = {"content": rest}
            logprobs = shape.logprobs(entries, offsets[index]) if entries else None
            if logprobs is not None and not chat:
                offsets[index] += sum(len(t) for t in logprobs["tokens"])
            choice = (
                _chat_choice(index, delta, finish, logprobs)
                if chat
                else _text_choice(index, text, finish, logprobs)
            )
            yield _event({**chunk, "choices": [choice]})
    except HTTPError as error:
        yield _event(error.body())
        return
    if include_usage:
        yield _event({**chunk, "choices": [], "usage": usage(prompt_tokens, done)})
    yield "data: [DONE]\n\n"


def usage(prompt_tokens: int, done: Any) -> dict[str, int]:
    completion = sum(len(d.token_ids) for d in done)
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": prompt_tokens + completion,
    }


def _text_choice(
    index: int, text: str, finish: str | None, logprobs: dict[str, Any] | None = None
) -> dict[str, Any]:
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}


def _call_deltas(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Tool calls as a stream's ``delta.tool_calls``: each whole, with its index."""
    return [{"index": i, **call} for i, call in enumerate(calls)]


def _chat_choice(
    index: int, delta: dict[str, Any], finish: str | None, logprobs: dict[str, Any] | None = None
) -> dict[str, Any]:
    return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}


def _event(data: dict[str, Any]) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"
