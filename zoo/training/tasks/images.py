"""Image classification: an encoder with an image front-end (``embedding.kind: patches``, ViT) and an image
classifier head, its labels named by the data.

Data, one file or folder per split:

    a NumPy ``.npz``          arrays ``images``, (N, H, W) grayscale or (N, H, W, C), uint8 pixels 0-255,
                              and ``labels``, (N,) integers or strings (the class names)
    an image folder           one subfolder per label (``train/cat/001.png``), images of any size, read
                              with Pillow (the ``vision`` extra), converted to RGB (or grayscale for a
                              1-channel model) and resized to the model's image_size with PIL's bilinear
                              filter, as `zoo.io.images.ImageProcessor` resizes
    ``sklearn_digits:train``  scikit-learn's bundled handwritten digits (1,797 real 8x8 images, no
    ``sklearn_digits:valid``  download): a fixed shuffle, the first 80% for training and the rest held out,
                              written once as an .npz in zoo's cache (``$ZOO_CACHE``); needs scikit-learn

Prepared data keeps each image as a row of C·H·W uint8 pixels (channels first) and its label, as
classification keeps token ids (`zoo.training.tasks.classification`): memory-mapped, batches read as they
are taken. A batch is ``pixel_values`` (B, C, H, W), rescaled by 1/255 and normalised per channel with the
task's ``image_mean`` / ``image_std`` in float32 (as `zoo.io.images.ImageProcessor` does), and the labels
(B,) in the model's class ids. An .npz's images must already be the model's ``embedding.image_size`` (an
image folder's are resized as they are prepared, the size recorded with them). Every batch costs the same: its images'
tokens (patches, and the class token), which ``batch.max_tokens`` counts. Validation reports
``val_accuracy``. No tokenizer is loaded, trained or saved (`Task.reads_text`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from zoo.io.atomic import write_atomic
from zoo.io.images import RESAMPLE, pil
from zoo.spec import EncoderSpec, ModelSpec, PatchEmbeddingSpec
from zoo.training.batching import Batch
from zoo.training.config import ConfigError, DataConfig
from zoo.training.data import DataError
from zoo.training.data.prepare import cache_root
from zoo.training.data.shards import PreparedData, SideInfo
from zoo.training.data.sources import OnBadLine, ReadStats, Record, Source, iter_records
from zoo.training.task_settings import ImageClassificationSettings
from zoo.training.tasks.base import (
    Collate,
    Encode,
    LengthCuts,
    Limits,
    Split,
    Task,
    Tokenizers,
    Units,
)
from zoo.training.tasks.classification import Classification, ClassificationMetric
from zoo.training.tasks.labels import class_ids, data_labels, label_names, new_head, quoted, sorted_names

DIGITS = "sklearn_digits:"  # sklearn_digits:train, sklearn_digits:valid
DIGITS_SPLITS = ("train", "valid")
DIGITS_HELD_OUT = 0.2  # of the 1,797 images, after a fixed shuffle (seed 0): 359 held out
DIGITS_SEED = 0


class ImageClassification(Task):
    name = "image_classification"
    settings_type = ImageClassificationSettings
    family = "encoder"
    sides: ClassVar[tuple[str, ...]] = ("image", "label")
    fields: ClassVar[tuple[str, ...]] = ("label",)
    reads_text = False

    # -- the model -------------------------------------------------------------------------------------------

    @classmethod
    def natural_for(cls, spec: ModelSpec) -> bool:
        classifier = spec.heads.classifier if isinstance(spec, EncoderSpec) else None
        return classifier is not None and classifier.task == "image"

    def check_model(self, spec: ModelSpec, *, where: str) -> None:
        """The model needs an image front-end; the task's mean and std one value or one per channel."""
        front = spec.embedding
        if not isinstance(front, PatchEmbeddingSpec):
            raise ConfigError(
                f"{where}: image_classification needs an image front-end (embedding.kind: patches); the model "
                "reads tokens"
            )
        settings = self._settings
        for name in ("image_mean", "image_std"):
            values = getattr(settings, name)
            if len(values) not in (1, front.channels):
                raise ConfigError(
                    f"task.{name} has {len(values)} values; the model's images have {front.channels} channels "
                    "(give one value, or one per channel)"
                )
        self._tokens_per_image, self._front = front.num_tokens, front

    @property
    def _settings(self) -> ImageClassificationSettings:
        assert isinstance(self.settings, ImageClassificationSettings)
        return self.settings

    spec_overrides = Classification.spec_overrides  # heads.classifier overrides wait for the head

    def fit_spec(
        self, spec: ModelSpec, *, train: PreparedData, overrides: dict[str, Any], where: str
    ) -> ModelSpec:
        """``spec`` with an image classifier whose label names cover the training data (a new head when it
        has none; unnamed labels named by the data's, which must be as many)."""
        assert isinstance(spec, EncoderSpec)
        found = data_labels(train)
        classifier = spec.heads.classifier
        try:
            if classifier is None or classifier.task != "image":
                spec = spec.override(**new_head(spec, "image", found))
            spec = spec.override(**overrides) if overrides else spec
        except ValueError as error:
            raise ConfigError(f"{where}: cannot give the model an image classifier: {error}") from None
        assert isinstance(spec, EncoderSpec)
        classifier = spec.heads.classifier
        if classifier is None or classifier.task != "image":
            raise ConfigError(f"{where}: model.overrides remove the image classifier the task needs")
        if classifier.labels is None:
            if len(found) != classifier.num_labels:
                raise ConfigError(
                    f"{where}: the model's classifier has {classifier.num_labels} unnamed labels but the "
                    f"training data has {len(found)} ({quoted(found)}); name them in heads.classifier.labels"
                )
            spec = spec.override(**{"heads.classifier.labels": list(found)})
        return spec

    def missing_tokens(self, spec: ModelSpec, tokenizers: Tokenizers) -> list[str]:
        return []  # nothing is padded

    # -- data --------------------------------------------------------------------------------------------

    def check_data(self, data: DataConfig) -> None:
        self.refuse_parallel_files(data, "data: image_classification reads one file per split")
        if data.max_length is not None or data.too_long != "truncate":
            raise ConfigError(
                "data.max_length and data.too_long cut token sequences; image_classification never cuts an "
                "image (its tokens are the model's patches): leave them out"
            )

    def source(self, files: Path | Any, *, on_bad_line: OnBadLine = "error") -> Source:
        text = str(files)
        if text.startswith(DIGITS):
            return Source("npz", (digits_file(text.removeprefix(DIGITS)),), fields=self.fields)
        if Path(text).is_dir():
            return Source("image_folder", (files,), fields=self.fields, on_bad_line=on_bad_line)
        if Path(text).suffix != ".npz":
            raise DataError(
                f"{files}: image_classification reads a NumPy .npz (arrays images and labels), a folder of "
                f"images (one subfolder per label) or {DIGITS}train / {DIGITS}valid"
            )
        return Source("npz", (files,), fields=self.fields, on_bad_line=on_bad_line)

    def records(self, source: Source, *, stats: ReadStats | None = None) -> Iterator[Record]:
        return iter_records(source, stats=stats)

    def manifest_info(self, records: Callable[[], Iterator[Record]]) -> dict[str, Any]:
        """The data's label names, sorted, and its images' (C, H, W)."""
        found: set[str] = set()
        shapes: set[tuple[int, ...]] = set()
        paths: set[Path] = set()
        for record in records():
            found.add(str(record.fields["label"]))
            if record.path.suffix != ".npz":  # an image folder's: resized to the model's size
                shapes.add(self._folder_shape)
            elif record.path not in paths:
                paths.add(record.path)
                shapes.add(_images(record.path).shape[1:])
        if len(shapes) > 1:
            raise DataError(
                f"{', '.join(map(str, sorted(paths)))}: the files' images differ in shape {sorted(shapes)}"
            )
        return {"labels": list(sorted_names(found)), "image_shape": list(shapes.pop()) if shapes else []}

    def side_infos(self, tokenizers: Tokenizers, *, info: Mapping[str, Any]) -> dict[str, SideInfo]:
        return {
            "image": SideInfo(kind="sequence", dtype="uint8"),
            "label": SideInfo(kind="scalar", vocab_size=len(info["labels"])),
        }

    def tokenizer_of(self, side: str, tokenizers: Tokenizers) -> None:
        return None  # pixels and labels: no tokenizer made them

    def encoder(
        self, tokenizers: Tokenizers, *, cuts: LengthCuts | None, labels: Sequence[str] = ()
    ) -> Encode:
        """Records -> pixel rows (C·H·W, channels first) and label ids; images are never cut."""
        index = {name: i for i, name in enumerate(labels)}
        opened: dict[Path, np.ndarray] = {}

        def encode(records: list[Record]) -> dict[str, Any]:
            pixels = []
            for record in records:
                if record.path.suffix != ".npz":
                    pixels.append(self._read_image(record.path).reshape(-1))
                    continue
                if record.path not in opened:
                    opened[record.path] = _images(record.path)
                image = opened[record.path][record.line - 1]  # (C, H, W)
                pixels.append(image.reshape(-1))
            return {"image": pixels, "label": [index[str(r.fields["label"])] for r in records]}

        return encode

    @property
    def _folder_shape(self) -> tuple[int, int, int]:
        """(C, H, W) of an image folder's images once prepared: the model's (`check_model` saw it)."""
        assert self._front is not None, "check_model runs before the data is prepared"
        return (self._front.channels, self._front.image_size, self._front.image_size)

    def _read_image(self, path: Path) -> np.ndarray:
        """One image file -> (C, H, W) uint8 at the model's size: RGB (or grayscale for one channel), resized
        with PIL's bilinear filter when it is another size (`zoo.io.images.ImageProcessor`'s resize)."""
        channels, height, width = self._folder_shape
        Image = pil()
        try:
            with Image.open(path) as opened:
                image = opened.convert("L" if channels == 1 else "RGB")
        except (OSError, ValueError) as error:
            raise DataError(f"{path}: not a readable image ({error})") from None
        if channels not in (1, 3):
            raise DataError(f"{path}: an image folder gives 1 or 3 channels; the model takes {channels}")
        if image.size != (width, height):
            image = image.resize((width, height), resample=RESAMPLE["bilinear"])
        array = np.array(image)
        return array[None] if array.ndim == 2 else array.transpose(2, 0, 1)

    def check_prepared(self, data: PreparedData, *, where: str) -> None:
        data_labels(data)
        if not data.manifest.info.get("image_shape"):
            raise DataError(f"{where}: {data.path} holds no images (not prepared for image_classification)")

    def units(self, split: Split, *, tokenizers: Tokenizers, limits: Limits) -> Units:
        """One unit per image, each costing the model's tokens per image (patches and class token)."""
        shape = split.data.manifest.info.get("image_shape") or []
        tokens = self._tokens_per_image
        if tokens is None or len(shape) != 3:
            raise DataError(f"{split.where}: no image shape in the prepared data")
        return Units(np.full(split.data.num_examples, tokens, dtype=np.int32), name=split.data.origin)

    _tokens_per_image: int | None = None
    _front: PatchEmbeddingSpec | None = None

    def framed_sides(self, tokenizers: Tokenizers) -> dict[str, int]:
        return {"image": 0}

    def collator(
        self,
        split: Split,
        units: Units,
        *,
        spec: ModelSpec,
        tokenizers: Tokenizers,
        limits: Limits,
    ) -> Collate:
        front = spec.embedding
        assert isinstance(front, PatchEmbeddingSpec)  # check_model
        shape = tuple(split.data.manifest.info.get("image_shape") or ())
        wanted = (front.channels, front.image_size, front.image_size)
        if shape != wanted:
            raise DataError(
                f"{split.where}: images are {_describe(shape)}, the model takes {_describe(wanted)} "
                "(embedding.channels, embedding.image_size); resize them first (zoo.io.images)"
            )
        settings = self._settings
        return ImageCollator(
            split,
            units,
            shape=wanted,
            mean=settings.image_mean,
            std=settings.image_std,
            to_class=class_ids(split, label_names(spec)),
            tokens=front.num_tokens,
        )

    # -- metrics -----------------------------------------------------------------------------------------

    def metric(self, spec: ModelSpec) -> ClassificationMetric:
        return ClassificationMetric(label_names(spec), per_token=False)


