"""The dpo task's other losses (``task: {kind: dpo, loss: ipo | hinge | simpo | orpo}``): each loss and its
gradients against the paper's formula written here in plain torch, a short run that lowers it, no reference
built for simpo and orpo, exact resume, and the settings refused by name."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from tests.training.test_dpo import dpo_config, write_pairs
from tests.training.tuning_support import live_models, records
from zoo.training import TrainConfig, Trainer, train
from zoo.training.config import ConfigError
from zoo.training.tasks.dpo import DirectPreference


@pytest.fixture(scope="module")
def pairs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("pairs")
    return write_pairs(folder / "train.jsonl", 0), write_pairs(folder / "valid.jsonl", 1, count=40)


def log_prob(model: torch.nn.Module, prompt: list[int], response: list[int]) -> torch.Tensor:
    """log p(response | prompt), summed over its tokens, of one unpadded sequence (with the graph)."""
    ids = torch.tensor([prompt + response])
    logp = F.log_softmax(model(ids).logits[0].double(), dim=-1)  # (L, V)
    positions = torch.arange(len(prompt), len(ids[0]))
    return logp[positions - 1, ids[0, positions]].sum()


def paper_loss(
    loss: str, pc: Any, pr: Any, rc: Any, rr: Any, nc: int, nr: int, beta: float, gamma: float, eps: float
) -> Any:
    """One pair's loss by each paper's formula (TRL's definitions), from summed log-probabilities p* (policy)
    and r* (reference) of the chosen / rejected responses of nc / nr tokens."""
    if loss == "sigmoid":  # Rafailov et al. eq. 7; cDPO with eps
        h = (pc - rc) - (pr - rr)
        return -(1 - eps) * F.logsigmoid(beta * h) - eps * F.logsigmoid(-beta * h)
    if loss == "ipo":  # Azar et al. eq. 17, on mean token log-ratios (TRL)
        h = (pc / nc - rc / nc) - (pr / nr - rr / nr)
        return (h - 1 / (2 * beta)) ** 2
    if loss == "hinge":  # SLiC's hinge on the DPO log-ratio
        h = (pc - rc) - (pr - rr)
        return torch.clamp(1 - beta * h, min=0)
    if loss == "simpo":  # Meng et al. eq. 6: length-normalised, a margin, no reference
        z = beta / nc * pc - beta / nr * pr - gamma
        return -(1 - eps) * torch.log(torch.sigmoid(z)) - eps * torch.log(torch.sigmoid(-z))
    assert loss == "orpo"  # Hong et al. eq. 6-7: L_SFT + lambda L_OR, odds of the mean token probability
    a_w, a_l = pc / nc, pr / nr
    odds_w = torch.exp(a_w) / (1 - torch.exp(a_w))
    odds_l = torch.exp(a_l) / (1 - torch.exp(a_l))
    return -a_w - beta * torch.log(torch.sigmoid(torch.log(odds_w / odds_l)))


CASES = {
    "sigmoid": {"task.beta": 0.5},
    "cdpo": {"task.beta": 0.5, "loss.label_smoothing": 0.2},
    "ipo": {"task.loss": "ipo", "task.beta": 0.5},
    "hinge": {"task.loss": "hinge", "task.beta": 0.5},
    "simpo": {"task.loss": "simpo", "task.beta": 2.0, "task.gamma": 0.7},
    "simpo_smoothed": {"task.loss": "simpo", "task.beta": 2.0, "loss.label_smoothing": 0.1},
    "orpo": {"task.loss": "orpo", "task.beta": 0.3},
}


@pytest.mark.parametrize("case", list(CASES))
def test_loss_and_gradients_equal_the_papers_formula_in_plain_torch(
    pairs: tuple[Path, Path], tmp_path: Path, case: str
) -> None:
    overrides = CASES[case]
    loss = str(overrides.get("task.loss", "sigmoid"))
    beta, eps = float(overrides["task.beta"]), float(overrides.get("loss.label_smoothing", 0.0))
    gamma = float(overrides.get("task.gamma", 0.5))
    before = live_models()
    trainer = Trainer(dpo_config(tmp_path / "run", pairs, **overrides), progress=False)
    try:
        objective = trainer.objective
        assert isinstance(objective, DirectPreference) and objective.loss == loss
        free = loss in ("simpo", "orpo")
        assert (objective.reference is None) == free
        assert live_models() - before == (1 if free else 2)  # no reference built when none is read
        policy = trainer.model.double()
        reference = None if free else objective.reference.double()  # type: ignore[union-attr]
        with torch.no_grad():  # a policy that has moved away from the reference
            generator = torch.Generator().manual_seed(0)
            for p in policy.parameters():
                p.add_(torch.randn(p.shape, generator=generator, dtype=p.dtype) * 0.05)
        examples = np.array([0, 3, 5, 6])
        batch = trainer.collate(examples)
        policy.zero_grad()
        sums = objective(policy, batch, device=torch.device("cpu"), train=True)
        sums.loss.backward()
        ours = {name: p.grad.clone() for name, p in policy.named_parameters() if p.grad is not None}

        tok = trainer.tokenizers.target
        rows = [json.loads(line) for line in pairs[0].read_text().splitlines()]
        bos, eos = tok.bos_id, tok.eos_id
        assert bos is not None and eos is not None
        policy.zero_grad()
        expected = torch.zeros((), dtype=torch.float64)
        for i in examples.tolist():
            prompt = [bos, *tok.encode_ids([rows[i]["prompt"]])[0]]
            chosen = [*tok.encode_ids([rows[i]["chosen"]])[0], eos]
            rejected = [*tok.encode_ids([rows[i]["rejected"]])[0], eos]
            pc, pr = log_prob(policy, prompt, chosen), log_prob(policy, prompt, rejected)
            if reference is None:
                rc = rr = torch.zeros((), dtype=torch.float64)
            else:
                with torch.no_grad():
                    rc, rr = log_prob(reference, prompt, chosen), log_prob(reference, prompt, rejected)
            nc, nr = len(chosen), len(rejected)
            expected = expected + paper_loss(loss, pc, pr, rc, rr, nc, nr, beta, gamma, eps)
        expected.backward()
        got, want = float(sums.loss.detach()), float(expected.detach())
        assert abs(got - want) < 1e-6, (got, want)
        theirs = {name: p.grad for name, p in policy.named_parameters() if p.grad is not None}
        assert set(ours) == set(theirs) and ours
        worst = max(float((ours[name] - theirs[name]).abs().max()) for name in ours)
        assert worst < 1e-6, worst
        assert got > 0 and any(float(g.abs().max()) > 1e-4 for g in ours.values())
        for name in ("rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracy"):
            assert name in sums.metrics
        if loss == "orpo":
            assert {"nll/chosen", "log_odds_ratio"} <= set(sums.metrics)
    finally:
        trainer.close()


@pytest.mark.parametrize(
    "overrides",
    [
        {"task.loss": "ipo", "task.beta": 0.5},
        {"task.loss": "hinge", "task.beta": 0.5},
        {"task.loss": "simpo", "task.beta": 2.0},
        {"task.loss": "orpo", "task.beta": 0.5},
    ],
    ids=["ipo", "hinge", "simpo", "orpo"],
)
def test_a_short_run_lowers_the_loss(pairs: tuple[Path, Path], tmp_path: Path, overrides: dict) -> None:
    config = dpo_config(tmp_path / "run", pairs, max_steps=16, log_every=1, **overrides)
    result = train(config, progress=False)
    logged = [r["loss"] for r in records(result.output_dir) if r["loss"] is not None]
    first, last = sum(logged[:3]) / 3, sum(logged[-3:]) / 3
    assert last < 0.8 * first, logged
    margins = [r["rewards/margins"] for r in records(result.output_dir) if r["loss"] is not None]
    assert margins[-1] > margins[0]  # the shorter answers come to be preferred
    run = json.loads((result.output_dir / "run.json").read_text())
    assert (
        run["loss_name"]
        == {"ipo": "IPO", "hinge": "hinge", "simpo": "SimPO", "orpo": "ORPO"}[overrides["task.loss"]]
    )


@pytest.mark.parametrize("loss", ["simpo", "ipo"])
def test_a_run_resumes_exactly(pairs: tuple[Path, Path], tmp_path: Path, loss: str) -> None:
    def config(name: str, steps: int) -> TrainConfig:
        return dpo_config(
            tmp_path / name,
            pairs,
            max_steps=steps,
            **{"task.loss": loss, "schedule.lr": 1e-2, "checkpoint.every_steps": 2},
        )

    straight = train(config("straight", 4), progress=False)
    train(config("split", 2), progress=False)
    resumed = train(config("split", 4), progress=False, resume=True)
    expected = {r["step"]: r for r in records(straight.output_dir) if r["loss"] is not None}
    got = {r["step"]: r for r in records(resumed.output_dir) if r["loss"] is not None}
    assert sorted(got) == [1, 2, 3, 4]
    for step in (3, 4):
        for key in ("loss", "rewards/margins", "rewards/accuracy"):
            assert got[step][key] == pytest.approx(expected[step][key], abs=1e-6), (step, key)
    for (name, x), (_, y) in zip(
        straight.model.state_dict().items(), resumed.model.state_dict().items(), strict=True
    ):
        assert torch.equal(x, y), name


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"task.gamma": 1.0}, r"task\.gamma is SimPO's margin: only for loss simpo, not sigmoid"),
        (
            {"task.loss": "ipo", "task.gamma": 1.0},
            r"task\.gamma is SimPO's margin: only for loss simpo, not ipo",
        ),
        ({"task.loss": "orpo", "task.nll_coef": 0.5}, r"task\.nll_coef is not for loss orpo"),
        (
            {"task.loss": "hinge", "loss.label_smoothing": 0.1},
            r"loss\.label_smoothing \(0\.1\) is for dpo losses sigmoid and simpo, not hinge",
        ),
        (
            {"task.loss": "kto"},
            r"task\.dpo\.loss: Input should be 'sigmoid', 'ipo', 'hinge', 'simpo' or 'orpo'",
        ),
        (
            {"task.loss": "simpo", "task.gamma": -1.0},
            r"task\.dpo\.gamma: Input should be greater than or equal",
        ),
    ],
    ids=["gamma-sigmoid", "gamma-ipo", "nll-orpo", "smoothing-hinge", "unknown", "negative-gamma"],
)
def test_settings_of_another_loss_are_refused_by_name(
    pairs: tuple[Path, Path], tmp_path: Path, overrides: dict, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        dpo_config(tmp_path / "run", pairs, **overrides)
