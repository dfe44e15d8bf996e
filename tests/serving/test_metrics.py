"""``GET /health`` and ``GET /metrics`` on a real server: the `openai` client makes requests, then the
Prometheus text is parsed with prometheus-client's own parser and every count checked exactly."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator

import openai
import pytest
import requests

import zoo
from tests.serving.conftest import MODEL_NAME
from zoo.serving import Engine
from zoo.serving.server import Server

parser = pytest.importorskip("prometheus_client.parser")


def _root(server: Server) -> str:
    return server.url.removesuffix("/v1")


def _client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=60)


def scrape(server: Server) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of ``/metrics``: (name, sorted labels) -> value."""
    response = requests.get(_root(server) + "/metrics", timeout=30)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in parser.text_string_to_metric_families(response.text)
        for sample in family.samples
    }


def requests_by(samples: dict, route: str, status: int) -> float:
    return samples.get(("zoo_requests_total", (("route", route), ("status", str(status)))), 0.0)


@pytest.fixture
def fresh(pretrained: zoo.Pretrained) -> Iterator[Server]:
    """A server of its own: counts start at zero."""
    engine = Engine(pretrained.model, pretrained.tokenizer, max_batch=4, max_queue=8, max_length=96)
    with Server(engine, pretrained.tokenizer, model_name=MODEL_NAME) as running:
        yield running


def test_health_is_ok_with_the_model_name(fresh: Server) -> None:
    response = requests.get(_root(fresh) + "/health", timeout=30)
    assert response.status_code == 200 and response.json() == {"status": "ok", "model": MODEL_NAME}


def test_health_is_503_once_the_engine_stops(pretrained: zoo.Pretrained) -> None:
    engine = Engine(pretrained.model, pretrained.tokenizer, max_batch=2, max_length=96)
    with Server(engine, pretrained.tokenizer, model_name=MODEL_NAME) as server:
        engine.close()  # as in a shutdown: the HTTP side still answers, the engine takes nothing
        response = requests.get(_root(server) + "/health", timeout=30)
        assert response.status_code == 503
        assert response.json()["status"] == "unavailable" and "shutting down" in response.json()["reason"]


def test_metrics_count_requests_tokens_and_latencies_exactly(fresh: Server) -> None:
    client = _client(fresh)
    one = client.completions.create(model=MODEL_NAME, prompt="the cat sat", max_tokens=5, temperature=0)
    two = client.chat.completions.create(
        model=MODEL_NAME, messages=[{"role": "user", "content": "the dog"}], max_tokens=3, n=2, seed=1
    )
    streamed = client.completions.create(
        model=MODEL_NAME, prompt="the mat", max_tokens=4, temperature=0, stream=True
    )
    assert sum(1 for _ in streamed) > 0
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=MODEL_NAME, prompt="x", max_tokens=2, extra_body={"max_tokns": 3})
    assert requests.get(_root(fresh) + "/health", timeout=30).status_code == 200
    assert requests.get(_root(fresh) + "/nowhere", timeout=30).status_code == 404

    samples = scrape(fresh)
    assert requests_by(samples, "/v1/completions", 200) == 2
    assert requests_by(samples, "/v1/chat/completions", 200) == 1
    assert requests_by(samples, "/v1/completions", 400) == 1
    assert requests_by(samples, "/health", 200) == 1
    assert requests_by(samples, "other", 404) == 1
    assert requests_by(samples, "/metrics", 200) == 0  # this scrape is counted once answered
    assert one.usage is not None and two.usage is not None
    prompt_mat = len(fresh.engine.tokenizer.encode("the mat", add_bos=True, add_eos=False))
    prompt = one.usage.prompt_tokens + two.usage.prompt_tokens + prompt_mat
    assert samples[("zoo_prompt_tokens_total", ())] == prompt
    assert samples[("zoo_generation_tokens_total", ())] == 5 + 2 * 3 + 4  # no eos: every run to its length
    # one first token and one time per token for each of the 4 choices (every one has > 1 token)
    assert samples[("zoo_time_to_first_token_seconds_count", ())] == 4
    assert samples[("zoo_time_per_output_token_seconds_count", ())] == 4
    assert samples[("zoo_time_to_first_token_seconds_sum", ())] > 0
    assert samples[("zoo_requests_running", ())] == 0 and samples[("zoo_requests_waiting", ())] == 0
    assert samples[("zoo_batch_slots", ())] == 4 and samples[("zoo_batch_occupancy", ())] == 0

    again = scrape(fresh)
    assert requests_by(again, "/v1/completions", 200) == 2 and requests_by(again, "/metrics", 200) == 1


