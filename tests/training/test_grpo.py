"""Online RL from rewards (``task: grpo``): the loss and its gradients against TRL's formula written here in
plain torch (every loss_type, with and without the KL penalty), the clip on a ratio away from 1, rewards and
their weights, LoRA's reference (the base, adapters disabled) with an exact resume, settings and bad lines
refused by name, and two gloo processes stepping like one."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from tests.training.tuning_support import (
    WORDS,
    assert_same_weights,
    records,
    train_base,
    train_in_two_processes,
    tuning_config,
    with_bad_line,
)
from zoo.generation.chat import end_of_turn_ids
from zoo.io.tokenizer import train_tokenizer
from zoo.losses.grpo import group_advantages, grpo_token_losses
from zoo.training import TrainConfig, Trainer, train
from zoo.training.config import ConfigError
from zoo.training.data import DataError
from zoo.training.tasks.grpo import GroupRelative, PromptBatch, RolloutBatch

HERE = Path(__file__).parent
REWARDS = [f"{HERE / 'grpo_rewards.py'}:short", f"{HERE / 'grpo_rewards.py'}:says"]


def write_prompts(path: Path, seed: int, count: int = 40) -> Path:
    """Half the prompts plain text, half chat messages; a ``word`` column the `says` reward reads."""
    rng = random.Random(seed)
    rows = []
    for k in range(count):
        words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 5)))
        prompt: Any = words if k % 2 else [{"role": "user", "content": words}]
        rows.append({"prompt": prompt, "word": "none" if k % 7 == 0 else rng.choice(WORDS)})
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.fixture(scope="module")
def prompts(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("prompts")
    return write_prompts(folder / "train.jsonl", 0), write_prompts(folder / "valid.jsonl", 1, count=12)


def grpo_config(output_dir: Path, prompts: tuple[Path, Path], **overrides: Any) -> TrainConfig:
    task = {"kind": "grpo", "rewards": REWARDS, "reward_weights": [0.2, 1.0], "group_size": 4,
            "max_new_tokens": 6, "beta": 0.05, **overrides.pop("task", {})}  # fmt: skip
    batch = {"max_tokens": 1024, "max_sentences": 3}
    return tuning_config(output_dir, prompts, task=task, batch=batch, **overrides)


# --- the loss ---------------------------------------------------------------------------------------------


def completion_log_probs(
    model: torch.nn.Module, prompt: list[int], completion: list[int], T: float
) -> torch.Tensor:
    """(L,) log p(completion token | everything before it) of one unpadded sequence, logits / T (TRL's)."""
    ids = torch.tensor([prompt + completion])
    logits = model(ids).logits[0, len(prompt) - 1 : -1].double() / T  # (L, V)
    return F.log_softmax(logits, dim=-1).gather(1, torch.tensor(completion)[:, None]).squeeze(1)


def trl_loss(
    policy: torch.nn.Module,
    reference: torch.nn.Module | None,
    pairs: list[tuple[list[int], list[int]]],
    rewards: torch.Tensor,
    *,
    group_size: int,
    beta: float,
    epsilon: float,
    loss_type: str,
    max_completion_length: int,
    temperature: float,
) -> torch.Tensor:
    """TRL GRPOTrainer's loss (``_compute_loss``, num_iterations 1, one process) written out: completions
    right-padded to (B, L) with a completion mask, advantages from the group's mean and std + 1e-4."""
    B, L = len(pairs), max(len(c) for _, c in pairs)
    mask = torch.zeros(B, L, dtype=torch.float64)
    per_token_logps = torch.zeros(B, L, dtype=torch.float64)
    ref_per_token_logps = torch.zeros(B, L, dtype=torch.float64)
    for i, (prompt, completion) in enumerate(pairs):
        n = len(completion)
        mask[i, :n] = 1
        per_token_logps[i, :n] = completion_log_probs(policy, prompt, completion, temperature)
        if reference is not None:
            with torch.no_grad():
                ref_per_token_logps[i, :n] = completion_log_probs(reference, prompt, completion, temperature)
    rewards = rewards.double()
    mean_grouped = rewards.view(-1, group_size).mean(dim=1).repeat_interleave(group_size)
    std_grouped = rewards.view(-1, group_size).std(dim=1).repeat_interleave(group_size)
    advantages = (rewards - mean_grouped) / (std_grouped + 1e-4)
    old_per_token_logps = per_token_logps.detach()
    coef_1 = torch.exp(per_token_logps - old_per_token_logps)
    coef_2 = torch.clamp(coef_1, 1 - epsilon, 1 + epsilon)
    per_token_loss = -torch.min(coef_1 * advantages.unsqueeze(1), coef_2 * advantages.unsqueeze(1))
    if beta != 0.0:
        per_token_kl = (
            torch.exp(ref_per_token_logps - per_token_logps) - (ref_per_token_logps - per_token_logps) - 1
        )
        per_token_loss = per_token_loss + beta * per_token_kl
    if loss_type == "grpo":
        return ((per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    if loss_type == "bnpo":
        return (per_token_loss * mask).sum() / mask.sum().clamp(min=1.0)
    if loss_type == "dr_grpo":
        return (per_token_loss * mask).sum() / (B * max_completion_length)
    assert loss_type == "dapo"  # num_items_in_batch: the completion tokens of the (one-batch) step
    return (per_token_loss * mask).sum() / mask.sum()


@pytest.mark.parametrize("loss_type", ["dapo", "grpo", "dr_grpo", "bnpo"])
@pytest.mark.parametrize("beta", [0.0, 0.05])
def test_loss_and_gradients_equal_trls_formula_in_plain_torch(
    prompts: tuple[Path, Path], tmp_path: Path, loss_type: str, beta: float
) -> None:
    settings = {"loss_type": loss_type, "beta": beta, "temperature": 0.9, "group_size": 4}
    trainer = Trainer(grpo_config(tmp_path / "run", prompts, task=settings), progress=False)
    try:
        policy, objective = trainer.model, trainer.objective
        assert isinstance(objective, GroupRelative)
        assert (objective.reference is not None) == (beta > 0)
        with torch.no_grad():  # the policy moves away from the reference: the KL term is not 0
            generator = torch.Generator().manual_seed(0)
            for p in policy.parameters():
                p.add_(torch.randn(p.shape, generator=generator, dtype=p.dtype) * 0.05)
        prompt_batch = trainer.collate(np.array([0, 3, 5]), generator=torch.Generator().manual_seed(7))
        assert isinstance(prompt_batch, PromptBatch)
        batch = objective.rollout(prompt_batch, device=torch.device("cpu"))
        assert isinstance(batch, RolloutBatch) and batch.targets.shape[0] == 12
        policy.zero_grad()
        sums = objective(policy, batch, device=torch.device("cpu"), train=True)
        (sums.loss / objective.count(batch)).backward()
        ours = {n: p.grad.clone() for n, p in policy.named_parameters() if p.grad is not None}

        # The rollout's rows, read back: prompt + completion (the end token included) per row.
        pairs = []
        for ids, mask, targets in zip(
            batch.inputs["input_ids"], batch.inputs["attention_mask"], batch.targets
        ):
            scored = (targets != -100).nonzero()[:, 0]
            start, stop = int(scored[0]) + 1, int(mask.sum())
            pairs.append((ids[:start].tolist(), ids[start:stop].tolist()))
        assert all(len(c) >= 1 for _, c in pairs)
        assert [p for p, _ in pairs[:4]] == [pairs[0][0]] * 4  # a prompt's group is consecutive
        # The rewards from the reward functions, called here on the completions' text.
        tok = trainer.tokenizers.target
        rows = [json.loads(line) for line in prompts[0].read_text().splitlines()]
        picked = [rows[i] for i in (0, 3, 5) for _ in range(4)]
        ends = {tok.eos_id, *end_of_turn_ids(tok)}
        texts = [tok.decode([t for t in c if t not in ends]) for _, c in pairs]
        short = [-float(len(t.split())) for t in texts]
        says = [None if r["word"] == "none" else float(r["word"] in t.split()) for r, t in zip(picked, texts)]
        rewards = torch.tensor([0.2 * s + (1.0 * w if w is not None else 0.0) for s, w in zip(short, says)])

        reference = objective.reference
        policy.zero_grad()
        expected = trl_loss(
            policy,
            reference,
            pairs,
            rewards,
            group_size=4,
            beta=beta,
            epsilon=0.2,
            loss_type=loss_type,
            max_completion_length=6,
            temperature=0.9,
        )
        expected.backward()
        got, want = float(sums.loss.detach()) / objective.count(batch), float(expected.detach())
        assert abs(got - want) < 1e-6, (got, want)
        theirs = {n: p.grad for n, p in policy.named_parameters() if p.grad is not None}
        assert set(ours) == set(theirs) and ours
        worst = max(float((ours[n] - theirs[n]).abs().max()) for n in ours)
        assert worst < 1e-6, worst
        assert abs(float(rewards.std())) > 0  # the rewards differ: the advantages are not all 0
        if beta:
            assert float(sums.metrics["kl"]) > 0
    finally:
        trainer.close()


def test_the_clip_binds_as_trls_when_the_ratio_leaves_its_range() -> None:
    """With a policy that moved since sampling (TRL's num_iterations > 1), tokens whose ratio leaves
    [1 - eps, 1 + eps] on their advantage's side lose their gradient, as TRL's min/clamp says."""
    generator = torch.Generator().manual_seed(0)
    new = torch.randn(10, dtype=torch.float64, generator=generator).requires_grad_()
    old = new.detach() + torch.randn(10, dtype=torch.float64, generator=generator) * 0.5
    ref = new.detach() + torch.randn(10, dtype=torch.float64, generator=generator) * 0.3
    advantages = torch.tensor([1.0, -1.0] * 5, dtype=torch.float64)
    terms = grpo_token_losses(new, old, advantages, epsilon_low=0.2, epsilon_high=0.28, reference_log_probs=ref,
                              beta=0.1)  # fmt: skip
    coef_1 = torch.exp(new - old)
    coef_2 = torch.clamp(coef_1, 1 - 0.2, 1 + 0.28)
    kl = torch.exp(ref - new) - (ref - new) - 1
    expected = -torch.min(coef_1 * advantages, coef_2 * advantages) + 0.1 * kl
    assert torch.allclose(terms.losses, expected, atol=1e-12)
    assert terms.clipped.any() and not terms.clipped.all()
    (grad,) = torch.autograd.grad(terms.losses.sum() - 0.1 * kl.sum(), new)
    assert bool((grad[terms.clipped] == 0).all())


def test_advantages_are_normalised_within_each_group() -> None:
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 2.0])
    got = group_advantages(rewards, 4)
    assert torch.allclose(got[:4], torch.tensor([1.0, -1.0, -1.0, 1.0]) * 0.5 / (0.5773502691896258 + 1e-4))
    assert torch.equal(got[4:], torch.zeros(4))  # a group that agrees teaches nothing
    assert torch.allclose(
        group_advantages(rewards, 4, scale="none")[:4], torch.tensor([0.5, -0.5, -0.5, 0.5])
    )


# --- runs -------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny causal LM trained for 2 steps on the prompts' words (a model folder to start from)."""
    text = " ".join(WORDS) + "\n" + "user: assistant: the cat\n" * 5
    return train_base(tmp_path_factory.mktemp("base"), text, steps=2)


def test_a_lora_run_uses_the_base_as_reference_and_resumes_exactly(
    prompts: tuple[Path, Path], base: Path, tmp_path: Path
) -> None:
    def config(name: str, steps: int) -> TrainConfig:
        return grpo_config(
            tmp_path / name,
            prompts,
            model={"init_from": str(base)},
            max_steps=steps,
            lora={"r": 4, "alpha": 8, "targets": ["qkv", "out"]},
            **{"schedule.lr": 2e-2, "checkpoint.every_steps": 2},
        )

    trainer = Trainer(config("probe", 1), progress=False)
    try:
        objective = trainer.objective
        assert isinstance(objective, GroupRelative)
        assert objective.reference is trainer.model and objective.adapters  # no copy of the weights
    finally:
        trainer.close()
    straight = train(config("straight", 4), progress=False)
    train(config("split", 2), progress=False)
    resumed = train(config("split", 4), progress=False, resume=True)
    expected = {r["step"]: r for r in records(straight.output_dir) if r["loss"] is not None}
    got = {r["step"]: r for r in records(resumed.output_dir) if r["loss"] is not None}
    assert sorted(got) == [1, 2, 3, 4]
    for step in (3, 4):
        for key in ("loss", "kl", "reward", "rewards/short", "rewards/says", "completion_length"):
            assert got[step][key] == pytest.approx(expected[step][key], abs=1e-6), (step, key)
    assert expected[4]["kl"] > 0  # the adapters moved the policy away from the base


def test_rewards_and_their_weights_are_logged_per_function(
    prompts: tuple[Path, Path], tmp_path: Path
) -> None:
    result = train(grpo_config(tmp_path / "run", prompts, **{"eval.every_steps": 2}), progress=False)
    logged = [r for r in records(result.output_dir) if r["loss"] is not None]
    for r in logged:
        assert r["reward"] == pytest.approx(0.2 * r["rewards/short"] + r["rewards/says"], abs=0.6)
        assert 1 <= r["completion_length"] <= 6 and r["clip_ratio"] == 0.0
    assert result.final["val_reward"] is not None and result.final["val_ppl"] is None
    run = json.loads((result.output_dir / "run.json").read_text())
    assert (
        run["task"] == "grpo" and "GRPO's clipped surrogate" in run["loss"] and "0.2 x short" in run["loss"]
    )


@pytest.mark.parametrize(
    ("task", "message"),
    [
        (
            {"reward_weights": [1.0]},
            r"task.reward_weights \(1\) needs one weight per task.rewards entry \(2\)",
        ),
        ({"rewards": ["rewards.py"], "reward_weights": None}, r'task.rewards: .* must be "file.py:function"'),
        (
            {"rewards": ["no/such/file.py:f"], "reward_weights": None},
            r"task.rewards: no/such/file.py:f: no file",
        ),
        (
            {"rewards": [f"{HERE / 'grpo_rewards.py'}:nothing"], "reward_weights": None},
            r"has no function nothing",
        ),
        ({"rewards": [], "reward_weights": None}, r"task.rewards: grpo needs at least one reward function"),
    ],
    ids=["weights", "form", "file", "function", "none"],
)
def test_reward_settings_are_refused_by_name(
    prompts: tuple[Path, Path], tmp_path: Path, task: dict[str, Any], message: str
) -> None:
    with pytest.raises((ConfigError, ValueError), match=message):
        trainer = Trainer(grpo_config(tmp_path / "run", prompts, task=task), progress=False)
        trainer.close()


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"question": "a cat"}', r'train.jsonl:3: expected a JSON object with a "prompt"'),
        (
            '{"prompt": [{"role": "robot", "content": "hi"}]}',
            r"train.jsonl:3: prompt\[0\].role must be one of",
        ),
        ('{"prompt": 3}', r"train.jsonl:3: 'prompt' must be a string or a non-empty list"),
    ],
    ids=["missing", "role", "type"],
)
def test_a_bad_line_is_refused_naming_file_and_line(
    prompts: tuple[Path, Path], tmp_path: Path, line: str, message: str
) -> None:
    bad = with_bad_line(prompts[0], line, tmp_path / "train.jsonl")
    with pytest.raises(DataError, match=message):
        Trainer(grpo_config(tmp_path / "run", (bad, prompts[1])), progress=False)


