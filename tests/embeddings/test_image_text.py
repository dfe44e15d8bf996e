"""zoo.embed over a dual encoder (CLIP, SigLIP): texts and images, each vector transformers' text_embeds /
image_embeds for the same inputs (its processors, its tokenization)."""

from __future__ import annotations

import base64
import io
from pathlib import Path

import numpy as np
import pytest
import torch
from image_text_support import images, make_folder

import zoo
from zoo.embeddings import Embedder

transformers = pytest.importorskip("transformers")
pytest.importorskip("PIL")

TEXTS = ["hello world", "the man is playing the guitar", "a man."]


def data_url(image: object) -> str:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")  # type: ignore[attr-defined]
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


@torch.no_grad()
def reference(family: str, hf: torch.nn.Module, processor: object, tokenizer: zoo.Tokenizer) -> np.ndarray:
    """transformers' unit text_embeds for TEXTS, then image_embeds for `images()`."""
    rows = tokenizer(TEXTS)["input_ids"]
    T = 16 if family == "siglip" else max(map(len, rows))  # SigLIP's processor pads to max_length
    ids = torch.tensor([row + [0] * (T - len(row)) for row in rows])
    mask = (torch.arange(T)[None] < torch.tensor([len(r) for r in rows])[:, None]).long()
    text = hf.get_text_features(input_ids=ids, **({"attention_mask": mask} if family == "clip" else {}))
    pixels = processor(images(), return_tensors="pt")["pixel_values"]  # type: ignore[operator]
    image = hf.get_image_features(pixel_values=pixels)
    vectors = [getattr(v, "pooler_output", v) for v in (text, image)]
    return torch.nn.functional.normalize(torch.cat(vectors), dim=-1).numpy()


@pytest.mark.parametrize("family", ["clip", "siglip"])
def test_embed_texts_and_images_equals_transformers(tmp_path: Path, family: str) -> None:
    folder, hf, processor = make_folder(tmp_path, family)
    inputs = [*TEXTS, *images()[:2], *map(data_url, images()[2:])]  # PIL images and data: URLs
    got = zoo.embed(folder, inputs)
    expected = reference(family, hf, processor, zoo.Tokenizer.from_file(folder))
    assert got.shape == (len(TEXTS) + 4, 24 if family == "clip" else 48)
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=0)
    # the order of the inputs is the order of the vectors
    np.testing.assert_allclose(zoo.embed(folder, inputs[::-1]), expected[::-1], atol=1e-5, rtol=0)


def test_a_dual_encoder_refuses_settings_it_does_not_read(tmp_path: Path) -> None:
    folder, _, _ = make_folder(tmp_path, "clip")
    with pytest.raises(ValueError, match="pooling: a dual encoder"):
        Embedder.load(folder, pooling="mean")
    with pytest.raises(ValueError, match=r"inputs\[1\]: the data: URL's base64 does not decode"):
        zoo.embed(folder, ["hello", "data:image/png;base64,!!"])
    with pytest.raises(ValueError, match=r"inputs\[0\]: not a readable image"):
        zoo.embed(folder, ["data:image/png;base64," + base64.b64encode(b"not a png").decode()])