class ImageCollator:
    """Units -> a `Batch`: pixel_values (B, C, H, W) float32, rescaled and normalised, and targets (B,)."""

    def __init__(
        self,
        split: Split,
        units: Units,
        *,
        shape: tuple[int, int, int],
        mean: Sequence[float],
        std: Sequence[float],
        to_class: np.ndarray,
        tokens: int,
    ) -> None:
        self.data, self.units, self.shape, self.to_class, self.tokens = (
            split.data,
            units,
            shape,
            to_class,
            tokens,
        )
        self.mean = np.array(mean, dtype=np.float32).reshape(-1, 1, 1)  # (C or 1, 1, 1)
        self.std = np.array(std, dtype=np.float32).reshape(-1, 1, 1)

    def __call__(self, units: np.ndarray, *, generator: torch.Generator | None = None) -> Batch:
        examples = self.units.example_indices(units)
        pixels = np.stack(self.data.read_rows(examples, "image")).reshape(len(examples), *self.shape)
        x = (pixels.astype(np.float64) * (1 / 255)).astype(np.float32)  # as ImageProcessor: float64, then 32
        x = (x - self.mean) / self.std  # (B, C, H, W)
        targets = torch.from_numpy(self.to_class[self.data.values("label")[examples]])  # (B,)
        return Batch({"pixel_values": torch.from_numpy(x)}, targets, len(examples) * self.tokens)


