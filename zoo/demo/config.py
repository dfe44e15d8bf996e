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

The demo reruns in place (``make demo`` twice): it replaces a previous run only when `is_demo_run`
recognises it by its ``train_config.yaml`` — this config, on ``<output_dir>/data/*.tsv``, whatever the
steps, device and threads — and never a foreign run or a model saved there (that takes ``--overwrite``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from zoo.demo.corpus import toy_corpus
from zoo.demo.tsv import read_tsv, write_tsv
from zoo.io.names import DEMO_DATA_DIR, DEMO_TRAIN_NAME, DEMO_VALID_NAME, TRAIN_CONFIG_NAME
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
    directory: Path,
    *,
    seed: int = 0,
    train_size: int = 6000,
    valid_size: int = 300,
    overwrite: bool = False,
) -> tuple[Path, Path]:
    """Write the toy corpus as ``train.tsv`` and ``valid.tsv`` under ``directory``; returns both paths.

    A file already holding these pairs is left as it is; one holding anything else is replaced only with
    ``overwrite`` (a FileExistsError otherwise), and a symbolic link never (a ValueError).
    """
    corpus = toy_corpus(seed=seed, train_size=train_size, valid_size=valid_size)
    directory.mkdir(parents=True, exist_ok=True)
    train, valid = directory / DEMO_TRAIN_NAME, directory / DEMO_VALID_NAME
    for path, pairs in ((train, corpus.train), (valid, corpus.valid)):
        if path.is_symlink():
            raise ValueError(f"{path} is a symbolic link: the demo does not write through it; remove it")
        if path.exists() and _read_pairs(path) == list(pairs):
            continue
        if path.exists() and not overwrite:
            raise FileExistsError(
                f"{path} holds other data than the demo's toy corpus: choose another --output-dir, or "
                "replace it (--overwrite)"
            )
        write_tsv(pairs, path)
    return train, valid


def _read_pairs(path: Path) -> list[tuple[str, str]] | None:
    try:
        return read_tsv(path)
    except (ValueError, OSError):  # not TSV, not UTF-8, a directory: not the demo's
        return None


def is_demo_run(output_dir: Path) -> bool:
    """``output_dir`` holds a run of `demo_config` (any steps, device, threads and seed) on its own
    ``data/`` files: the demo may replace it. Anything else there is foreign."""
    try:
        saved = TrainConfig.from_yaml(output_dir / TRAIN_CONFIG_NAME)
    except (ValueError, OSError):  # none, unreadable, or not a training config
        return False
    data = output_dir / DEMO_DATA_DIR
    ours = demo_config(
        output_dir,
        train=data / DEMO_TRAIN_NAME,
        valid=data / DEMO_VALID_NAME,
        max_steps=saved.max_steps or 1,
        num_threads=saved.num_threads,
        device=saved.device,
        seed=saved.seed,
    )
    return _comparable(saved) == _comparable(ours)


def _comparable(config: TrainConfig) -> dict[str, Any]:
    """The config as data, with its paths resolved (a relative path is relative to the working directory,
    as the run read it)."""
    dump = config.model_dump(mode="json")
    dump["output_dir"] = str(Path(dump["output_dir"]).resolve())
    for split in ("train", "valid"):
        if isinstance(dump["data"][split], str):
            dump["data"][split] = str(Path(dump["data"][split]).resolve())
    return dump


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
            "task": {"kind": "seq2seq", "bleu": True},
            "data": {"train": str(train), "valid": str(valid)},
            "tokenizer": {"kind": "bpe", "vocab_size": DEMO_VOCAB_SIZE, "shared": True},
            "optim": {"name": "adam", "betas": [0.9, 0.98], "eps": 1e-9, "clip_grad_norm": 1.0},
            "schedule": {"kind": "noam", "warmup_steps": 100, "scale": 0.3},
            "batch": {"max_tokens": 4096},
            "loss": {"label_smoothing": 0.1},
            "eval": {"every_steps": 100},
            "max_steps": max_steps,
            "output_dir": str(output_dir),
            "seed": seed,
            "device": device,
            "num_threads": num_threads,
            "log_every": 10,
        },
        where="zoo demo",
    )
