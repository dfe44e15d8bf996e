"""The embedded defaults of ``zoo demo``: train the canonical Transformer as an English -> Korean translator.

The data is the generated toy corpus (`zoo.demo.corpus`: 6,000 training pairs, 300 held out),
written as TSV so the demo goes through the same file path as ``zoo train``. The model is the preset
``transformer-tiny`` (the paper's architecture: post-norm, sinusoidal positions, shared embeddings scaled
by sqrt(d_model), ReLU FFN; 4 + 4 layers, d_model 128, 4 heads, d_ff 512) with one documented change:
dropout 0.1 instead of the preset's 0.3, because the toy corpus is small and clean and a few minutes of
CPU training should be spent learning, not regularising. Optimisation is the paper's: Adam (0.9, 0.98,
1e-9), the warmup / inverse-square-root schedule and label smoothing 0.1, with the schedule shrunk to the
run: 100 warm-up steps (instead of 4000 of 100k), then the paper's 1/sqrt(step) decay for the remaining
200; scale 0.3, a peak rate of 2.7e-3 for d_model 128, ending at 1.5e-3. (A peak of 3.5e-3 or more
at step 100 sets this small model back: held-out BLEU 88 at 3.5e-3 and 6 at 5.3e-3, against 99 here.)

The vocabulary is the demo tokenizer's: 1,000 BPE tokens learned from the toy corpus, instead of the
preset's 9,000 (sized for a real corpus). The model's embedding (shared with the output projection) is
sized to the tokenizer, so the demo model has 8,000 x 128 = 1,024,000 fewer parameters than the preset.

One CPU thread by default: at this size a second thread buys ~1.5x on an idle machine but costs ~10x
as soon as another process competes for the cores (PyTorch's thread pool spins while it waits).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from zoo.demo.corpus import toy_corpus
from zoo.demo.tsv import write_tsv
from zoo.training.config import TrainConfig

DEMO_SENTENCES = (
    "the cat eats fish",
    "the big dog chased three cats in the park",
    "she will cook fish in the kitchen",
    "two young students bought a new bag at the market",
)

# The config's ``model`` section: plain data, validated with the rest of the `TrainConfig`.
DEMO_MODEL: dict[str, Any] = {"preset": "transformer-tiny", "overrides": {"dropout": 0.1}}
DEMO_VOCAB_SIZE = 1000


def write_toy_data(
    directory: Path, *, seed: int = 0, train_size: int = 6000, valid_size: int = 300
) -> tuple[Path, Path]:
    """Write the toy corpus as ``train.tsv`` and ``valid.tsv`` under ``directory``; returns both paths."""
    corpus = toy_corpus(seed=seed, train_size=train_size, valid_size=valid_size)
    directory.mkdir(parents=True, exist_ok=True)
    train, valid = directory / "train.tsv", directory / "valid.tsv"
    write_tsv(corpus.train, train)
    write_tsv(corpus.valid, valid)
    return train, valid


def demo_config(
    output_dir: Path = Path("runs/demo"),
    *,
    train: Path,
    valid: Path,
    max_steps: int = 300,
    num_threads: int | None = 1,
    device: str = "auto",
    seed: int = 0,
) -> TrainConfig:
    """The demo's training config: transformer-tiny on the toy corpus with the paper's recipe."""
    return TrainConfig.from_dict(
        {
            "model": DEMO_MODEL,
            "task": "seq2seq",
            "data": {"train": str(train), "valid": str(valid)},
            "tokenizer": {"kind": "bpe", "vocab_size": DEMO_VOCAB_SIZE, "shared": True},
            "optim": {"name": "adam", "betas": [0.9, 0.98], "eps": 1e-9, "clip_grad_norm": 1.0},
            "schedule": {"kind": "noam", "warmup_steps": 100, "scale": 0.3},
            "batch": {"max_tokens": 4096},
            "loss": {"label_smoothing": 0.1},
            "eval": {"every_steps": 100, "bleu": True},
            "max_steps": max_steps,
            "output_dir": str(output_dir),
            "seed": seed,
            "device": device,
            "num_threads": num_threads,
            "log_every": 10,
        },
        where="zoo demo",
    )
