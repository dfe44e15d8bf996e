"""Training a Mixture-of-Experts model: the loop adds ``loss.router_aux_coef`` x the model's load-balancing
loss to the objective and logs it as ``aux_loss``."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch

from zoo.training import train
from zoo.training.config import TrainConfig

MOE_MODEL = {"preset": "moe-tiny", "overrides": {"vocab_size": 100, "d_model": 32, "max_positions": 32,
                                                 "attention.num_heads": 2, "attention.num_kv_heads": 1}}  # fmt: skip


def _config(make_config: Callable[..., TrainConfig], tmp_path: Path, **overrides) -> TrainConfig:
    tmp_path.mkdir(parents=True, exist_ok=True)
    lm = tmp_path / "lm.txt"
    lm.write_text("\n".join(["the cat sees the dog", "a dog eats the fish"] * 20), encoding="utf-8")
    return make_config(
        model=MOE_MODEL, task="causal_lm", data={"train": str(lm), "valid": str(lm)},
        **{"tokenizer.vocab_size": 100, "max_steps": 2, **overrides},
    )  # fmt: skip


def test_trainer_logs_the_aux_loss_of_a_moe_model(make_config, tmp_path: Path) -> None:
    config = _config(make_config, tmp_path)
    train(config)
    records = [json.loads(line) for line in (config.output_dir / "metrics.jsonl").read_text().splitlines()]
    aux = [r["aux_loss"] for r in records if r.get("loss") is not None]
    assert len(aux) == 2 and all(1.0 <= a <= 4.0 for a in aux), records  # top_k 2 of 4: 2 when balanced


def test_the_aux_coefficient_changes_the_router_update(make_config, tmp_path: Path) -> None:
    off = train(_config(make_config, tmp_path / "a", output_dir=str(tmp_path / "a" / "run"),
                        **{"loss.router_aux_coef": 0.0, "max_steps": 1}))  # fmt: skip
    on = train(_config(make_config, tmp_path / "b", output_dir=str(tmp_path / "b" / "run"),
                       **{"loss.router_aux_coef": 0.5, "max_steps": 1}))  # fmt: skip
    a, b = off.model.state_dict(), on.model.state_dict()
    routers = [name for name in a if name.endswith("router.weight")]
    assert routers and any(not torch.equal(a[n], b[n]) for n in routers)
