"""Preference tuning (``task: dpo``): the loss against a hand computation in plain torch, log 2 while the
policy is the reference, a measured preference learnt, LoRA's reference (the base, adapters disabled, no
copy), bad lines, and the CLI."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml
from torch.nn import functional as F

import zoo
import zoo.lora
from tests.training.tuning_support import (
    GPT,
    WORDS,
    assert_same_weights,
    live_models,
    phrase,
    records,
    train_base,
    train_in_two_processes,
    tuning_config,
    with_bad_line,
)
from zoo.cli import main
from zoo.io.tokenizer import train_tokenizer
from zoo.training import TrainConfig, Trainer, train
from zoo.training.config import ConfigError
from zoo.training.data import DataError
from zoo.training.tasks.dpo import DirectPreference

REWARDS = ("rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracy")


def write_pairs(path: Path, seed: int, count: int = 120) -> Path:
    """Pairs whose chosen answer is the shorter one (1-2 words against 5-8): a preference to measure."""
    rng = random.Random(seed)
    rows = [
        {"prompt": phrase(rng, 2, 5), "chosen": " " + phrase(rng, 1, 2), "rejected": " " + phrase(rng, 5, 8)}
        for _ in range(count)
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.fixture(scope="module")
def pairs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("pairs")
    return write_pairs(folder / "train.jsonl", 0), write_pairs(folder / "valid.jsonl", 1, count=40)


def dpo_config(output_dir: Path, pairs: tuple[Path, Path], **overrides: Any) -> TrainConfig:
    return tuning_config(output_dir, pairs, task="dpo", batch={"max_tokens": 512}, **overrides)


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory, pairs: tuple[Path, Path]) -> Path:
    """A tiny causal LM trained for 3 steps on the prompts and answers (a model folder to start from)."""
    lines = [json.loads(line) for line in pairs[0].read_text().splitlines()]
    text = "".join(f"{r['prompt']}{r['chosen']}\n{r['prompt']}{r['rejected']}\n" for r in lines)
    schedule = {"kind": "constant", "lr": 3e-3}
    return train_base(tmp_path_factory.mktemp("base"), text, steps=3, schedule=schedule)


# --- the loss ---------------------------------------------------------------------------------------------


def response_log_prob(model: torch.nn.Module, prompt: list[int], response: list[int]) -> torch.Tensor:
    """log p(response | prompt) of one unpadded sequence ``prompt response``, by plain torch."""
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logp = F.log_softmax(model(ids).logits[0].double(), dim=-1)  # (L, V)
    positions = torch.arange(len(prompt), len(ids[0]))  # the response tokens
    return logp[positions - 1, ids[0, positions]].sum()


@pytest.mark.parametrize(("eps", "alpha"), [(0.0, 0.0), (0.2, 0.0), (0.0, 0.7)], ids=["dpo", "cdpo", "rpo"])
def test_the_loss_equals_a_hand_computation_in_plain_torch(
    pairs: tuple[Path, Path], tmp_path: Path, eps: float, alpha: float
) -> None:
    overrides = {"loss.label_smoothing": eps, "task.beta": 0.5, "task.nll_coef": alpha}
    config = dpo_config(tmp_path / "run", pairs, **overrides)
    trainer = Trainer(config, progress=False)
    try:
        objective = trainer.objective
        assert isinstance(objective, DirectPreference) and objective.reference is not trainer.model
        policy, reference = trainer.model.double(), objective.reference.double()
        with torch.no_grad():  # a policy that has moved away from the reference
            generator = torch.Generator().manual_seed(0)
            for p in policy.parameters():
                p.add_(torch.randn(p.shape, generator=generator, dtype=p.dtype) * 0.05)
        examples = np.array([0, 3, 5, 6])
        batch = trainer.collate(examples)
        assert batch.inputs["input_ids"].shape[0] == 8 and objective.count(batch) == 4
        sums = objective(policy, batch, device=torch.device("cpu"), train=True)
        total = float(sums.loss.detach())

        tok = trainer.tokenizers.target
        rows = [json.loads(line) for line in pairs[0].read_text().splitlines()]
        bos, eos = tok.bos_id, tok.eos_id
        assert bos is not None and eos is not None
        loss, chosen_rewards, rejected_rewards, nlls = 0.0, [], [], []
        for i in examples.tolist():
            prompt = [bos, *tok.encode_ids([rows[i]["prompt"]])[0]]
            chosen = [*tok.encode_ids([rows[i]["chosen"]])[0], eos]
            rejected = [*tok.encode_ids([rows[i]["rejected"]])[0], eos]
            pc, pr = response_log_prob(policy, prompt, chosen), response_log_prob(policy, prompt, rejected)
            rc, rr = (
                response_log_prob(reference, prompt, chosen),
                response_log_prob(reference, prompt, rejected),
            )
            h = float((pc - rc) - (pr - rr))
            sigmoid = 1 / (1 + math.exp(-0.5 * h))
            nlls.append(-float(pc) / len(chosen))  # RPO: the chosen response's mean token NLL
            loss += -(1 - eps) * math.log(sigmoid) - eps * math.log(1 - sigmoid) + alpha * nlls[-1]
            chosen_rewards.append(0.5 * float(pc - rc))
            rejected_rewards.append(0.5 * float(pr - rr))
        assert abs(total - loss) < 1e-6, (total, loss)
        margins = [c - r for c, r in zip(chosen_rewards, rejected_rewards)]
        expected = {
            "rewards/chosen": sum(chosen_rewards),
            "rewards/rejected": sum(rejected_rewards),
            "rewards/margins": sum(margins),
            "rewards/accuracy": float(sum(m > 0 for m in margins)),
        }
        if alpha:
            expected["nll/chosen"] = sum(nlls)
        assert set(sums.metrics) == set(expected)
        for name, value in expected.items():
            assert abs(float(sums.metrics[name]) - value) < 1e-6, name
        assert 0 < expected["rewards/accuracy"] < 4  # the perturbation made a mix, so accuracy is measured
    finally:
        trainer.close()


@pytest.mark.parametrize("start", ["preset", "init_from"])
def test_while_the_policy_is_the_reference_the_loss_is_log_2_and_the_margins_0(
    pairs: tuple[Path, Path], base: Path, tmp_path: Path, start: str
) -> None:
    model = GPT if start == "preset" else {"init_from": str(base)}
    trainer = Trainer(dpo_config(tmp_path / "run", pairs, model=model, max_steps=1), progress=False)
    try:
        before = trainer.evaluate()  # step 0: validation before any update
        result = trainer.fit()
    finally:
        trainer.close()
    first = records(result.output_dir)[1]  # the first training record (step 1's loss, before its update)
    for record, prefix in ((before, "val_"), (first, "")):
        assert record[f"{prefix}loss"] == pytest.approx(math.log(2), abs=1e-6)
        assert record[f"{prefix}rewards/margins"] == pytest.approx(0.0, abs=1e-6)
        assert record[f"{prefix}rewards/chosen"] == pytest.approx(0.0, abs=1e-6)
        assert record[f"{prefix}rewards/accuracy"] == 0.0  # no margin is positive yet
    assert before["val_ppl"] is None


def test_training_learns_the_preference_for_shorter_answers(pairs: tuple[Path, Path], tmp_path: Path) -> None:
    config = dpo_config(tmp_path / "run", pairs, max_steps=24, log_every=4, **{"eval.every_steps": 8})
    result = train(config, progress=False)
    logged = [r for r in records(result.output_dir) if r["loss"] is not None]
    validated = [r for r in records(result.output_dir) if r["val_loss"] is not None]
    assert logged[-1]["loss"] < 0.5 * logged[0]["loss"]
    assert logged[-1]["rewards/accuracy"] > logged[0]["rewards/accuracy"]
    assert logged[-1]["rewards/margins"] > logged[0]["rewards/margins"] > 0
    # held-out pairs: the shorter answer is now preferred, by a growing margin
    assert [r["val_rewards/margins"] for r in validated] == sorted(
        r["val_rewards/margins"] for r in validated
    )
    assert result.final["val_rewards/accuracy"] >= 0.9 and result.final["val_rewards/margins"] > 0.5
    run = json.loads((result.output_dir / "run.json").read_text())
    assert (
        run["task"] == "dpo" and "DPO's sigmoid loss, beta 0.1" in run["loss"] and run["loss_name"] == "DPO"
    )
    for name in REWARDS:  # every training and validation record carries the rewards
        assert all(r[name] is not None for r in logged) and all(
            r[f"val_{name}"] is not None for r in validated
        )


# --- the reference model ------------------------------------------------------------------------------------


def test_without_lora_the_reference_is_one_frozen_copy_of_the_starting_weights(
    pairs: tuple[Path, Path], base: Path, tmp_path: Path
) -> None:
    before = live_models()
    trainer = Trainer(dpo_config(tmp_path / "run", pairs, model={"init_from": str(base)}), progress=False)
    try:
        assert live_models() - before == 2  # the policy and its reference
        reference = trainer.objective.reference  # type: ignore[attr-defined]
        assert not reference.training and not any(p.requires_grad for p in reference.parameters())
        trainer.fit()
        started = zoo.load(base)
        for (name, ours), theirs in zip(reference.state_dict().items(), started.state_dict().values()):
            assert torch.equal(ours, theirs), name  # still the starting weights after training
    finally:
        trainer.close()


def test_with_lora_the_reference_is_the_base_with_adapters_disabled_and_no_copy(
    pairs: tuple[Path, Path], base: Path, tmp_path: Path
) -> None:
    config = dpo_config(
        tmp_path / "run",
        pairs,
        model={"init_from": str(base)},
        max_steps=6,
        lora={"r": 4, "alpha": 8, "targets": ["qkv", "out"]},
        **{"schedule.lr": 2e-2},
    )
    before = live_models()
    trainer = Trainer(config, progress=False)
    try:
        assert live_models() - before == 1  # the trained model only: no second copy of the weights
        objective = trainer.objective
        assert isinstance(objective, DirectPreference)
        assert objective.reference is trainer.model and objective.adapters
        trainer_params = {p.data_ptr() for p in trainer.model.parameters()}
        assert trainer_params == {p.data_ptr() for p in objective.reference.parameters()}
        result = trainer.fit()
    finally:
        trainer.close()
    assert records(result.output_dir)[0]["loss"] == pytest.approx(math.log(2), abs=1e-6)  # B = 0 at first
    assert result.final["val_rewards/margins"] > 0
    model, started = result.model.eval(), zoo.load(base).eval()
    ids = torch.tensor([[1, 7, 9, 12, 30, 2], [1, 15, 8, 22, 2, 0]])
    inputs = {"input_ids": ids, "attention_mask": (ids != 0).long()}
    with torch.no_grad():
        adapted = model(**inputs).logits
        with zoo.lora.disabled(model):
            reference = model(**inputs).logits
        expected = started(**inputs).logits
    assert torch.equal(reference, expected)  # the reference is the base model
    assert not torch.allclose(adapted, expected, atol=1e-4)  # while the adapters have trained


# --- data -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"prompt": "a cat", "chosen": " sees"}', r"train.jsonl:3: no key 'rejected'"),
        (
            '{"prompt": "a cat", "chosen": ["sees"], "rejected": " eats"}',
            r"train.jsonl:3: 'chosen' must be a string",
        ),
        ('{"prompt": "a cat", "chosen": " sees", "rejected": ""}', r"train.jsonl:3: 'rejected' is empty"),
        (
            '{"prompt": [{"role": "user"}], "chosen": "a", "rejected": "b"}',
            r"train.jsonl:3: 'prompt' is a list hold",
        ),
        ('{"prompt": "a cat", "chosen": " sees", ', r"train.jsonl:3: not JSON"),
    ],
    ids=["missing", "list", "empty", "messages", "json"],
)
def test_a_bad_line_is_refused_naming_file_line_and_field_or_skipped(
    pairs: tuple[Path, Path], tmp_path: Path, line: str, message: str
) -> None:
    bad = with_bad_line(pairs[0], line, tmp_path / "train.jsonl")
    with pytest.raises(DataError, match=message):
        Trainer(dpo_config(tmp_path / "run", (bad, pairs[1])), progress=False)
    assert not (tmp_path / "run" / "model.safetensors").exists()
    result = train(
        dpo_config(tmp_path / "skip", (bad, pairs[1]), **{"data.on_bad_line": "skip"}), progress=False
    )
    assert result.step == 2


def test_a_long_pair_keeps_its_prompt_and_loses_the_end_of_its_responses(
    pairs: tuple[Path, Path], tmp_path: Path
) -> None:
    trainer = Trainer(dpo_config(tmp_path / "run", pairs, **{"data.max_length": 12}), progress=False)
    try:
        batch = trainer.collate(np.arange(8))
        ids, targets = batch.inputs["input_ids"], batch.targets
        assert ids.shape[1] <= 12
        eos = trainer.tokenizers.target.eos_id
        for row in range(16):
            real = ids[row][batch.inputs["attention_mask"][row].bool()]
            assert real[-1] == eos  # every sequence still ends
            assert (targets[row] != -100).sum() >= 1  # and scores at least its eos
        result = trainer.fit()
    finally:
        trainer.close()
    assert math.isfinite(result.final["val_loss"])


def test_a_pair_whose_prompt_fills_the_limit_is_skipped_and_counted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """With too_long: truncate both its sequences were cut to the prompt: the same sequence twice, nothing to
    prefer (a loss of log 2, no gradient, and a miss in rewards/accuracy). Skipped, as it is prepared or when a
    run's shorter limit cuts prepared data."""
    from zoo.training.corpus import prepare_corpus
    from zoo.training.data.shards import open_prepared
    from zoo.training.tasks import get_task
    from zoo.training.tasks.base import Limits, Split, Tokenizers

    tok = train_tokenizer(iter(WORDS * 3), kind="bpe", vocab_size=60, min_frequency=1)
    fits = {"prompt": "the cat", "chosen": " sleeps", "rejected": " eats a small fish"}
    fills = {"prompt": " ".join(WORDS * 2), "chosen": " runs", "rejected": " sleeps"}
    source = tmp_path / "pairs.jsonl"
    source.write_text("".join(json.dumps(row) + "\n" for row in (fills, fits, fills)))
    limit = 16  # "fits" is 13 tokens framed, "fills" its prompt alone 43
    manifest = prepare_corpus("dpo", [source], tokenizer=tok, out=tmp_path / "cut", max_length=limit).manifest
    assert manifest.num_examples == 1
    assert manifest.counts["over_max_length"] == 2 and manifest.counts["nothing_to_train"] == 2
    whole = prepare_corpus("dpo", [source], tokenizer=tok, out=tmp_path / "whole").manifest
    assert whole.num_examples == 3
    with caplog.at_level("WARNING"):
        units = get_task("dpo").units(
            Split("train", open_prepared(tmp_path / "whole")),
            tokenizers=Tokenizers(tok),
            limits=Limits(limit),
        )
    assert units.examples is not None and units.examples.tolist() == [1]
    assert "2 of them left nothing to train" in caplog.text