@pytest.mark.slow
def test_two_gloo_processes_step_like_one_with_the_same_global_batch(
    prompts: tuple[Path, Path], tmp_path: Path
) -> None:
    """Each process samples its own batches' completions (seeded by the batch, not the process) and the
    dapo loss is divided by the step's completion tokens over both: 2 x 1 batch == 1 x 2 accumulated."""
    tokenizer = tmp_path / "tok.json"
    train_tokenizer([prompts[0]], kind="bpe", vocab_size=80).save(tokenizer)
    fixed = {"tokenizer.path": str(tokenizer), "data.valid": None, "optim.eps": 1e-6, "max_steps": 2}
    single = train(
        grpo_config(tmp_path / "single", prompts, **fixed, **{"batch.grad_accum": 2}), progress=False
    )
    ddp = train_in_two_processes(grpo_config(tmp_path / "ddp", prompts, **fixed), tmp_path / "ddp.yaml")
    assert_same_weights(single.model, ddp)
    expected = {r["step"]: r for r in records(tmp_path / "single") if r["loss"] is not None}
    got = {r["step"]: r for r in records(tmp_path / "ddp") if r["loss"] is not None}
    for step in (1, 2):
        assert got[step]["loss"] == pytest.approx(expected[step]["loss"], abs=1e-5)
        assert expected[step]["reward_std"] > 0  # the advantages are not all 0: the weights moved