def _images(path: Path) -> np.ndarray:
    """The ``images`` of an .npz as (N, C, H, W) uint8; a `DataError` naming the file otherwise."""
    with np.load(path, allow_pickle=False) as archive:
        images = archive["images"]
    if images.dtype != np.uint8 or images.ndim not in (3, 4):
        raise DataError(
            f"{path}: images must be uint8 pixels (0-255) of shape (N, H, W) or (N, H, W, C), got "
            f"{images.dtype} {images.shape}"
        )
    return images[:, None] if images.ndim == 3 else images.transpose(0, 3, 1, 2)


def _describe(shape: Sequence[int]) -> str:
    return f"{shape[1]}x{shape[2]} with {shape[0]} channel(s)" if len(shape) == 3 else "of no known shape"


def digits_file(split: str) -> Path:
    """scikit-learn's handwritten digits as an image .npz for ``split`` (train or valid), written once in
    zoo's cache: 8x8 grayscale, the 0-16 ink levels scaled to 0-255, a fixed shuffle, 20% held out."""
    if split not in DIGITS_SPLITS:
        raise DataError(f"{DIGITS}{split}: the digits come as {DIGITS}train and {DIGITS}valid")
    path = cache_root().parent / "sklearn_digits" / f"{split}.npz"
    if path.is_file():
        return path
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise ConfigError(f"{DIGITS}{split} needs scikit-learn (pip install scikit-learn)") from None
    digits = load_digits()
    images = np.rint(digits.images * (255 / 16)).astype(np.uint8)  # (1797, 8, 8)
    order = np.random.default_rng(DIGITS_SEED).permutation(len(images))
    cut = round(len(images) * (1 - DIGITS_HELD_OUT))
    chosen = order[:cut] if split == "train" else order[cut:]
    path.parent.mkdir(parents=True, exist_ok=True)

    def write(temp: Path) -> None:
        with open(temp, "wb") as handle:  # a handle: np.savez would add .npz to a temp file's name
            np.savez(handle, images=images[chosen], labels=digits.target[chosen].astype(np.int64))

    write_atomic(path, write)
    return path
