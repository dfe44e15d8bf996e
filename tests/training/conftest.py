"""Shared pieces of the training tests: a tiny Transformer, toy TSV files and a config factory."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from zoo.demo import toy_corpus, write_tsv
from zoo.spec.model import _set_dotted
from zoo.training.config import TrainConfig

# transformer-tiny's architecture at a size that trains in seconds: 2 + 2 layers of width 32.
TINY_MODEL: dict[str, Any] = {
    "preset": "transformer-tiny",
    "overrides": {
        "d_model": 32,
        "num_layers": 2,
        "attention.num_heads": 2,
        "ffn.d_ff": 64,
        "dropout": 0.0,
        "max_positions": 64,
    },
}


@pytest.fixture(scope="session")
def toy_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(train.tsv, valid.tsv): 400 + 20 pairs of the toy EN->KO corpus."""
    directory = tmp_path_factory.mktemp("toy")
    corpus = toy_corpus(seed=0, train_size=400, valid_size=20)
    write_tsv(corpus.train, directory / "train.tsv")
    write_tsv(corpus.valid, directory / "valid.tsv")
    return directory / "train.tsv", directory / "valid.tsv"


def tiny_config(output_dir: Path, toy_files: tuple[Path, Path], /, **overrides: Any) -> TrainConfig:
    """A config for the tiny model on the toy files, writing to ``output_dir``; keyword arguments are
    dotted overrides, except ``model``, which replaces the model source whole (a dotted merge would keep
    the preset beside, say, ``init_from``)."""
    train, valid = toy_files
    data: dict[str, Any] = {
        "model": copy.deepcopy(TINY_MODEL),  # overrides below edit nested dicts in place
        "data": {"train": str(train), "valid": str(valid)},
        "tokenizer": {"kind": "bpe", "vocab_size": 400},
        "schedule": {"kind": "noam", "warmup_steps": 20},
        "batch": {"max_tokens": 600},
        "task": {"kind": "seq2seq", "bleu": False},
        "max_steps": 4,
        "log_every": 1,
        "output_dir": str(output_dir),
    }
    if "model" in overrides:
        data["model"] = overrides.pop("model")
    for key, value in overrides.items():
        _set_dotted(data, key, value)
    return TrainConfig.from_dict(data)


@pytest.fixture
def make_config(tmp_path: Path, toy_files: tuple[Path, Path]) -> Callable[..., TrainConfig]:
    """`tiny_config` writing to this test's ``tmp_path / "run"``."""

    def make(**overrides: Any) -> TrainConfig:
        return tiny_config(tmp_path / "run", toy_files, **overrides)

    return make


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    """Tiny models train faster on one thread, and a busy machine's spinning thread pools cannot stall them."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
