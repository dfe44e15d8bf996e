"""Every registered task honours the protocol: it trains a step, evaluates, and resumes exactly.

A new task joins `zoo.training.tasks.TASKS` and this test with one row of `DATA` (a writer of a small
raw corpus, and the model to train): nothing else in the loop or the setup needs to know about it.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.training.tuning_support import WORDS
from zoo.training import TrainConfig, train
from zoo.training.tasks import TASKS

BERT = {"preset": "bert-tiny", "overrides": {"d_model": 32, "attention.num_heads": 2, "ffn.d_ff": 64}}
GPT = {"preset": "gpt2-tiny", "overrides": {"d_model": 32, "attention.num_heads": 2, "ffn.d_ff": 64}}
VIT = {
    "spec": {
        "family": "encoder", "d_model": 32, "num_layers": 1, "attention": {"num_heads": 2},
        "ffn": {"d_ff": 64}, "norm": {"placement": "pre"}, "position": {"kind": "none"},
        "embedding": {"kind": "patches", "image_size": 4, "patch_size": 2, "channels": 1},
    }
}  # fmt: skip
TRANSFORMER = {
    "preset": "transformer-tiny",
    "overrides": {
        "d_model": 32,
        "num_layers": 1,
        "attention.num_heads": 2,
        "ffn.d_ff": 64,
        "max_positions": 64,
    },
}


def sentences(n: int, seed: int) -> list[list[str]]:
    rng = random.Random(seed)
    return [[rng.choice(WORDS) for _ in range(rng.randint(3, 9))] for _ in range(n)]


def write_pairs(path: Path, seed: int) -> Path:
    path.write_text("".join(f"{' '.join(s)}\t{' '.join(reversed(s))}\n" for s in sentences(60, seed)))
    return path


def write_text(path: Path, seed: int) -> Path:
    path.write_text("".join(" ".join(s) + "\n" for s in sentences(60, seed)))
    return path


def write_labelled(path: Path, seed: int) -> Path:
    rows = sentences(60, seed)
    path.write_text("".join(f"{' '.join(s)}\t{'yes' if 'cat' in s else 'no'}\n" for s in rows))
    return path


def write_preferences(path: Path, seed: int) -> Path:
    rows = [{"prompt": " ".join(s[:2]), "chosen": f" {s[2]}", "rejected": " " + " ".join(reversed(s[1:]))}
            for s in sentences(60, seed)]  # fmt: skip
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def write_unpaired(path: Path, seed: int) -> Path:
    rows = [{"prompt": " ".join(s[:2]), "completion": " " + " ".join(s[2:]), "label": k % 3 != 0}
            for k, s in enumerate(sentences(60, seed))]  # fmt: skip
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def write_tagged(path: Path, seed: int) -> Path:
    rows = [{"tokens": s, "tags": ["N" if w in ("cat", "dog", "fish", "bird") else "O" for w in s]}
            for s in sentences(60, seed)]  # fmt: skip
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def write_conversations(path: Path, seed: int) -> Path:
    rows = []
    for k, s in enumerate(sentences(60, seed)):
        turns = [
            {"role": "user", "content": " ".join(s)},
            {"role": "assistant", "content": " ".join(reversed(s))},
        ]
        rows.append({"messages": [{"role": "system", "content": "reverse"}, *turns] if k % 2 else turns})
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def write_images(path: Path, seed: int) -> Path:
    import numpy as np

    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 3, 60)
    images = (rng.integers(0, 60, (60, 4, 4)) + 60 * labels[:, None, None]).astype(np.uint8)
    np.savez(path, images=images, labels=labels)
    return path


def write_prompts(path: Path, seed: int) -> Path:
    rows = [{"prompt": " ".join(s) if k % 2 else [{"role": "user", "content": " ".join(s)}], "word": s[0]}
            for k, s in enumerate(sentences(60, seed))]  # fmt: skip
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


GRPO_REWARDS = [
    f"{Path(__file__).parent / 'grpo_rewards.py'}:short",
    f"{Path(__file__).parent / 'grpo_rewards.py'}:says",
]


def write_triplets(path: Path, seed: int) -> Path:
    rows = [{"anchor": " ".join(s), "positive": " ".join(reversed(s)), "negative": " ".join(s[1:])}
            for s in sentences(60, seed)]  # fmt: skip
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


# task (variant) -> (writer, suffix, model, config extras, a validation score the task adds)
DATA: dict[str, tuple[Callable[[Path, int], Path], str, dict[str, Any], dict[str, Any], str | None]] = {
    "seq2seq": (write_pairs, ".tsv", TRANSFORMER, {"task.bleu_samples": 4, "task.max_new_tokens": 4}, "val_bleu"),
    "seq2seq packed": (write_pairs, ".tsv", TRANSFORMER, {"task.bleu_samples": 4, "task.max_new_tokens": 4,
                                                          "data.packing": {"block_size": 32}}, "val_bleu"),
    "causal_lm": (write_text, ".txt", GPT, {}, None),
    "causal_lm packed": (write_text, ".txt", GPT, {"data.packing": {"block_size": 32, "documents": "separate"}},
                         None),
    "masked_lm": (write_text, ".txt", BERT, {}, None),
    "masked_lm packed": (write_text, ".txt", BERT, {"data.packing": {"block_size": 32}}, None),
    "sequence_classification": (write_labelled, ".tsv", BERT, {}, "val_accuracy"),
    "token_classification": (write_tagged, ".jsonl", BERT, {}, "val_accuracy"),
    "image_classification": (write_images, ".npz", VIT, {}, "val_accuracy"),
    "chat": (write_conversations, ".jsonl", GPT, {}, None),
    "chat packed": (write_conversations, ".jsonl", GPT, {"data.packing": {"block_size": 48, "documents": "separate"}},
                    None),
    "dpo": (write_preferences, ".jsonl", GPT, {}, "val_rewards/accuracy"),
    "dpo simpo": (write_preferences, ".jsonl", GPT, {"task.loss": "simpo"}, "val_rewards/accuracy"),
    "kto": (write_unpaired, ".jsonl", GPT, {}, "val_rewards/accuracy"),
    "grpo": (write_prompts, ".jsonl", GPT, {"task": {"kind": "grpo", "rewards": GRPO_REWARDS, "group_size": 2,
                                                     "max_new_tokens": 4, "beta": 0.1}}, "val_reward"),
    "contrastive": (write_triplets, ".jsonl", BERT, {}, "val_retrieval_accuracy"),
    "contrastive cached": (write_triplets, ".jsonl", BERT, {"task": {"kind": "contrastive", "cache_batch": 5,
                           "hard_negatives": 1, "matryoshka_dims": [32, 8]}}, "val_retrieval_accuracy"),
}  # fmt: skip


def test_every_registered_task_is_in_the_contract() -> None:
    assert {name.split()[0] for name in DATA} == set(TASKS)


def config_for(variant: str, tmp_path: Path, output: str, max_steps: int) -> TrainConfig:
    write, suffix, model, extras, _ = DATA[variant]
    train_file = tmp_path / f"train{suffix}"
    valid_file = tmp_path / f"valid{suffix}"
    if not train_file.exists():
        write(train_file, 0)
        write(valid_file, 1)
    data: dict[str, Any] = {
        "model": model,
        "task": variant.split()[0],
        "data": {"train": str(train_file), "valid": str(valid_file)},
        **(
            {"tokenizer": {"kind": "bpe", "vocab_size": 60, "min_frequency": 1}}
            if TASKS[variant.split()[0]].reads_text
            else {}
        ),
        "schedule": {"kind": "constant", "lr": 1e-3},
        "batch": {"max_tokens": 128, "grad_accum": 2},
        "checkpoint": {"every_steps": 2, "keep_last": 3},
        "max_steps": max_steps,
        "log_every": 1,
        "output_dir": str(tmp_path / output),
    }
    config = TrainConfig.from_dict(data)
    return config.override(**extras) if extras else config


def losses(run: Path) -> dict[int, float]:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in records if r["loss"] is not None}


@pytest.mark.parametrize("variant", list(DATA))
def test_a_task_trains_evaluates_and_resumes_exactly(variant: str, tmp_path: Path) -> None:
    straight = train(config_for(variant, tmp_path, "straight", 4), progress=False)
    assert straight.step == 4 and straight.final["val_loss"] > 0
    score = DATA[variant][4]
    if score is not None:
        assert straight.final[score] is not None
    train(config_for(variant, tmp_path, "split", 2), progress=False)
    resumed = train(config_for(variant, tmp_path, "split", 4), progress=False, resume=True)
    expected, got = losses(tmp_path / "straight"), losses(tmp_path / "split")
    assert sorted(got) == [1, 2, 3, 4]
    for step in (3, 4):
        assert abs(expected[step] - got[step]) < 1e-6, (step, expected, got)
    for (name, a), (_, b) in zip(straight.model.state_dict().items(), resumed.model.state_dict().items()):
        assert torch.equal(a, b), name
    assert resumed.final["val_loss"] == pytest.approx(straight.final["val_loss"], abs=1e-6)


@pytest.mark.parametrize("name", sorted(TASKS))
def test_separate_vocabularies_are_read_by_seq2seq_and_refused_by_every_other_task(name: str) -> None:
    """``tokenizer.shared: false`` is acted on by the task with a source side and refused by the others,
    never ignored."""
    from zoo.training.config import ConfigError, TokenizerConfig
    from zoo.training.tasks import get_task

    task = get_task(name)
    assert task.separate_vocabularies(TokenizerConfig()) is False
    if name == "seq2seq":
        assert task.separate_vocabularies(TokenizerConfig(shared=False)) is True
    else:
        with pytest.raises(
            ConfigError, match=rf"tokenizer.shared: false needs .*; {name} reads one vocabulary"
        ):
            task.separate_vocabularies(TokenizerConfig(shared=False))
