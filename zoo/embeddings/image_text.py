"""Embeddings from a dual encoder (CLIP, SigLIP): texts and images into one space, as unit vectors.

    embedder = ImageTextEmbedder.load("clip-folder/")
    vectors = embedder(["a photo of a cat", Image.open("cat.png"), "data:image/png;base64,iVBOR..."])

Each input is a text (a string), an image (a PIL image, or a ``data:image/...;base64,`` URL string): texts
go through the text tower, images through the folder's image processor (``preprocessor_config.json``,
`zoo.io.images`) and the image tower; every vector is ``text_embeds`` / ``image_embeds`` as transformers'
CLIPModel and SiglipModel return them (projected, unit length), in the inputs' order. A text is tokenized
with the folder's tokenizer and cut to the model's positions; a model that reads the text at its last
position (SigLIP, ``heads.text_pooling: last_token``) gets every text padded to that length, as SigLIP's
processor pads (``padding="max_length"``), the others are padded on the right to the batch's longest.
"""

from __future__ import annotations

import base64
import binascii
import io
import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F

from zoo.embeddings.folder import FolderSettings
from zoo.io.images import ImageProcessor, pil
from zoo.io.jsonfile import read_json_object
from zoo.io.tokenizer import Tokenizer
from zoo.io.tokenizer.lengths import char_budget, cut_before_encoding
from zoo.spec import DualEncoderSpec, PatchEmbeddingSpec

if TYPE_CHECKING:
    from zoo.models.base import ZooModel

PREPROCESSOR_NAME = "preprocessor_config.json"
DATA_URL = re.compile(r"data:image/[\w.+-]+;base64,", re.IGNORECASE)
MAX_IMAGE_PIXELS = 64_000_000  # a decoded image larger than this is refused (PIL's bomb guard is 89M)


def is_image_url(text: str) -> bool:
    """Whether ``text`` is an image given inline: a ``data:image/<type>;base64,`` URL."""
    return DATA_URL.match(text) is not None


def decode_image(url: str, *, where: str = "input") -> Any:
    """A ``data:image/<type>;base64,<data>`` URL -> a PIL image (loaded); ValueError naming ``where`` else."""
    Image = pil()
    match = DATA_URL.match(url)
    if match is None:
        raise ValueError(f"{where}: an image must be a data:image/<type>;base64,<data> URL")
    try:
        raw = base64.b64decode(url[match.end() :], validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"{where}: the data: URL's base64 does not decode") from None
    try:
        image = Image.open(io.BytesIO(raw))
        if image.width * image.height > MAX_IMAGE_PIXELS:
            raise ValueError(
                f"{where}: the image is {image.width}x{image.height}, over {MAX_IMAGE_PIXELS} pixels"
            )
        image.load()
    except ValueError:
        raise
    except Exception as error:  # PIL raises UnidentifiedImageError, OSError, DecompressionBombError...
        raise ValueError(f"{where}: not a readable image ({type(error).__name__})") from None
    return image


