"""A tiny llama-shaped decoder (random weights, float32, no end-of-sequence token so every run goes to its
length) with a small BPE tokenizer, saved once; and a server on a free localhost port."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import zoo
from tests.generation.conftest import liven
from zoo.io.tokenizer import train_tokenizer
from zoo.serving import Engine
from zoo.serving.server import Server

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

LINES = [f"the cat number {i} sat on the mat {i * 7} and the dog ran off" for i in range(200)]
MODEL_NAME = "tiny-llama"


def tiny_decoder(vocab_size: int = 120, **override: object) -> zoo.ZooModel:
    """A llama-tiny-shaped model whose greedy path depends on its whole context (`liven`)."""
    torch.manual_seed(0)
    spec = zoo.preset("llama-tiny", dropout=0.0, vocab_size=vocab_size, eos_token_id=None, **override)
    return liven(zoo.build(spec)).eval()


@pytest.fixture(scope="session")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A zoo checkpoint folder: the tiny decoder and its tokenizer (no eos: runs end by length or stop)."""
    tok = train_tokenizer(iter(LINES), kind="bpe", vocab_size=300)
    ids = tok.special_ids()
    model = tiny_decoder(tok.vocab_size, pad_token_id=ids["pad"], bos_token_id=ids["bos"])
    folder = tmp_path_factory.mktemp("serve") / "tiny"
    zoo.save(model, folder, tokenizer=tok)
    return folder


@pytest.fixture(scope="session")
def pretrained(saved: Path) -> zoo.Pretrained:
    return zoo.load_pretrained(saved)


@pytest.fixture(scope="module")
def server(pretrained: zoo.Pretrained) -> Iterator[Server]:
    engine = Engine(pretrained.model, pretrained.tokenizer, max_batch=8, max_queue=64, max_length=96)
    with Server(engine, pretrained.tokenizer, model_name=MODEL_NAME) as running:
        yield running
