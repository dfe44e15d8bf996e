"""Test helpers: the tiny presets and small padded batches. Import as ``from support import ...``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

TINY_PRESETS = ["bert-tiny", "gpt2-tiny", "llama-tiny", "t5-tiny", "bart-tiny", "transformer-tiny"]
TINY_PRESETS += ["pythia-tiny", "phi3-tiny"]  # partial rotary, the parallel residual, LongRoPE


def tiny_seq2seq_run(tmp_path: Path, *, train_size: int = 200, valid_size: int = 10, **settings: Any) -> dict:
    """A `TrainConfig` dict of a one-layer transformer-tiny on a toy corpus written to ``tmp_path``
    (``train.tsv``; ``valid.tsv`` too when ``settings`` names it), run folder ``tmp_path / "run"``;
    ``settings`` add or replace top-level keys."""
    from zoo.demo import toy_corpus, write_tsv

    corpus = toy_corpus(seed=0, train_size=train_size, valid_size=valid_size)
    write_tsv(corpus.train, tmp_path / "train.tsv")
    write_tsv(corpus.valid, tmp_path / "valid.tsv")
    return {
        "model": {
            "preset": "transformer-tiny",
            "overrides": {"d_model": 32, "num_layers": 1, "attention.num_heads": 2, "ffn.d_ff": 64},
        },
        "data": {"train": str(tmp_path / "train.tsv")},
        "tokenizer": {"vocab_size": 300},
        "batch": {"max_tokens": 500},
        "output_dir": str(tmp_path / "run"),
        **settings,
    }


def padded_batch(vocab_size: int, lengths: list[int], *, low: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded (B, max(lengths)) ids (pad id 0 where masked) and the matching 1/0 mask."""
    T = max(lengths)
    mask = torch.tensor([[1] * n + [0] * (T - n) for n in lengths])
    ids = torch.randint(low, vocab_size, (len(lengths), T)) * mask
    return ids, mask
