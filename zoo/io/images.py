"""Image pre-processing, exact to Hugging Face's image processors, torchvision-free (Pillow and numpy).

    PIL image ──RGB──> resize (PIL, the processor's filter) ──> uint8 (H, W, Ch)
        ──× rescale_factor (float64, then float32)──> (x - mean) / std (float32) ──> (Ch, H, W)

Each step is the one transformers' ``PilBackend`` runs (``image_transforms.resize``, ``rescale``,
``normalize``), in the same dtypes, so ``pixel_values`` match ``ViTImageProcessor`` to float32 rounding
(tests/io/test_images.py). `ImageProcessor.from_hf` reads a ``preprocessor_config.json``; a setting this
module does not implement is refused by name, never skipped. Pillow is the ``vision`` extra.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from zoo._extras import install_hint

if TYPE_CHECKING:
    from PIL import Image

IMAGENET_STANDARD_MEAN = (0.5, 0.5, 0.5)  # ViT's (transformers' IMAGENET_STANDARD_*)
IMAGENET_STANDARD_STD = (0.5, 0.5, 0.5)
RESAMPLE = {"nearest": 0, "lanczos": 1, "bilinear": 2, "bicubic": 3, "box": 4, "hamming": 5}
"""PIL's filter numbers, which preprocessor_config.json's ``resample`` holds."""


def _positive(value: Any, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{where} must be a positive integer, got {value!r}")
    return value


def center_crop(x: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """(H, W, Ch) -> (h, w, Ch), the middle of the image, as transformers' ``center_crop``: the top-left corner at
    ((H - h) // 2, (W - w) // 2); an image smaller than the crop is padded with zeros around it first."""
    H, W = x.shape[:2]
    h, w = size
    top, left = (H - h) // 2, (W - w) // 2
    if top >= 0 and left >= 0:
        return x[top : top + h, left : left + w]
    new_h, new_w = max(h, H), max(w, W)
    pad_top, pad_left = -(-(new_h - H) // 2), -(-(new_w - W) // 2)  # ceil, as transformers pads
    padded = np.zeros((new_h, new_w, x.shape[2]), dtype=x.dtype)
    padded[pad_top : pad_top + H, pad_left : pad_left + W] = x
    top, left = top + pad_top, left + pad_left
    return padded[max(0, top) : min(new_h, top + h), max(0, left) : min(new_w, left + w)]


def pil() -> Any:
    """The PIL.Image module, or an ImportError naming the extra that brings it."""
    try:
        from PIL import Image
    except ImportError:
        raise ImportError(f"image pre-processing needs Pillow: {install_hint('vision')}") from None
    return Image


@dataclass(frozen=True)
class ImageProcessor:
    """Resize to ``size`` (height, width) with ``resample``, rescale, normalise: ViTImageProcessor's
    defaults. ``__call__`` turns PIL images into ``pixel_values`` (B, Ch, H, W) float32."""

    size: tuple[int, int] = (224, 224)
    shortest_edge: int | None = None
    crop_size: tuple[int, int] | None = None
    resample: str = "bilinear"
    do_resize: bool = True
    do_rescale: bool = True
    rescale_factor: float = 1 / 255
    do_normalize: bool = True
    image_mean: tuple[float, ...] = IMAGENET_STANDARD_MEAN
    image_std: tuple[float, ...] = IMAGENET_STANDARD_STD
    convert_rgb: bool = True
    processor_type: str = "ViTImageProcessor"

    def __post_init__(self) -> None:
        if self.shortest_edge is not None and self.shortest_edge < 1:
            raise ValueError(f"shortest_edge must be >= 1, got {self.shortest_edge}")
        if self.crop_size is not None and min(self.crop_size) < 1:
            raise ValueError(f"crop_size must be positive, got {self.crop_size}")
        if self.resample not in RESAMPLE:
            raise ValueError(f"resample {self.resample!r} is not one of {', '.join(RESAMPLE)}")
        if len(self.image_mean) != len(self.image_std):
            raise ValueError(
                f"image_mean ({len(self.image_mean)} values) and image_std ({len(self.image_std)}) must have "
                "one value per channel each"
            )

    @classmethod
    def from_hf(cls, config: Mapping[str, Any], *, where: str = "preprocessor_config.json") -> ImageProcessor:
        """The processor a Hugging Face ``preprocessor_config.json`` describes (ViTImageProcessor's keys)."""
        if config.get("do_pad"):
            raise ValueError(f"{where}: do_pad is not supported by zoo's image processor yet")
        size = config.get("size", {"height": 224, "width": 224})
        if isinstance(size, int):
            size = {"height": size, "width": size}
        shortest_edge = None
        if isinstance(size, Mapping) and set(size) == {
            "shortest_edge"
        }:  # CLIP's: the short side, aspect kept
            shortest_edge = _positive(size["shortest_edge"], f"{where}: size.shortest_edge")
            size = {"height": shortest_edge, "width": shortest_edge}
        if not (isinstance(size, Mapping) and set(size) == {"height", "width"}):
            raise ValueError(
                f"{where}: size must be {{'height', 'width'}} (ViT's, SigLIP's) or {{'shortest_edge'}} (CLIP's), "
                f"got {size!r}"
            )
        crop_size = None
        if config.get("do_center_crop"):
            crop = config.get("crop_size", {"height": 224, "width": 224})
            crop = {"height": crop, "width": crop} if isinstance(crop, int) else crop
            if not (isinstance(crop, Mapping) and set(crop) == {"height", "width"}):
                raise ValueError(f"{where}: crop_size must be {{'height', 'width'}}, got {crop!r}")
            crop_size = (
                _positive(crop["height"], f"{where}: crop_size"),
                _positive(crop["width"], f"{where}: crop_size"),
            )
        names = {number: name for name, number in RESAMPLE.items()}
        resample = config.get("resample", 2)
        if resample not in names:
            raise ValueError(f"{where}: resample {resample!r} is not a PIL filter number (0-5)")
        return cls(
            size=(int(size["height"]), int(size["width"])),
            shortest_edge=shortest_edge,
            crop_size=crop_size,
            processor_type=str(config.get("image_processor_type", "ViTImageProcessor")),
            resample=names[resample],
            do_resize=bool(config.get("do_resize", True)),
            do_rescale=bool(config.get("do_rescale", True)),
            rescale_factor=float(config.get("rescale_factor", 1 / 255)),
            do_normalize=bool(config.get("do_normalize", True)),
            image_mean=tuple(float(v) for v in config.get("image_mean", IMAGENET_STANDARD_MEAN)),
            image_std=tuple(float(v) for v in config.get("image_std", IMAGENET_STANDARD_STD)),
            convert_rgb=bool(config.get("do_convert_rgb", True) is not False),
        )

    def to_hf(self) -> dict[str, Any]:
        """This processor as a ``preprocessor_config.json`` that ViTImageProcessor reads back."""
        size = (
            {"shortest_edge": self.shortest_edge}
            if self.shortest_edge is not None
            else {"height": self.size[0], "width": self.size[1]}
        )
        crop = {"do_center_crop": self.crop_size is not None}
        if self.crop_size is not None:
            crop["crop_size"] = {"height": self.crop_size[0], "width": self.crop_size[1]}  # type: ignore[assignment]
        return crop | {
            "image_processor_type": self.processor_type,
            "do_resize": self.do_resize,
            "size": size,
            "resample": RESAMPLE[self.resample],
            "do_rescale": self.do_rescale,
            "rescale_factor": self.rescale_factor,
            "do_normalize": self.do_normalize,
            "image_mean": list(self.image_mean),
            "image_std": list(self.image_std),
            "do_convert_rgb": self.convert_rgb,
        }

    def __call__(self, images: Image.Image | Sequence[Image.Image]) -> torch.Tensor:
        """One PIL image or a list of them -> pixel_values (B, Ch, H, W) float32 (B = 1 for one image)."""
        Image = pil()
        batch: list[Any] = [images] if isinstance(images, Image.Image) else list(images)  # type: ignore[arg-type]
        if not batch:
            raise ValueError("ImageProcessor: no images given")
        arrays = [self.array(image) for image in batch]
        shapes = {array.shape for array in arrays}
        if len(shapes) > 1:
            raise ValueError(
                f"ImageProcessor: the images come out in different shapes {sorted(shapes)}; set do_resize"
            )
        return torch.from_numpy(np.stack(arrays))

    def _shortest_edge(self, image: Image.Image) -> tuple[int, int]:
        """(height, width) with the short side ``shortest_edge`` and the long one scaled down with it, rounded
        down (transformers' ``get_resize_output_image_size`` with default_to_square False)."""
        assert self.shortest_edge is not None
        short, long = sorted((image.width, image.height))
        new_long = int(self.shortest_edge * long / short)
        return (
            (new_long, self.shortest_edge) if image.height >= image.width else (self.shortest_edge, new_long)
        )

    def array(self, image: Image.Image) -> np.ndarray:
        """One PIL image -> (Ch, H, W): float32 once rescaled or normalised, else uint8."""
        Image = pil()
        if not isinstance(image, Image.Image):
            raise ValueError(f"ImageProcessor: expected a PIL image, got {type(image).__name__}")
        if self.convert_rgb and image.mode != "RGB":
            image = image.convert("RGB")
        if self.do_resize:
            height, width = self.size if self.shortest_edge is None else self._shortest_edge(image)
            image = image.resize((width, height), resample=RESAMPLE[self.resample])
        x = np.array(image)
        x = x[:, :, None] if x.ndim == 2 else x  # (H, W, Ch)
        if self.crop_size is not None:
            x = center_crop(x, self.crop_size)
        if self.do_rescale:  # float64 first, as transformers' rescale, then float32
            x = (x.astype(np.float64) * self.rescale_factor).astype(np.float32)
        if self.do_normalize:
            if x.shape[-1] != len(self.image_mean):
                raise ValueError(
                    f"ImageProcessor: the image has {x.shape[-1]} channels, image_mean and image_std have "
                    f"{len(self.image_mean)}"
                )
            x = x.astype(np.float32) if not np.issubdtype(x.dtype, np.floating) else x
            mean = np.array(self.image_mean, dtype=x.dtype)
            std = np.array(self.image_std, dtype=x.dtype)
            x = (x - mean) / std
        return np.ascontiguousarray(x.transpose(2, 0, 1))  # (Ch, H, W)
