"""``zoo serve`` over a dual encoder (CLIP): /v1/embeddings embeds texts and images (``data:image/...;base64,``
URLs among the inputs) through the openai client, each vector zoo.embed's; a text-only model refuses an
image by its index, and an unreadable image is a 400 naming it."""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import openai
import pytest
import requests
from embed_support import make_hf_folder
from image_text_support import images, make_folder

import zoo
from zoo.embeddings import Embedder
from zoo.serving.embeddings import EmbeddingEngine
from zoo.serving.server import Server

pytest.importorskip("transformers")
pytest.importorskip("PIL")

NAME = "tiny-clip"


def data_url(image: object) -> str:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")  # type: ignore[attr-defined]
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


@pytest.fixture(scope="module")
def clip_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_folder(tmp_path_factory.mktemp("serve-clip"), "clip")[0]


@pytest.fixture(scope="module")
def server(clip_folder: Path) -> Iterator[Server]:
    engine = EmbeddingEngine(Embedder.load(clip_folder), batch_size=4)
    with Server(engine, None, model_name=NAME) as running:
        yield running


def test_texts_and_images_over_the_openai_client_equal_zoo_embed(server: Server, clip_folder: Path) -> None:
    inputs = ["hello world", data_url(images()[0]), "a man.", data_url(images()[1])]
    client = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=60)
    out = client.embeddings.create(model=NAME, input=inputs)
    got = np.array([d.embedding for d in out.data], dtype=np.float32)
    np.testing.assert_allclose(got, zoo.embed(clip_folder, inputs), atol=1e-6, rtol=0)
    texts = sum(
        len(ids) for ids in zoo.Tokenizer.from_file(clip_folder)(["hello world", "a man."])["input_ids"]
    )
    patches = 2 * (1 + 5 * 5)  # each image: its class token and 5 x 5 patches
    assert out.usage.prompt_tokens == texts + patches


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        (["hi", "data:image/png;base64,!!"], "inputs[1]: the data: URL's base64 does not decode"),
        (
            ["data:image/png;base64," + base64.b64encode(b"no png").decode()],
            "inputs[0]: not a readable image",
        ),
    ],
)
def test_an_unreadable_image_is_a_400_naming_it(server: Server, inputs: list[str], message: str) -> None:
    response = requests.post(server.url + "/embeddings", json={"model": NAME, "input": inputs}, timeout=60)
    error = response.json()["error"]
    assert response.status_code == 400 and error["param"] == "input" and error["message"].startswith(message)


def test_a_text_model_refuses_an_image_by_its_index(tmp_path: Path) -> None:
    engine = EmbeddingEngine(Embedder.load(make_hf_folder(tmp_path / "bert")), batch_size=4)
    with Server(engine, None, model_name="bert") as running:
        body = {"model": "bert", "input": ["hello", data_url(images()[0])]}
        response = requests.post(running.url + "/embeddings", json=body, timeout=60)
    error = response.json()["error"]
    assert response.status_code == 400 and error["param"] == "input"
    assert error["message"].startswith("input[1] is an image (a data:image URL); this model embeds text only")


def test_zoo_serve_serves_a_clip_folder_for_texts_and_images(
    clip_folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from zoo.cli import main
    from zoo.embeddings.image_text import ImageTextEmbedder

    seen: dict = {}
    monkeypatch.setattr(
        "zoo.serving.server.serve", lambda engine, tokenizer, **kwargs: seen.update(engine=engine)
    )
    assert main(["serve", str(clip_folder), "--port", "0", "--device", "cpu"]) == 0
    engine = seen["engine"]
    assert isinstance(engine, EmbeddingEngine) and isinstance(engine.embedder, ImageTextEmbedder)
    inputs = ["hello world", data_url(images()[0])]
    vectors, counts = engine.start().submit(inputs).result(30)
    assert counts[1] == 1 + 5 * 5  # the image: its class token and patches
    engine.close()
    np.testing.assert_allclose(vectors, zoo.embed(clip_folder, inputs), atol=1e-6, rtol=0)
