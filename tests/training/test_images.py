"""image_classification: .npz and scikit-learn digits data, pixels normalised as zoo.io.images does, refusals
by name, the trained model exported to transformers, and (slow) the digits example's held-out accuracy."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import zoo
from zoo.training import TrainConfig, train
from zoo.training.config import ConfigError
from zoo.training.data import DataError

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
VIT = {
    "family": "encoder", "d_model": 32, "num_layers": 1, "attention": {"num_heads": 2}, "ffn": {"d_ff": 64},
    "norm": {"placement": "pre"}, "position": {"kind": "none"},
    "embedding": {"kind": "patches", "image_size": 4, "patch_size": 2, "channels": 3},
}  # fmt: skip


def write_npz(
    path: Path, *, n: int = 24, seed: int = 0, shape: tuple[int, ...] = (4, 4, 3), **arrays: Any
) -> Path:
    rng = np.random.default_rng(seed)
    data = {
        "images": rng.integers(0, 256, (n, *shape)).astype(np.uint8),
        "labels": np.array(["cat", "dog", "owl"])[rng.integers(0, 3, n)],
    }
    np.savez(path, **{**data, **arrays})
    return path


def config(tmp_path: Path, **overrides: Any) -> TrainConfig:
    train_file = tmp_path / "train.npz"
    if not train_file.exists():
        write_npz(train_file)
        write_npz(tmp_path / "valid.npz", seed=1)
    data = {
        "model": {"spec": VIT},
        "task": "image_classification",
        "data": {"train": str(train_file), "valid": str(tmp_path / "valid.npz")},
        "schedule": {"kind": "constant", "lr": 1e-3},
        "batch": {"max_tokens": 40},
        "max_steps": 3,
        "output_dir": str(tmp_path / "run"),
    }
    return TrainConfig.from_dict(data).override(**overrides) if overrides else TrainConfig.from_dict(data)


def test_batches_hold_pixel_values_normalised_as_the_image_processor_does(tmp_path: Path) -> None:
    PIL = pytest.importorskip("PIL.Image")
    from zoo.io.images import ImageProcessor
    from zoo.training.distributed import Runtime
    from zoo.training.setup import setup

    cfg = config(tmp_path, **{"task": {"kind": "image_classification", "image_mean": [0.4, 0.5, 0.6]}})
    prepared = setup(cfg, resume_from=None, runtime=Runtime(0, 1, 0, torch.device("cpu")))
    split, task = prepared.train, prepared.task
    units = task.units(split, tokenizers=prepared.tokenizers, limits=prepared.limits)
    batch = task.collator(
        split, units, spec=prepared.spec, tokenizers=prepared.tokenizers, limits=prepared.limits
    )(np.arange(5))
    with np.load(tmp_path / "train.npz") as archive:
        images, labels = archive["images"][:5], archive["labels"][:5]
    processor = ImageProcessor(do_resize=False, image_mean=(0.4, 0.5, 0.6))
    want = processor([PIL.fromarray(image) for image in images])
    assert torch.equal(batch.inputs["pixel_values"], want)
    names = prepared.spec.heads.classifier.labels
    assert names == ("cat", "dog", "owl") and [names[i] for i in batch.targets] == list(labels)
    assert batch.num_tokens == 5 * 5  # 4 patches and the class token per image


def test_a_run_saves_a_model_without_a_tokenizer_that_loads_and_exports(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    result = train(config(tmp_path), progress=False)
    assert result.tokenizer is None and result.final["val_accuracy"] is not None
    assert not (result.output_dir / "tokenizer.json").exists()
    model = zoo.load(result.output_dir).eval()
    assert model.spec.heads.classifier.task == "image" and not model.spec.heads.pooler
    zoo.to_hf(model, tmp_path / "hf")
    hf = transformers.ViTForImageClassification.from_pretrained(tmp_path / "hf").eval()
    pixels = torch.randn(2, 3, 4, 4)
    with torch.no_grad():
        assert (hf(pixel_values=pixels).logits - model(pixel_values=pixels).logits).abs().max() < 1e-5
    assert hf.config.id2label == {0: "cat", 1: "dog", 2: "owl"}


@pytest.mark.parametrize(
    ("change", "error", "message"),
    [
        (
            {"tokenizer": {"kind": "bpe", "vocab_size": 100}},
            ConfigError,
            "image_classification reads no text",
        ),
        (
            {"model": {"spec": None, "preset": "bert-tiny"}},
            ConfigError,
            r"needs an image front-end \(embedding.kind: patches\)",
        ),
        (
            {"task": {"kind": "image_classification", "image_std": [0.5, 0.5]}},
            ConfigError,
            "image_std has 2 values",
        ),
        ({"data.max_length": 8}, ConfigError, "image_classification never cuts an image"),
    ],
)
def test_what_the_task_cannot_use_is_refused_by_name(
    tmp_path: Path, change: dict, error: type, message: str
) -> None:
    with pytest.raises(error, match=message):
        train(config(tmp_path, **change), progress=False)


@pytest.mark.parametrize(
    ("arrays", "message"),
    [
        ({"shape": (8, 8, 3)}, r"images are 8x8 with 3 channel\(s\), the model takes 4x4"),
        ({"images": np.zeros((24, 4, 4, 3), dtype=np.float32)}, "images must be uint8 pixels"),
    ],
)
def test_bad_image_files_are_refused_naming_them(tmp_path: Path, arrays: dict, message: str) -> None:
    write_npz(tmp_path / "train.npz", **arrays)
    write_npz(tmp_path / "valid.npz", seed=1)
    with pytest.raises(DataError, match=message):
        train(config(tmp_path), progress=False)


def test_other_files_are_refused(tmp_path: Path) -> None:
    (tmp_path / "train.tsv").write_text("x\t1\n")
    with pytest.raises(DataError, match=r"reads a NumPy \.npz .* or sklearn_digits:train"):
        train(config(tmp_path).override(data={"train": str(tmp_path / "train.tsv")}), progress=False)


@pytest.mark.slow
def test_digits_example_reaches_high_held_out_accuracy(tmp_path: Path) -> None:
    """A shortened `zoo train examples/digits.yaml` (600 steps there, 300 here): the full run reaches 97%."""
    pytest.importorskip("sklearn")
    cfg = TrainConfig.from_yaml(
        EXAMPLES / "digits.yaml",
        max_steps=300,
        output_dir=str(tmp_path / "run"),
        **{"eval.every_steps": None},
    )
    result = train(cfg, progress=False)
    assert result.final["val_accuracy"] >= 0.9, result.final  # chance: 0.1 (359 held-out images)
    assert result.model.spec.heads.classifier.labels == tuple(str(i) for i in range(10))


def write_folder(root: Path, *, seed: int = 0, size: tuple[int, int] = (7, 5)) -> Path:
    PIL = pytest.importorskip("PIL.Image")
    rng = np.random.default_rng(seed)
    for label in ("cat", "dog"):
        (root / label).mkdir(parents=True)
        for i in range(6):
            pixels = rng.integers(0, 256, (*size, 3)).astype(np.uint8)
            PIL.fromarray(pixels).save(root / label / f"{i}.png")
    return root


def test_an_image_folder_is_resized_as_the_image_processor_resizes(tmp_path: Path) -> None:
    PIL = pytest.importorskip("PIL.Image")
    from zoo.io.images import ImageProcessor
    from zoo.training.distributed import Runtime
    from zoo.training.setup import setup

    write_folder(tmp_path / "train")
    write_folder(tmp_path / "valid", seed=1)
    data = {"train": str(tmp_path / "train"), "valid": str(tmp_path / "valid")}
    prepared = setup(
        config(tmp_path, data=data), resume_from=None, runtime=Runtime(0, 1, 0, torch.device("cpu"))
    )
    split, task = prepared.train, prepared.task
    units = task.units(split, tokenizers=prepared.tokenizers, limits=prepared.limits)
    collate = task.collator(
        split, units, spec=prepared.spec, tokenizers=prepared.tokenizers, limits=prepared.limits
    )
    batch = collate(np.arange(12))
    files = sorted((tmp_path / "train").glob("*/*.png"))
    want = ImageProcessor(size=(4, 4))([PIL.open(file) for file in files])
    assert torch.equal(batch.inputs["pixel_values"], want)
    assert (
        prepared.spec.heads.classifier.labels == ("cat", "dog")
        and batch.targets.tolist() == [0] * 6 + [1] * 6
    )
    result = train(config(tmp_path, data=data, output_dir=str(tmp_path / "run2")), progress=False)
    assert result.final["val_accuracy"] is not None


def test_a_stray_file_in_an_image_folder_is_named(tmp_path: Path) -> None:
    write_folder(tmp_path / "train")
    (tmp_path / "train" / "cat" / "notes.txt").write_text("hi")
    with pytest.raises(DataError, match=r"cat/notes\.txt:1: not an image file"):
        train(config(tmp_path, data={"train": str(tmp_path / "train"), "valid": None}), progress=False)


def test_zoo_data_prepare_refuses_image_data(tmp_path: Path) -> None:
    from zoo.training.corpus import prepare_corpus

    with pytest.raises(ValueError, match="image_classification reads no text"):
        prepare_corpus(
            "image_classification", [write_npz(tmp_path / "a.npz")], tokenizer="x", out=tmp_path / "p"
        )
