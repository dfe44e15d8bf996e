"""zoo.io.images: pixel_values equal to transformers' ViTImageProcessor (its PIL backend) on odd-sized
images, modes and filters; refusals by name."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from zoo.io.images import ImageProcessor

Image = pytest.importorskip("PIL.Image")
transformers = pytest.importorskip("transformers")


def _images(seed: int) -> list:
    rng = np.random.default_rng(seed)
    sizes = [(37, 53), (225, 224), (9, 301), (224, 224)]
    images = [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for h, w in sizes]
    images.append(Image.fromarray(rng.integers(0, 256, (31, 17), dtype=np.uint8), mode="L").convert("RGB"))
    return images


def _reference(**kwargs: object):
    # ViTImageProcessor is transformers' torchvision backend; ViTImageProcessorPil runs the same steps on PIL
    cls = getattr(transformers, "ViTImageProcessorPil", None) or transformers.ViTImageProcessor
    return cls(**kwargs)


@pytest.mark.parametrize(
    "settings",
    [
        {},
        {"size": {"height": 32, "width": 48}, "resample": 3},
        {
            "size": {"height": 8, "width": 8},
            "image_mean": [0.485, 0.456, 0.406],
            "image_std": [0.229, 0.224, 0.225],
        },
    ],
)
def test_pixel_values_equal_transformers_vit_processor(settings: dict) -> None:
    reference = _reference(**settings)
    ours = ImageProcessor.from_hf(reference.to_dict())
    images = _images(len(settings))
    want = torch.as_tensor(np.stack(reference(images, return_tensors="np")["pixel_values"]))
    got = ours(images)
    assert got.shape == want.shape and got.dtype == torch.float32
    assert (got - want).abs().max().item() <= 1e-6


def test_defaults_are_vit_image_processor_defaults() -> None:
    assert ImageProcessor.from_hf(_reference().to_dict()) == ImageProcessor()
    assert ImageProcessor.from_hf(ImageProcessor().to_hf()) == ImageProcessor()


def test_one_image_is_a_batch_of_one() -> None:
    image = _images(0)[0]
    assert ImageProcessor(size=(16, 16))(image).shape == (1, 3, 16, 16)


def test_unsupported_settings_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="do_pad"):  # do_center_crop is CLIP's (tests/io/test_images_clip.py)
        ImageProcessor.from_hf({"do_pad": True})
    with pytest.raises(ValueError, match="resample 'cubic'"):
        ImageProcessor(resample="cubic")
    with pytest.raises(ValueError, match="expected a PIL image"):
        ImageProcessor()([np.zeros((4, 4, 3))])  # type: ignore[list-item]
