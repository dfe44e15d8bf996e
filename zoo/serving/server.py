"""Run the engine and its HTTP app: `serve` (the ``zoo serve`` command's body) and `Server` (a thread, for
tests and notebooks). The engine is a generative model's `Engine` or an embedding model's `EmbeddingEngine`
(`zoo.serving.embeddings`), each with its app.

Shutdown (SIGTERM, or SIGINT / Ctrl-C): uvicorn stops accepting connections and lets the requests in
flight finish, for up to ``grace_s`` seconds; then the engine stops, and any request still running gets an
error. A second Ctrl-C exits at once. Either way the process exits with status 0.
"""

from __future__ import annotations

import errno
import signal
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from zoo.serving.api import ServeExtraMissing, create_app
from zoo.serving.embeddings import EmbeddingEngine, create_embedding_app
from zoo.serving.engine import Engine

GRACE_S = 30


def _uvicorn() -> Any:
    try:
        import uvicorn
    except ImportError as error:
        raise ServeExtraMissing() from error
    return uvicorn


def _server(app: Any, host: str, port: int, grace_s: float) -> Any:
    uvicorn = _uvicorn()

    class QuietServer(uvicorn.Server):  # type: ignore[name-defined]
        """uvicorn's server, whose signal handling does not re-raise the signal once shut down (its
        default, which would end the process with the signal's status rather than 0)."""

        @contextmanager
        def capture_signals(self) -> Iterator[None]:
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            handled = (signal.SIGINT, signal.SIGTERM)
            original = {sig: signal.signal(sig, self.handle_exit) for sig in handled}
            try:
                yield
            finally:
                for sig, handler in original.items():
                    signal.signal(sig, handler)

    config = uvicorn.Config(
        app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=grace_s, lifespan="off"
    )
    return QuietServer(config)


class PortInUseError(OSError):
    """Another process listens on the address `serve` was asked to listen on."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def check_port(host: str, port: int) -> None:
    """Raise `PortInUseError` when ``port`` on ``host`` is taken (port 0 is any free one): said in a line
    before a model is loaded, rather than as uvicorn's ``[Errno 98]`` log line once it is. The probe binds
    as uvicorn does (SO_REUSEADDR), so a port whose last connections linger in TIME_WAIT counts as free.
    Any other bind error (an address not of this host, a port that needs privileges, a host that does not
    resolve, an empty one) is an OSError naming the address, in one line: uvicorn would log its own
    ``[Errno -2]`` line once the model is loaded, then exit with status 3."""
    if not host.strip():
        raise OSError("zoo serve: the host is empty (127.0.0.1: this machine only; 0.0.0.0: every address)")
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except (OSError, UnicodeError) as error:
        why = getattr(error, "strerror", None) or str(error)
        raise OSError(f"zoo serve: cannot listen on {host}:{port} ({why})") from None
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as error:
            if error.errno == errno.EADDRINUSE and port != 0:
                raise PortInUseError(f"zoo serve: port {port} on {host} is already in use") from None
            raise OSError(f"zoo serve: cannot listen on {host}:{port} ({error.strerror or error})") from None


def make_app(
    engine: Engine | EmbeddingEngine,
    tokenizer: Any,
    *,
    model_name: str,
    api_key: str | None = None,
    max_request_bytes: int | None = None,
) -> Any:
    """The app for ``engine``: `create_app` for a generative model, `create_embedding_app` for an embedder
    (which tokenizes by itself: ``tokenizer`` is not used)."""
    if isinstance(engine, EmbeddingEngine):
        return create_embedding_app(
            engine, model_name=model_name, api_key=api_key, max_request_bytes=max_request_bytes
        )
    return create_app(
        engine, tokenizer, model_name=model_name, api_key=api_key, max_request_bytes=max_request_bytes
    )


def _url(server: Any, host: str) -> str:
    port = server.servers[0].sockets[0].getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/v1"


def serve(
    engine: Engine | EmbeddingEngine,
    tokenizer: Any,
    *,
    model_name: str,
    host: str = "127.0.0.1",
    port: int = 8000,
    api_key: str | None = None,
    grace_s: float = GRACE_S,
    on_ready: Callable[[str], None] | None = None,
    max_request_bytes: int | None = None,
) -> None:
    """Serve ``engine`` until SIGTERM / SIGINT; ``on_ready(url)`` once it listens (port 0: any free port).
    A port in use is a `PortInUseError`, before the engine starts."""
    check_port(host, port)
    app = make_app(
        engine, tokenizer, model_name=model_name, api_key=api_key, max_request_bytes=max_request_bytes
    )
    server = _server(app, host, port, grace_s)
    engine.start()
    watcher = threading.Thread(target=_announce, args=(server, host, on_ready), daemon=True)
    watcher.start()
    try:
        server.run()
    except SystemExit:  # uvicorn's way to fail a start (status 3, after logging why)
        if server.started:
            raise
    finally:
        engine.close()
    if not server.started:
        raise OSError(
            f"zoo serve: could not listen on {host}:{port} (in use, or not an address of this host?)"
        )


def _announce(server: Any, host: str, on_ready: Callable[[str], None] | None) -> None:
    while not server.started and not server.should_exit:
        threading.Event().wait(0.02)
    if server.started and on_ready is not None:
        on_ready(_url(server, host))


class Server:
    """The app served from a background thread (tests, notebooks): ``url`` once started; `stop` ends it.

    >>> with Server(engine, tokenizer, model_name="tiny") as server:
    ...     openai.OpenAI(base_url=server.url, api_key="-")
    """

    def __init__(
        self,
        engine: Engine | EmbeddingEngine,
        tokenizer: Any,
        *,
        model_name: str,
        api_key: str | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.engine = engine
        self._host = host
        self._server = _server(
            make_app(engine, tokenizer, model_name=model_name, api_key=api_key), host, port, 5
        )
        self._thread = threading.Thread(target=self._server.run, name="zoo-serve-http", daemon=True)
        self.url = ""

    def start(self) -> Server:
        self.engine.start()
        self._thread.start()
        while not self._server.started:
            if not self._thread.is_alive():
                raise OSError("zoo serve: the server did not start")
            threading.Event().wait(0.01)
        self.url = _url(self._server, self._host)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join()
        self.engine.close()

    def __enter__(self) -> Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