class ImageTextEmbedder:
    """A dual encoder, its tokenizer and its image processor: ``embedder(inputs)`` -> (N, E) unit vectors,
    for texts and images alike (`zoo.embeddings.image_text`). What `zoo.embed` and `zoo serve` ask of an
    `Embedder` it has too (``dim``, ``normalize``, ``tokenize``, ``counts``, ``model``, ``tokenizer``)."""

    reads_images = True

    def __init__(self, model: ZooModel, tokenizer: Tokenizer, processor: ImageProcessor | None) -> None:
        if not isinstance(model.spec, DualEncoderSpec):
            raise ValueError(
                f"ImageTextEmbedder needs a dual encoder (CLIP, SigLIP), got a {model.spec.family} model"
            )
        self.spec = model.spec
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.processor = processor
        self.normalize = True
        self.max_length = model.spec.max_positions
        self.fixed_length = self.spec.heads.text_pooling.kind == "last_token"

    @property
    def device(self) -> torch.device:
        """Where the model's weights are (the batches go there)."""
        return next(self.model.parameters()).device

    def tokenize(self, texts: Sequence[str]) -> list[list[int]]:
        """Each text's ids, framed by the tokenizer's special tokens, cut to the model's positions."""
        texts, _ = cut_before_encoding(list(texts), char_budget(self.tokenizer, self.max_length))
        ids: list[list[int]] = self.tokenizer(texts, truncation=True, max_length=self.max_length)["input_ids"]
        return ids

    @property
    def dim(self) -> int:
        """The shared space's width (``image_embeds`` and ``text_embeds``)."""
        return self.spec.embed_dim

    def counts(self, inputs: Sequence[Any]) -> list[int]:
        """Tokens each input costs: a text its ids, an image its image tower's positions."""
        patches = self.spec.vision.embedding
        tokens = patches.num_tokens if isinstance(patches, PatchEmbeddingSpec) else 0
        texts = [x for x in inputs if isinstance(x, str) and not is_image_url(x)]
        lengths = iter(len(ids) for ids in self.tokenize(texts)) if texts else iter(())
        return [next(lengths) if isinstance(x, str) and not is_image_url(x) else tokens for x in inputs]

    @torch.inference_mode()
    def __call__(
        self,
        inputs: Sequence[Any],
        *,
        batch_size: int = 32,
        on_batch: Callable[[int], None] | None = None,
    ) -> np.ndarray:
        """(N, E) float32 unit vectors of ``inputs`` (texts, PIL images, data:image URLs), in their order."""
        if isinstance(inputs, str) or not isinstance(inputs, (list, tuple)):
            raise ValueError(f"inputs must be a list of texts and images, got {type(inputs).__name__}")
        Image = pil() if any(not isinstance(x, str) or is_image_url(x) for x in inputs) else None
        texts: list[tuple[int, str]] = []
        images: list[tuple[int, Any]] = []
        for i, item in enumerate(inputs):
            if isinstance(item, str) and not is_image_url(item):
                texts.append((i, item))
            elif isinstance(item, str):
                images.append((i, decode_image(item, where=f"inputs[{i}]")))
            elif Image is not None and isinstance(item, Image.Image):
                images.append((i, item))
            else:
                raise ValueError(
                    f"inputs[{i}] is {type(item).__name__}: a text, a PIL image or a data:image URL is expected"
                )
        if images and self.processor is None:
            raise ValueError(
                f"inputs[{images[0][0]}] is an image, but the model's folder has no {PREPROCESSOR_NAME}: pass "
                "processor= (a zoo.io.images.ImageProcessor)"
            )
        out = np.empty((len(inputs), self.dim), dtype=np.float32)
        for start in range(0, len(texts), batch_size):
            part = texts[start : start + batch_size]
            out[[i for i, _ in part]] = self._texts([t for _, t in part]).float().cpu().numpy()
            if on_batch is not None:
                on_batch(len(part))
        for start in range(0, len(images), batch_size):
            part = images[start : start + batch_size]
            out[[i for i, _ in part]] = self._images([x for _, x in part]).float().cpu().numpy()
            if on_batch is not None:
                on_batch(len(part))
        return out

    def _texts(self, texts: list[str]) -> torch.Tensor:
        """Texts -> (B, E) unit vectors."""
        rows = self.tokenize(texts)
        pad_id = self.spec.pad_token_id or 0
        T = self.max_length if self.fixed_length and self.max_length else max(len(row) for row in rows)
        ids = torch.full((len(rows), T), pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for r, row in enumerate(rows):
            ids[r, : len(row)] = torch.tensor(row, dtype=torch.long)
            mask[r, : len(row)] = 1
        model: Any = self.model
        # SigLIP attends to its padding, as it was trained; right padding never reaches CLIP's end token
        attention_mask = None if self.fixed_length else mask.to(self.device)
        return F.normalize(model.get_text_features(ids.to(self.device), attention_mask), dim=-1)

    def _images(self, images: list[Any]) -> torch.Tensor:
        """PIL images -> (B, E) unit vectors."""
        assert self.processor is not None
        model: Any = self.model
        pixels = self.processor(images).to(self.device, dtype=next(model.parameters()).dtype)
        return F.normalize(model.get_image_features(pixels), dim=-1)


def dual_embedder(
    model: ZooModel, tokenizer: Tokenizer, settings: FolderSettings, processor: ImageProcessor | None = None
) -> ImageTextEmbedder:
    """The embedder of a dual encoder loaded from ``settings.model_dir`` (`Embedder.load` calls this): the
    folder's ``preprocessor_config.json`` unless ``processor`` is given (without either, images are refused)."""
    folder = settings.model_dir
    if processor is None and folder is not None and (folder / PREPROCESSOR_NAME).is_file():
        path = folder / PREPROCESSOR_NAME
        processor = ImageProcessor.from_hf(read_json_object(path, error=ValueError), where=str(path))
    return ImageTextEmbedder(model, tokenizer, processor)