def test_config_refusals_name_the_field(pairs: tuple[Path, Path], tmp_path: Path) -> None:
    with pytest.raises(
        ConfigError, match=r"loss.label_smoothing \(0.5\) for dpo is a label-flip probability"
    ):
        dpo_config(tmp_path / "run", pairs, **{"loss.label_smoothing": 0.5})
    with pytest.raises(ConfigError, match=r"task\.dpo\.beta: Input should be greater than 0"):
        dpo_config(tmp_path / "run", pairs, **{"task.beta": 0})
    with pytest.raises(ConfigError, match=r"^loss\.dpo_beta=0\.2 moved: set task\.beta=0\.2$"):
        dpo_config(tmp_path / "run", pairs, **{"loss.dpo_beta": 0.2})
    with pytest.raises(ConfigError, match=r"task dpo needs a decoder model, but the model is encoder"):
        Trainer(dpo_config(tmp_path / "run", pairs, model={"preset": "bert-tiny"}), progress=False)
    with pytest.raises(
        ConfigError, match=r"data.packing is for causal_lm, masked_lm, chat and seq2seq, not dpo"
    ):
        Trainer(dpo_config(tmp_path / "run", pairs, **{"data.packing": {"block_size": 32}}), progress=False)


# --- the CLI ----------------------------------------------------------------------------------------------


