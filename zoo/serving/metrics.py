"""``GET /metrics`` and ``GET /health``: what a server did and whether it can answer, for Prometheus and for
a load balancer.

Each app owns its own `prometheus_client.CollectorRegistry` (never the process-wide one), so several servers
in one process (tests, notebooks) keep their own counts. prometheus-client is the ``metrics`` extra, imported
when an app is made; without it the app still serves, and ``/metrics`` answers 501 naming the extra (a
server is not refused for lacking its monitoring, and a scraper gets a line that says what to install).

    zoo_requests_total{route, status}          every HTTP answer, by route (unknown paths: "other")
    zoo_prompt_tokens_total                    prompt tokens of the accepted requests (as usage counts them)
    zoo_generation_tokens_total                tokens generated, every choice of every finished request
    zoo_requests_running / _waiting            sequences in a slot / submitted and waiting for one
    zoo_batch_slots, zoo_batch_occupancy       the slots (--max-batch), and running / slots
    zoo_time_to_first_token_seconds            submit -> a choice's first event (text, or its end)
    zoo_time_per_output_token_seconds          a finished choice's (end - first) / (tokens - 1)
    zoo_prefix_cache_hit_tokens_total          prompt tokens whose keys/values the prefix cache gave
    zoo_prefix_cache_miss_tokens_total         prompt tokens prefilled while it was on
    zoo_prefix_cache_bytes / _max_bytes        what it holds now, and its bound (--prefix-cache-bytes)

The prefix cache's series are there when the server has one (`zoo.serving.prefix`).

The times are taken where the HTTP handler reads the engine's events: what a client waits, not the kernel.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from zoo._extras import install_hint
from zoo.serving.requests import Completion, Delta, Done, Event

if TYPE_CHECKING:
    from zoo.serving.prefix import PrefixStats

ROUTES = (
    "/v1/models",
    "/v1/completions",
    "/v1/chat/completions",
    "/v1/embeddings",
    "/health",
    "/metrics",
)
MISSING = f"/metrics needs prometheus-client: {install_hint('metrics')}"
# vLLM's buckets: from a cached 1 ms to a cold 40 s first token; 10 ms .. 2.5 s a token.
TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    10.0,
    20.0,
    40.0,
)
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)

# (running, waiting, slots): read from the server when scraped; slots None where there are none.
Load = Callable[[], tuple[int, int, int | None]]
# The prefix cache's counters, read when scraped; None where there is none.
Prefix = Callable[[], "PrefixStats | None"]


class ServingMetrics:
    """One app's counters and histograms, in its own registry; ``load`` gives the gauges when scraped, and
    ``prefix`` the prefix cache's series."""

    def __init__(self, load: Load, prefix: Prefix | None = None) -> None:
        import prometheus_client as prom

        self.registry = prom.CollectorRegistry()
        r = self.registry
        self.requests = prom.Counter(
            "zoo_requests", "HTTP requests answered, by route and status", ["route", "status"], registry=r
        )
        self.prompt_tokens = prom.Counter(
            "zoo_prompt_tokens", "prompt tokens of the accepted requests", registry=r
        )
        self.generation_tokens = prom.Counter(
            "zoo_generation_tokens", "tokens generated (every choice of every finished request)", registry=r
        )
        self.ttft = prom.Histogram(
            "zoo_time_to_first_token_seconds",
            "from submitting a request to a choice's first token",
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.tpot = prom.Histogram(
            "zoo_time_per_output_token_seconds",
            "a finished choice's time per token after its first",
            buckets=TPOT_BUCKETS,
            registry=r,
        )
        self._load = load
        running = prom.Gauge("zoo_requests_running", "sequences being generated (in a slot)", registry=r)
        running.set_function(lambda: load()[0])
        waiting = prom.Gauge("zoo_requests_waiting", "sequences submitted, waiting for a slot", registry=r)
        waiting.set_function(lambda: load()[1])
        if load()[2] is not None:
            slots = prom.Gauge("zoo_batch_slots", "slots: sequences decoded together", registry=r)
            slots.set_function(lambda: load()[2] or 0)
            occupancy = prom.Gauge("zoo_batch_occupancy", "slots in use / slots", registry=r)
            occupancy.set_function(lambda: load()[0] / (load()[2] or 1))
        if prefix is not None and prefix() is not None:
            r.register(PrefixCacheCollector(prefix))

    def text(self) -> bytes:
        """The registry in Prometheus' text format."""
        import prometheus_client as prom

        return prom.generate_latest(self.registry)

    def answered(self, path: str, status: int) -> None:
        self.requests.labels(route=path if path in ROUTES else "other", status=str(status)).inc()

    def follow(self, requests: Sequence[Completion]) -> Timing:
        """Start timing one HTTP request's (submitted) completions; counts its prompt tokens once."""
        if requests:
            self.prompt_tokens.inc(len(requests[0].prompt))
        return Timing(self)


class PrefixCacheCollector:
    """The prefix cache's counters as Prometheus series, read from the engine when scraped (the engine
    counts them on its own thread; a Counter would need incrementing from there)."""

    def __init__(self, prefix: Prefix) -> None:
        self.prefix = prefix

    def collect(self) -> Any:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        stats = self.prefix()
        hits, misses, held, bound = (
            (0, 0, 0, 0)
            if stats is None
            else (stats.hit_tokens, stats.miss_tokens, stats.bytes, stats.max_bytes)
        )
        yield CounterMetricFamily(
            "zoo_prefix_cache_hit_tokens",
            "prompt tokens whose keys/values came from the prefix cache",
            value=hits,
        )
        yield CounterMetricFamily(
            "zoo_prefix_cache_miss_tokens",
            "prompt tokens prefilled while the prefix cache was on",
            value=misses,
        )
        yield GaugeMetricFamily("zoo_prefix_cache_bytes", "bytes the prefix cache holds", value=held)
        yield GaugeMetricFamily(
            "zoo_prefix_cache_max_bytes", "the prefix cache's bound (--prefix-cache-bytes)", value=bound
        )

    def describe(self) -> Any:
        return self.collect()


class Timing:
    """The times of one HTTP request's choices: `see` each event as the handler reads it."""

    def __init__(self, metrics: ServingMetrics | None) -> None:
        self.metrics = metrics
        self.start = time.perf_counter()
        self.first: dict[int, float] = {}

    def see(self, index: int, event: Event) -> None:
        if self.metrics is None or not isinstance(event, (Delta, Done)):
            return
        now = time.perf_counter()
        if index not in self.first:
            self.first[index] = now
            self.metrics.ttft.observe(now - self.start)
        if isinstance(event, Done):
            self.metrics.generation_tokens.inc(len(event.token_ids))
            if len(event.token_ids) > 1:
                self.metrics.tpot.observe((now - self.first[index]) / (len(event.token_ids) - 1))


def make_metrics(load: Load, prefix: Prefix | None = None) -> ServingMetrics | None:
    """An app's metrics, or None without prometheus-client (then ``/metrics`` is a 501)."""
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        return None
    return ServingMetrics(load, prefix)


class CountRequests:
    """ASGI middleware: every HTTP answer counted by route and status (an exception: 500)."""

    def __init__(self, app: Any, metrics: ServingMetrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500

        async def sending(message: Any) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            self.metrics.answered(scope["path"], status)


def health_body(ok: bool, model_name: str, why: str) -> tuple[dict[str, Any], int]:
    """``/health``'s answer: 200 and ``{"status": "ok", "model"}``, or 503 saying why not."""
    if ok:
        return {"status": "ok", "model": model_name}, 200
    return {"status": "unavailable", "model": model_name, "reason": why}, 503


async def metrics_response(metrics: ServingMetrics | None) -> Any:
    """``/metrics``: Prometheus' text, or a 501 naming the extra to install."""
    import asyncio

    from starlette.responses import PlainTextResponse, Response

    if metrics is None:
        return PlainTextResponse(MISSING + "\n", status_code=501)
    from prometheus_client import CONTENT_TYPE_LATEST

    return Response(await asyncio.to_thread(metrics.text), media_type=CONTENT_TYPE_LATEST)
