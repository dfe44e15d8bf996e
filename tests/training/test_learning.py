"""End to end: the training loop teaches a tiny Transformer to reverse sequences it has never seen."""

from __future__ import annotations

import random
from pathlib import Path

from zoo.demo import write_tsv
from zoo.training import train, translate
from zoo.training.config import TrainConfig

SYMBOLS = "abcdefghijkl"


def reverse_pairs(n: int, seed: int) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    pairs = []
    for _ in range(n):
        seq = [rng.choice(SYMBOLS) for _ in range(rng.randint(3, 7))]
        pairs.append((" ".join(seq), " ".join(reversed(seq))))
    return pairs


def test_tiny_transformer_learns_to_reverse_held_out_sequences(tmp_path: Path) -> None:
    train_pairs, valid_pairs = reverse_pairs(3000, seed=1), reverse_pairs(100, seed=2)
    seen = {src for src, _ in train_pairs}
    valid_pairs = [pair for pair in valid_pairs if pair[0] not in seen]
    write_tsv(train_pairs, tmp_path / "train.tsv")
    write_tsv(valid_pairs, tmp_path / "valid.tsv")
    config = TrainConfig.from_dict(
        {
            "model": {
                "preset": "transformer-tiny",
                "overrides": {
                    "d_model": 64,
                    "num_layers": 2,
                    "ffn.d_ff": 128,
                    "dropout": 0.0,
                    "max_positions": 32,
                },
            },
            "data": {"train": str(tmp_path / "train.tsv")},
            "tokenizer": {"kind": "wordpiece", "vocab_size": 100},
            "schedule": {"kind": "cosine", "lr": 3e-3, "warmup_steps": 30},
            "batch": {"max_tokens": 512},
            "loss": {"label_smoothing": 0.0},
            "max_steps": 300,
            "log_every": 50,
            "output_dir": str(tmp_path / "run"),
        }
    )
    result = train(config)
    sources = [src for src, _ in valid_pairs]
    outputs = translate(
        result.model, sources, source_tokenizer=result.tokenizer, target_tokenizer=result.tokenizer
    )
    exact = sum(out == ref for out, (_, ref) in zip(outputs, valid_pairs)) / len(valid_pairs)
    assert exact >= 0.95, list(zip(sources, outputs))[:5]