def test_queue_depth_and_batch_occupancy_while_busy(pretrained: zoo.Pretrained) -> None:
    engine = Engine(pretrained.model, pretrained.tokenizer, max_batch=2, max_queue=4, max_length=400)
    step = engine._decode

    def slow_step() -> None:  # 300 steps would take 15 s: the runs are still going when scraped
        threading.Event().wait(0.05)
        step()

    engine._decode = slow_step  # type: ignore[method-assign]
    with Server(engine, pretrained.tokenizer, model_name=MODEL_NAME) as server:
        client = _client(server)
        streams = []
        for _ in range(2):
            streams.append(
                client.completions.create(model=MODEL_NAME, prompt="the", max_tokens=300, stream=True)
            )
            next(iter(streams[-1]))  # it runs in a slot
        streams.append(client.completions.create(model=MODEL_NAME, prompt="a", max_tokens=300, stream=True))
        samples = scrape(server)  # the third was submitted before its headers came: it waits
        assert samples[("zoo_requests_running", ())] == 2 and samples[("zoo_requests_waiting", ())] == 1
        assert samples[("zoo_batch_occupancy", ())] == 1.0
        for stream in streams:
            stream.close()


def test_two_servers_in_one_process_keep_their_own_counts(fresh: Server, pretrained: zoo.Pretrained) -> None:
    _client(fresh).completions.create(model=MODEL_NAME, prompt="the", max_tokens=2)
    engine = Engine(pretrained.model, pretrained.tokenizer, max_batch=2, max_length=96)
    with Server(engine, pretrained.tokenizer, model_name=MODEL_NAME) as other:
        assert requests_by(scrape(other), "/v1/completions", 200) == 0
    assert requests_by(scrape(fresh), "/v1/completions", 200) == 1


def test_without_prometheus_client_metrics_is_501_naming_the_extra(
    pretrained: zoo.Pretrained, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # `import prometheus_client` now fails
    engine = Engine(pretrained.model, pretrained.tokenizer, max_batch=2, max_length=96)
    with Server(engine, pretrained.tokenizer, model_name=MODEL_NAME) as server:
        response = requests.get(_root(server) + "/metrics", timeout=30)
        assert response.status_code == 501
        assert response.text.strip() == (
            "/metrics needs prometheus-client: pip install -e '.[metrics]' in zoo's clone "
            "(or: pip install prometheus-client)"
        )
        assert requests.get(_root(server) + "/health", timeout=30).status_code == 200
        out = _client(server).completions.create(model=MODEL_NAME, prompt="the", max_tokens=2)
        assert out.usage is not None and out.usage.completion_tokens == 2


def test_a_generative_server_answers_embeddings_with_a_400_saying_why(fresh: Server) -> None:
    with pytest.raises(openai.BadRequestError) as error:
        _client(fresh).embeddings.create(model=MODEL_NAME, input="the cat")
    assert error.value.status_code == 400
    assert "is a generative model: /v1/embeddings is served for an embedding model" in str(error.value)


def test_prefix_cache_hits_and_misses_are_counted_in_tokens(fresh: Server) -> None:
    """Two chats with one long system prompt: the second reads its blocks (hits); every prompt token is a
    hit or a miss; the bytes held and the bound are there."""
    client = _client(fresh)
    system = " ".join(f"the cat number {i} sat on the mat" for i in range(6))
    usage = []
    for question in ("the dog", "the mat"):
        out = client.chat.completions.create(
            model=MODEL_NAME,
            messages=[{"role": "system", "content": system}, {"role": "user", "content": question}],
            max_tokens=2,
            temperature=0,
        )
        assert out.usage is not None
        usage.append(out.usage.prompt_tokens)
    samples = scrape(fresh)
    hits = samples[("zoo_prefix_cache_hit_tokens_total", ())]
    assert hits >= 32 and hits % 16 == 0  # whole blocks of the system prompt
    assert hits + samples[("zoo_prefix_cache_miss_tokens_total", ())] == sum(usage)
    assert 0 < samples[("zoo_prefix_cache_bytes", ())] <= samples[("zoo_prefix_cache_max_bytes", ())] == 2**30


def test_without_a_prefix_cache_its_series_are_absent(pretrained: zoo.Pretrained) -> None:
    engine = Engine(pretrained.model, pretrained.tokenizer, max_batch=2, max_length=96, prefix_cache_bytes=0)
    with Server(engine, pretrained.tokenizer, model_name=MODEL_NAME) as server:
        _client(server).completions.create(model=MODEL_NAME, prompt="the", max_tokens=2)
        assert not any(name.startswith("zoo_prefix_cache") for name, _ in scrape(server))
