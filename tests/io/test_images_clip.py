"""CLIP's and SigLIP's image pre-processing equal transformers' processors (its PIL backend) on images of odd
sizes: CLIP's shortest-edge bicubic resize and center crop, SigLIP's fixed-size bicubic resize; rescale and
normalise in the same dtypes. Read from and written back to preprocessor_config.json."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from zoo.io.images import ImageProcessor
from zoo.io.jsonfile import read_json_object

transformers = pytest.importorskip("transformers")
Image = pytest.importorskip("PIL.Image")

SIZES = [(47, 33), (31, 64), (17, 19), (101, 57), (224, 225), (300, 11)]  # (width, height)


def images(mode: str = "RGB") -> list:
    rng = np.random.default_rng(0)
    out = [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for w, h in SIZES]
    return [image.convert(mode) for image in out]


def processors() -> list:
    return [
        transformers.CLIPImageProcessorPil(),  # openai/clip-vit-base-patch32's: 224, crop 224
        transformers.CLIPImageProcessorPil(size={"shortest_edge": 30}, crop_size={"height": 28, "width": 26}),
        transformers.SiglipImageProcessorPil(),  # google/siglip-base-patch16-224's
        transformers.SiglipImageProcessorPil(size={"height": 31, "width": 17}),
    ]


@pytest.mark.parametrize("index", range(4))
@pytest.mark.parametrize("mode", ["RGB", "L", "RGBA"])
def test_pixel_values_equal_transformers(tmp_path: Path, index: int, mode: str) -> None:
    theirs = processors()[index]
    theirs.save_pretrained(tmp_path)
    ours = ImageProcessor.from_hf(read_json_object(tmp_path / "preprocessor_config.json", error=ValueError))
    batch = images(mode)
    expected = theirs([image.copy() for image in batch], return_tensors="np")["pixel_values"]
    got = ours(batch).numpy()
    assert got.shape == expected.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, expected, atol=1e-6, rtol=0)


def test_the_config_round_trips(tmp_path: Path) -> None:
    for theirs in processors():
        theirs.save_pretrained(tmp_path)
        config = read_json_object(tmp_path / "preprocessor_config.json", error=ValueError)
        ours = ImageProcessor.from_hf(config)
        assert ImageProcessor.from_hf(ours.to_hf()) == ours
        back = type(theirs)(**{k: v for k, v in ours.to_hf().items() if k != "image_processor_type"})
        np.testing.assert_array_equal(
            back(images()[:2], return_tensors="np")["pixel_values"], ours(images()[:2]).numpy()
        )


def test_a_crop_larger_than_the_image_pads_with_zeros_as_transformers() -> None:
    theirs = transformers.CLIPImageProcessorPil(do_resize=False, crop_size={"height": 40, "width": 70})
    ours = ImageProcessor(do_resize=False, crop_size=(40, 70), image_mean=(0.5,) * 3, image_std=(0.5,) * 3)
    theirs.image_mean = theirs.image_std = [0.5] * 3
    image = images()[0]  # 47 x 33
    np.testing.assert_allclose(
        ours([image]).numpy(), theirs([image], return_tensors="np")["pixel_values"], atol=1e-6
    )
