"""``POST /v1/embeddings`` for an embedding model (a sentence-transformers folder, or an encoder): OpenAI's
request and response shapes over `zoo.embeddings.Embedder`, so a vector equals ``zoo.embed``'s.

    engine = EmbeddingEngine(Embedder.load("all-MiniLM-L6-v2/"), batch_size=32).start()
    app = create_embedding_app(engine, model_name="minilm")

`EmbeddingEngine` runs one background thread: the requests waiting when it is free are embedded together
(up to ``batch_size`` texts, sorted by length inside the `Embedder`), so concurrent clients share forward
passes; should the group fail, each request is retried alone, so one bad request fails alone. Such an app
answers ``/v1/models``, ``/v1/embeddings``, ``/health`` and ``/metrics``; ``/v1/completions`` and
``/v1/chat/completions`` are a 400 saying the model is an embedding model (and a generative model's app
answers ``/v1/embeddings`` with a 400 saying the converse).

Fields: ``input`` (a string or a list of up to 2048 strings; token ids are refused: the `Embedder` puts
the folder's prompt before the text and cuts it to the max length, which ids would bypass; a dual encoder
(CLIP, SigLIP) also takes images, each a ``data:image/<type>;base64,<data>`` string among the texts, and a
text-only model refuses one by its index),
``encoding_format`` (``float`` or ``base64``: little-endian float32, as the openai client decodes it),
``dimensions`` (the first d components, then unit length again when the model normalises: Matryoshka
truncation), ``user`` (a label), ``model``; any other key is a 400 naming it.
"""

from __future__ import annotations

import asyncio
import base64
import difflib
import logging
import queue
import re
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from zoo.generation.config import check_model
from zoo.io.names import ST_MODULES_NAME
from zoo.serving.api import (
    add_error_handlers,
    add_monitoring,
    authorize,
    check_api_key,
    import_fastapi,
    read_body,
)
from zoo.serving.bodies import LABELS, HTTPError, bad
from zoo.serving.metrics import health_body, make_metrics
from zoo.serving.requests import QueueFull, RequestError, valid_text

if TYPE_CHECKING:
    from fastapi import FastAPI

    from zoo.embeddings.embedder import Embedder
    from zoo.embeddings.image_text import ImageTextEmbedder

logger = logging.getLogger(__name__)

FIELDS = ("model", "input", "encoding_format", "dimensions")
IMAGE_URL = re.compile(r"data:image/", re.IGNORECASE)  # an image given inline (`zoo.embeddings.image_text`)
MAX_INPUTS = 2048  # OpenAI's limit on the texts of one request
MAX_REQUEST_BYTES = 16 << 20  # texts are cut to what max_length keeps before they are tokenised


def is_embedding_folder(folder: str | Path) -> bool:
    """A sentence-transformers folder (its ``modules.json``): served as an embedding model, whatever the
    Transformer module is (an encoder, or a decoder embedder such as Qwen3-Embedding)."""
    return (Path(folder).expanduser() / ST_MODULES_NAME).is_file()


def generative(model: object) -> bool:
    """Whether ``model`` generates text (a decoder or an encoder-decoder with an LM head): else ``zoo serve``
    serves it as an embedding model."""
    try:
        check_model(model)
    except ValueError:
        return False
    return True


@dataclass
class _Job:
    texts: list[str]
    future: Future[tuple[np.ndarray, list[int]]]