def test_zoo_train_runs_dpo_from_a_yaml_file(
    pairs: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = dpo_config(tmp_path / "run", pairs, max_steps=4)
    path = tmp_path / "dpo.yaml"
    path.write_text(config.to_yaml())
    assert main(["train", str(path), "--set", "task.beta=0.2"]) == 0
    out = capsys.readouterr().out
    assert "step 4: val_loss" in out and "reward accuracy" in out and "ppl" not in out
    saved = yaml.safe_load((tmp_path / "run" / "train_config.yaml").read_text())
    assert (
        saved["task"]
        == {
            "kind": "dpo",
            "loss": "sigmoid",
            "beta": 0.2,
            "gamma": None,
            "nll_coef": 0.0,
        }
        and "dpo_beta" not in saved["loss"]
    )
    assert zoo.load(tmp_path / "run").spec.family == "decoder"


def test_a_lora_dpo_run_resumes_exactly(pairs: tuple[Path, Path], base: Path, tmp_path: Path) -> None:
    def config(name: str, steps: int) -> TrainConfig:
        return dpo_config(
            tmp_path / name,
            pairs,
            model={"init_from": str(base)},
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
        for key in ("loss", *REWARDS):
            assert got[step][key] == pytest.approx(expected[step][key], abs=1e-6), (step, key)
    assert resumed.final["val_rewards/margins"] == pytest.approx(
        straight.final["val_rewards/margins"], abs=1e-6
    )


@pytest.mark.slow
def test_two_ddp_processes_train_dpo_like_one_process_accumulating_two_batches(
    pairs: tuple[Path, Path], tmp_path: Path
) -> None:
    """The loss is divided by the pairs of the whole step, every micro-batch on every process."""
    tokenizer = tmp_path / "tok.json"
    lines = [json.loads(line) for line in pairs[0].read_text().splitlines()]
    texts = [text for r in lines for text in (r["prompt"], r["chosen"], r["rejected"])]
    train_tokenizer(iter(texts), kind="bpe", vocab_size=60, min_frequency=1).save(tokenizer)

    def config(name: str, **changes: Any) -> TrainConfig:
        fixed = {"tokenizer.path": str(tokenizer), "data.valid": None, "optim.eps": 1e-6, "max_steps": 3}
        return dpo_config(tmp_path / name, pairs, **fixed, **changes)

    single = train(config("single", **{"batch.grad_accum": 2}), progress=False)
    ddp = train_in_two_processes(config("ddp"), tmp_path / "ddp.yaml")
    assert_same_weights(single.model, ddp)
    one, two = records(single.output_dir), records(tmp_path / "ddp")
    for a, b in zip(one, two):
        for key in ("loss", *REWARDS):
            assert a[key] == pytest.approx(b[key], abs=1e-5), key
    assert one[-1]["rewards/margins"] != 0  # it trained: the comparison is not between two untouched models


def test_zoo_data_prepare_writes_the_three_sides_and_a_run_trains_on_them(
    pairs: tuple[Path, Path], tmp_path: Path
) -> None:
    lines = [json.loads(line) for line in pairs[0].read_text().splitlines()]
    texts = [text for r in lines for text in (r["prompt"], r["chosen"], r["rejected"])]
    tokenizer = tmp_path / "tok.json"
    train_tokenizer(iter(texts), kind="bpe", vocab_size=60, min_frequency=1).save(tokenizer)
    out = tmp_path / "prepared"
    assert (
        main(
            [
                "data",
                "prepare",
                "--task",
                "dpo",
                "--tokenizer",
                str(tokenizer),
                "--out",
                str(out),
                str(pairs[0]),
            ]
        )
        == 0
    )
    manifest = json.loads((out / "manifest.json").read_text())
    assert list(manifest["sides"]) == ["prompt", "chosen", "rejected"] and manifest["num_examples"] == len(
        lines
    )
    for side in manifest["sides"]:
        assert (out / f"{side}.tokens.bin").is_file() and (out / f"{side}.offsets.bin").is_file()
    config = dpo_config(
        tmp_path / "run", pairs, **{"data.train": {"prepared": str(out)}, "tokenizer.path": str(tokenizer)}
    )
    assert train(config, progress=False).step == 2
