"""Shared pieces of the preference and RL tuning tests (dpo, grpo, kto): a tiny GPT-2 and the words its data
is made of, a config factory, a starting model folder, a file with one bad line, a run read back, and the
same run in two gloo processes."""

from __future__ import annotations

import gc
import json
import os
import random
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import torch

import zoo
from zoo.models.base import ZooModel
from zoo.training import TrainConfig, train

WORDS = [
    "the",
    "cat",
    "dog",
    "sees",
    "eats",
    "a",
    "fish",
    "bird",
    "small",
    "big",
    "runs",
    "sleeps",
    "red",
    "blue",
]
GPT = {
    "preset": "gpt2-tiny",
    "overrides": {"d_model": 32, "attention.num_heads": 2, "ffn.d_ff": 64, "dropout": 0.0},
}
# A BPE tokenizer small enough that every word above is a token or two.
TOKENIZER = {"kind": "bpe", "vocab_size": 60, "min_frequency": 1}


def phrase(rng: random.Random, low: int, high: int) -> str:
    """``low`` to ``high`` words drawn from `WORDS`."""
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(low, high)))


def tuning_config(
    output_dir: Path,
    files: tuple[Path, Path],
    *,
    task: str | dict[str, Any],
    batch: dict[str, Any],
    model: dict[str, Any] = GPT,
    **overrides: Any,
) -> TrainConfig:
    """A 2-step run of ``task`` on the tiny GPT-2 (or ``model``, replaced whole) from the (train, valid)
    ``files``, writing to ``output_dir``; keyword arguments are dotted overrides."""
    config = TrainConfig.from_dict(
        {
            "model": model,
            "task": task,
            "data": {"train": str(files[0]), "valid": str(files[1])},
            "tokenizer": TOKENIZER,
            "schedule": {"kind": "constant", "lr": 3e-3},
            "batch": batch,
            "max_steps": 2,
            "log_every": 1,
            "output_dir": str(output_dir),
        }
    )
    return config.override(**overrides) if overrides else config


def train_base(folder: Path, text: str, *, steps: int, **settings: Any) -> Path:
    """The run folder of the tiny GPT-2 trained for ``steps`` steps on ``text`` (a model to start from);
    ``settings`` are further top-level config sections (``schedule``)."""
    path = folder / "text.txt"
    path.write_text(text)
    config = TrainConfig.from_dict(
        {
            "model": GPT,
            "data": {"train": str(path)},
            "tokenizer": TOKENIZER,
            "batch": {"max_tokens": 512},
            "max_steps": steps,
            "output_dir": str(folder / "run"),
            **settings,
        }
    )
    train(config, progress=False)
    return folder / "run"


def with_bad_line(good: Path, line: str, out: Path) -> Path:
    """``out``: the lines of ``good`` with ``line`` put in as line 3."""
    lines = good.read_text().splitlines()
    out.write_text("\n".join([*lines[:2], line, *lines[2:]]) + "\n")
    return out


def records(run: Path) -> list[dict[str, Any]]:
    """The run's ``metrics.jsonl``, one dict a line."""
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def live_models() -> int:
    """How many zoo models this process holds past the heap frozen when the module started (the suite's
    conftest): compare two counts made in one test. Without the freeze, a count late in the suite took 1.5 s."""
    gc.collect()
    with warnings.catch_warnings():  # isinstance on every object touches deprecated torch attributes
        warnings.simplefilter("ignore")
        return sum(isinstance(o, ZooModel) for o in gc.get_objects())


def train_in_two_processes(config: TrainConfig, path: Path) -> ZooModel:
    """The model ``config`` trains in two gloo processes (``torch.distributed.run``), its YAML written to
    ``path``; the launcher's output's end in the failure when it fails."""
    path.write_text(config.to_yaml(), encoding="utf-8")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    command += ["-m", "zoo", "train", str(path)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=240, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return zoo.load(config.output_dir)


def assert_same_weights(one: torch.nn.Module, two: torch.nn.Module) -> None:
    """Every tensor of the two state dicts equal within 1e-5, the first one off named."""
    for (name, a), (_, b) in zip(one.state_dict().items(), two.state_dict().items()):
        assert torch.allclose(a, b, atol=1e-5), f"{name}: max diff {(a - b).abs().max():.2e}"