class EmbeddingEngine:
    """``embedder`` behind a bounded queue and one thread: `submit` texts, get a future of their (N, dim)
    vectors and token counts. ``batch_size``: texts per forward pass, and the most that waiting requests are
    grouped to (a larger request runs alone, in batches); ``max_queue``: requests that may wait."""

    def __init__(
        self, embedder: Embedder | ImageTextEmbedder, *, batch_size: int = 32, max_queue: int = 64
    ) -> None:
        if batch_size < 1 or max_queue < 0:
            raise ValueError("batch_size must be >= 1, max_queue >= 0")
        self.embedder = embedder
        self.batch_size, self.max_queue = batch_size, max_queue
        self._inbox: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._waiting = 0  # submitted, not yet taken into a group
        self._running = 0  # in the group being embedded
        self._closing = False
        self._thread: threading.Thread | None = None

    @property
    def dim(self) -> int:
        return self.embedder.dim

    def start(self) -> EmbeddingEngine:
        self._thread = threading.Thread(target=self._loop, name="zoo-serve-embed", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop: requests still waiting fail with "the server is shutting down"."""
        with self._lock:
            self._closing = True
        self._inbox.put(None)
        if self._thread is not None:
            self._thread.join()

    def running(self) -> bool:
        """Whether the thread runs and is not shutting down (`/health`)."""
        return self._thread is not None and self._thread.is_alive() and not self._closing

    def load(self) -> tuple[int, int, int | None]:
        """(requests being embedded, requests waiting, None: no slots), for `/metrics`."""
        with self._lock:
            return self._running, self._waiting, None

    def submit(self, texts: list[str]) -> Future[tuple[np.ndarray, list[int]]]:
        """Queue ``texts``: `QueueFull` when ``max_queue`` requests already wait (or the server stops)."""
        job = _Job(texts, Future())
        with self._lock:
            if self._closing:
                raise QueueFull("the server is shutting down")
            if self._waiting >= max(self.max_queue, 1):
                raise QueueFull(f"the server is busy: {self._waiting} requests waiting")
            self._waiting += 1
        self._inbox.put(job)
        return job.future

    def _loop(self) -> None:
        held: _Job | None = None  # taken from the inbox but left for the next group (it did not fit)
        while True:
            job = held if held is not None else self._inbox.get()
            held = None
            if job is None:
                break
            group = [job]
            size = len(job.texts)
            while True:  # the requests that waited meanwhile, up to batch_size texts
                try:
                    more = self._inbox.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    self._inbox.put(None)
                    break
                if size + len(more.texts) > self.batch_size:
                    held = more
                    break
                group.append(more)
                size += len(more.texts)
            with self._lock:
                self._waiting -= len(group)
                self._running = len(group)
            self._run(group)
            with self._lock:
                self._running = 0
        self._fail_rest()

    def _run(self, group: list[_Job]) -> None:
        try:
            texts = [text for job in group for text in job.texts]
            vectors = self.embedder(texts, batch_size=self.batch_size)  # (N, dim)
            counts = self.embedder.counts(texts)
        except Exception as error:
            if len(group) > 1:  # one request's texts failed the group: each alone, so only it fails
                for job in group:
                    self._run([job])
                return
            if not isinstance(error, ValueError):
                logger.exception("zoo serve: embedding failed")
            group[0].future.set_exception(error)
            return
        start = 0
        for job in group:
            end = start + len(job.texts)
            job.future.set_result((vectors[start:end], counts[start:end]))
            start = end

    def _fail_rest(self) -> None:
        while True:
            try:
                job = self._inbox.get_nowait()
            except queue.Empty:
                return
            if job is not None:
                job.future.set_exception(QueueFull("the server is shutting down"))


@dataclass(frozen=True)
class EmbeddingState:
    """What the embedding app's handlers read (``app.state.zoo``)."""

    engine: EmbeddingEngine
    model_name: str
    api_key: str | None
    max_request_bytes: int
    created: int


def create_embedding_app(
    engine: EmbeddingEngine,
    *,
    model_name: str,
    api_key: str | None = None,
    max_request_bytes: int | None = None,
) -> FastAPI:
    """The FastAPI app serving ``engine``'s embeddings under ``model_name`` (see `zoo.serving.api.create_app`
    for ``api_key`` and ``max_request_bytes``, default here `MAX_REQUEST_BYTES`)."""
    check_api_key(api_key)
    cap = max_request_bytes if max_request_bytes is not None else MAX_REQUEST_BYTES
    if cap < 1:
        raise ValueError(f"max_request_bytes must be >= 1, got {cap}")
    fastapi = import_fastapi()
    app = fastapi.FastAPI(title="zoo serve", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.zoo = EmbeddingState(engine, model_name, api_key, cap, int(time.time()))
    app.state.metrics = make_metrics(engine.load)
    add_error_handlers(app)
    app.add_route("/v1/models", models, methods=["GET"])
    app.add_route("/v1/embeddings", embeddings, methods=["POST"])
    app.add_route("/v1/completions", not_generative, methods=["POST"])
    app.add_route("/v1/chat/completions", not_generative, methods=["POST"])
    add_monitoring(app, health)
    return app


def _state(request: Any) -> EmbeddingState:
    state: EmbeddingState = request.app.state.zoo
    return state


async def models(request: Any) -> Any:
    """GET /v1/models: the one model served."""
    state = _state(request)
    authorize(state, request)
    entry = {"id": state.model_name, "object": "model", "created": state.created, "owned_by": "zoo"}
    return _json({"object": "list", "data": [entry]})


async def health(request: Any) -> Any:
    """GET /health: 200 while the embedding thread runs, 503 once it stops (shutting down)."""
    state = _state(request)
    body, status = health_body(
        state.engine.running(), state.model_name, "the embedding thread is not running (shutting down)"
    )
    return _json(body, status)


async def not_generative(request: Any) -> Any:
    """/v1/completions and /v1/chat/completions: a 400 saying this model embeds, and where to ask."""
    state = _state(request)
    authorize(state, request)
    raise HTTPError(
        400,
        f"model {state.model_name!r} is an embedding model: it answers /v1/embeddings only; "
        f"{request.url.path} needs a generative model (a decoder or an encoder-decoder with an LM head)",
        kind="invalid_request_error",
        code="model_not_supported",
    )


async def embeddings(request: Any) -> Any:
    """POST /v1/embeddings: one vector per input text."""
    state = _state(request)
    body = await read_body(state, request)
    engine = state.engine
    texts, encoding, dimensions = await asyncio.to_thread(
        check_body, body, engine.dim, images=engine.embedder.reads_images
    )
    try:
        future = state.engine.submit(texts)
    except QueueFull as error:
        raise HTTPError(503, str(error), kind="server_error", code="overloaded") from None
    try:
        vectors, counts = await asyncio.wrap_future(future)
    except QueueFull as error:
        raise HTTPError(503, str(error), kind="server_error", code="overloaded") from None
    except ValueError as error:  # a text the embedder refuses (no tokens at all)
        raise bad(str(error), "input") from None
    data = await asyncio.to_thread(
        _data, vectors, dimensions, state.engine.embedder.normalize, encoding == "base64"
    )
    tokens = sum(counts)
    metrics = request.app.state.metrics
    if metrics is not None:
        metrics.prompt_tokens.inc(tokens)
    return _json(
        {
            "object": "list",
            "data": data,
            "model": state.model_name,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }
    )


def check_body(body: dict[str, Any], dim: int, *, images: bool = False) -> tuple[list[str], str, int | None]:
    """(texts, encoding_format, dimensions) of a request body, or a 400 naming the field at fault.
    ``images``: the model embeds images too (a dual encoder), given as ``data:image/...;base64,`` URLs."""
    for name, value in body.items():
        if name in FIELDS:
            continue
        if name in LABELS:
            if value is not None and not isinstance(value, str):
                raise bad(f"{name} must be a string, got {value!r}", name)
            continue
        close = difflib.get_close_matches(name, (*FIELDS, *LABELS), n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise bad(f"unknown field {name!r} for /v1/embeddings{hint}", name)
    texts = _texts(body.get("input"), images=images)
    encoding = body.get("encoding_format")
    encoding = "float" if encoding is None else encoding
    if encoding not in ("float", "base64"):
        raise bad(f"encoding_format must be 'float' or 'base64', got {encoding!r}", "encoding_format")
    dimensions = body.get("dimensions")
    if dimensions is not None and (
        not isinstance(dimensions, int) or isinstance(dimensions, bool) or not 1 <= dimensions <= dim
    ):
        raise bad(f"dimensions must be an integer in [1, {dim}] (this model's width), got {dimensions!r}",
                  "dimensions")  # fmt: skip
    return texts, encoding, dimensions


def _texts(given: object, *, images: bool) -> list[str]:
    if isinstance(given, str):
        given = [given]
    if not isinstance(given, list) or not given:
        raise bad("input must be a string or a non-empty list of strings", "input")
    if len(given) > MAX_INPUTS:
        raise bad(f"input holds {len(given)} texts; at most {MAX_INPUTS} a request", "input")
    for i, text in enumerate(given):
        if not isinstance(text, str):
            raise bad(
                f"input[{i}] is {type(text).__name__}: zoo serve embeds text (a string or a list of strings; "
                "token ids are not supported)",
                "input",
            )
        try:
            valid_text(text, f"input[{i}]")
        except RequestError as error:
            raise bad(str(error), "input") from None
        if not images and IMAGE_URL.match(text):
            raise bad(
                f"input[{i}] is an image (a data:image URL); this model embeds text only (a dual encoder such "
                "as CLIP or SigLIP embeds images)",
                "input",
            )
    return given


def _data(
    vectors: np.ndarray, dimensions: int | None, normalize: bool, as_base64: bool
) -> list[dict[str, Any]]:
    """The response's ``data``: (N, dim) vectors, cut to ``dimensions`` (then unit length again when the
    model normalises), as lists of floats or base64 float32."""
    if dimensions is not None:
        vectors = vectors[:, :dimensions]  # (N, d)
        if normalize:
            norms = np.linalg.norm(vectors, axis=1, keepdims=True)
            vectors = vectors / np.maximum(norms, 1e-12)  # F.normalize's eps
    vectors = np.ascontiguousarray(vectors, dtype="<f4")
    return [
        {
            "object": "embedding",
            "index": i,
            "embedding": base64.b64encode(v.tobytes()).decode("ascii") if as_base64 else v.tolist(),
        }
        for i, v in enumerate(vectors)
    ]


def _json(content: dict[str, Any], status: int = 200) -> Any:
    from starlette.responses import JSONResponse  # the serve extra, there once an app exists

    return JSONResponse(content, status_code=status)
