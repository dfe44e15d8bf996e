"""KTO (``task: {kind: kto, ...}``) on unpaired completions: the loss and its gradients against TRL's
formula written here in plain torch, a short run that learns the labels, exact resume, bad lines and
settings refused by name."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from tests.training.tuning_support import GPT, live_models, phrase, records
from zoo.training import TrainConfig, Trainer, train
from zoo.training.config import ConfigError
from zoo.training.data import DataError
from zoo.training.tasks.kto import KahnemanTversky


def write_examples(path: Path, seed: int, count: int = 160) -> Path:
    """Unpaired completions: a short answer (1-2 words) is desirable, a long one (5-8) is not."""
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        good = rng.random() < 0.5
        completion = " " + (phrase(rng, 1, 2) if good else phrase(rng, 5, 8))
        rows.append({"prompt": phrase(rng, 2, 5), "completion": completion, "label": good})
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.fixture(scope="module")
def examples(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("kto")
    return write_examples(folder / "train.jsonl", 0), write_examples(folder / "valid.jsonl", 1, count=40)


def kto_config(output_dir: Path, files: tuple[Path, Path], **overrides: Any) -> TrainConfig:
    config = TrainConfig.from_dict(
        {
            "model": overrides.pop("model", GPT),
            "task": "kto",
            "data": {"train": str(files[0]), "valid": str(files[1])},
            "tokenizer": {"kind": "bpe", "vocab_size": 60, "min_frequency": 1},
            "schedule": {"kind": "constant", "lr": 3e-3},
            "batch": {"max_tokens": 512},
            "max_steps": 2,
            "log_every": 1,
            "output_dir": str(output_dir),
        }
    )
    return config.override(**overrides) if overrides else config


def log_prob(model: torch.nn.Module, prompt: list[int], completion: list[int]) -> torch.Tensor:
    ids = torch.tensor([prompt + completion])
    logp = F.log_softmax(model(ids).logits[0].double(), dim=-1)  # (L, V)
    positions = torch.arange(len(prompt), len(ids[0]))
    return logp[positions - 1, ids[0, positions]].sum()


@pytest.mark.parametrize("scale", [0.05, 0.0], ids=["moved", "at-reference"])
def test_loss_and_gradients_equal_trls_formula_in_plain_torch(
    examples: tuple[Path, Path], tmp_path: Path, scale: float
) -> None:
    beta, w_d, w_u = 0.5, 1.3, 0.7
    overrides = {"task.beta": beta, "task.desirable_weight": w_d, "task.undesirable_weight": w_u}
    before = live_models()
    trainer = Trainer(kto_config(tmp_path / "run", examples, **overrides), progress=False)
    try:
        objective = trainer.objective
        assert isinstance(objective, KahnemanTversky) and objective.reference is not trainer.model
        assert live_models() - before == 2  # the policy and its frozen reference
        policy, reference = trainer.model.double(), objective.reference.double()
        with torch.no_grad():
            generator = torch.Generator().manual_seed(0)
            for p in policy.parameters():
                p.add_(torch.randn(p.shape, generator=generator, dtype=p.dtype) * scale)
        chosen = np.array([0, 3, 5, 6, 8, 11])
        batch = trainer.collate(chosen)
        assert batch.inputs["input_ids"].shape[0] == 12 and objective.count(batch) == 6
        policy.zero_grad()
        sums = objective(policy, batch, device=torch.device("cpu"), train=True)
        sums.loss.backward()
        ours = {n: p.grad.clone() for n, p in policy.named_parameters() if p.grad is not None}

        tok = trainer.tokenizers.target
        rows = [json.loads(line) for line in examples[0].read_text().splitlines()]
        bos, eos = tok.bos_id, tok.eos_id
        assert bos is not None and eos is not None
        picked = [rows[i] for i in chosen.tolist()]
        prompts = [[bos, *tok.encode_ids([r["prompt"]])[0]] for r in picked]
        completions = [[*tok.encode_ids([r["completion"]])[0], eos] for r in picked]
        labels = [r["label"] for r in picked]
        assert any(labels) and not all(labels)
        policy.zero_grad()
        # TRL's KL rows: prompt i with completion i - 1; z0 their mean log-ratio, clamped at 0, no gradient
        with torch.no_grad():
            kl_terms = [
                log_prob(policy, prompts[i], completions[i - 1])
                - log_prob(reference, prompts[i], completions[i - 1])
                for i in range(len(picked))
            ]
            z0 = torch.clamp(sum(kl_terms) / len(kl_terms), min=0)
        expected = torch.zeros((), dtype=torch.float64)
        for prompt, completion, good in zip(prompts, completions, labels):
            with torch.no_grad():
                ref = log_prob(reference, prompt, completion)
            r = log_prob(policy, prompt, completion) - ref
            if good:
                expected = expected + w_d * (1 - torch.sigmoid(beta * (r - z0)))
            else:
                expected = expected + w_u * (1 - torch.sigmoid(beta * (z0 - r)))
        expected.backward()
        got, want = float(sums.loss.detach()), float(expected.detach())
        assert abs(got - want) < 1e-6, (got, want)
        assert abs(float(sums.metrics["kl"]) / 6 - float(z0)) < 1e-6
        theirs = {n: p.grad for n, p in policy.named_parameters() if p.grad is not None}
        assert set(ours) == set(theirs) and ours
        worst = max(float((ours[n] - theirs[n]).abs().max()) for n in ours)
        assert worst < 1e-6, worst
        if scale == 0:  # the policy is the reference: every log-ratio and z0 are 0, each loss w (1 - 1/2)
            assert got == pytest.approx(sum(0.5 * (w_d if g else w_u) for g in labels), abs=1e-9)
        else:
            assert float(z0) > 0  # the clamp did not hide the estimate: the KL term is exercised
    finally:
        trainer.close()


def test_a_short_run_learns_the_labels(examples: tuple[Path, Path], tmp_path: Path) -> None:
    config = kto_config(tmp_path / "run", examples, max_steps=16, **{"task.beta": 0.5, "eval.every_steps": 8})
    result = train(config, progress=False)
    logged = [r for r in records(result.output_dir) if r["loss"] is not None]
    first, last = sum(r["loss"] for r in logged[:3]) / 3, sum(r["loss"] for r in logged[-3:]) / 3
    assert last < 0.8 * first, [r["loss"] for r in logged]
    assert logged[-1]["rewards/accuracy"] > logged[0]["rewards/accuracy"]
    assert logged[-1]["rewards/signed"] > logged[0]["rewards/signed"]
    assert result.final["val_rewards/signed"] > 0  # held out: desirable answers up, undesirable down
    run = json.loads((result.output_dir / "run.json").read_text())
    assert run["task"] == "kto" and run["loss_name"] == "KTO" and "KTO's loss, beta 0.5" in run["loss"]


def test_a_lora_run_resumes_exactly(examples: tuple[Path, Path], tmp_path: Path) -> None:
    text = tmp_path / "text.txt"
    rows = [json.loads(line) for line in examples[0].read_text().splitlines()]
    text.write_text("".join(f"{r['prompt']}{r['completion']}\n" for r in rows))
    base = train(
        kto_config(tmp_path / "base", examples, task="causal_lm", max_steps=2, **{"data.train": str(text)}),
        progress=False,
    )

    def config(name: str, steps: int) -> TrainConfig:
        return kto_config(
            tmp_path / name,
            examples,
            model={"init_from": str(base.output_dir)},
            max_steps=steps,
            lora={"r": 4, "alpha": 8, "targets": ["qkv", "out"]},
            **{"schedule.lr": 2e-2, "checkpoint.every_steps": 2},
        )

    straight = train(config("straight", 4), progress=False)
    train(config("split", 2), progress=False)
    resumed = train(config("split", 4), progress=False, resume=True)
    expected = {r["step"]: r for r in records(straight.output_dir) if r["loss"] is not None}
    got = {r["step"]: r for r in records(resumed.output_dir) if r["loss"] is not None}
    assert sorted(got) == [1, 2, 3, 4]
    for step in (3, 4):
        for key in ("loss", "kl", "rewards/signed", "rewards/accuracy"):
            assert got[step][key] == pytest.approx(expected[step][key], abs=1e-6), (step, key)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (
            '{"prompt": "a cat", "completion": " sees", "label": "yes"}',
            r"train.jsonl:3: 'label' must be true or false",
        ),
        ('{"prompt": "a cat", "completion": " sees"}', r"train.jsonl:3: no key 'label'"),
        (
            '{"prompt": "a cat", "completion": ["sees"], "label": true}',
            r"train.jsonl:3: 'completion' must be a string",
        ),
    ],
    ids=["label", "missing", "list"],
)
def test_a_bad_line_is_refused_naming_file_line_and_field(
    examples: tuple[Path, Path], tmp_path: Path, line: str, message: str
) -> None:
    good = examples[0].read_text().splitlines()
    bad = tmp_path / "train.jsonl"
    bad.write_text("\n".join([*good[:2], line, *good[2:]]) + "\n")
    with pytest.raises(DataError, match=message):
        Trainer(kto_config(tmp_path / "run", (bad, examples[1])), progress=False)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"task.gamma": 1.0}, r"task\.kto\.gamma: Extra inputs are not permitted"),
        ({"task.loss": "ipo"}, r"task\.kto\.loss: Extra inputs are not permitted"),
        ({"task.desirable_weight": 0}, r"task\.kto\.desirable_weight: Input should be greater than 0"),
        ({"loss.label_smoothing": 0.1}, r"loss\.label_smoothing \(0\.1\) is not read by kto"),
    ],
    ids=["gamma", "loss", "weight", "smoothing"],
)
def test_settings_are_refused_by_name(
    examples: tuple[Path, Path], tmp_path: Path, overrides: dict, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        kto_config(tmp_path / "run", examples, **overrides)
