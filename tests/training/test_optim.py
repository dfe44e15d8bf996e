"""The optimizer: decay only on matrices, the fused kernel where it runs, and the same update as torch's
reference implementation."""

from __future__ import annotations

import torch

import zoo
from zoo.training.config import OptimConfig
from zoo.training.optim import build_optimizer


def test_weight_decay_reaches_matrices_only():
    model = zoo.build("gpt2-tiny")
    optimizer = build_optimizer(model, OptimConfig(name="adamw", weight_decay=0.1))
    decay, no_decay = optimizer.param_groups
    assert decay["weight_decay"] == 0.1 and all(p.ndim >= 2 for p in decay["params"])
    assert no_decay["weight_decay"] == 0.0 and all(p.ndim == 1 for p in no_decay["params"])


def test_fused_update_equals_the_reference_implementation():
    torch.manual_seed(0)
    fused_model, reference_model = zoo.build("gpt2-tiny").eval(), zoo.build("gpt2-tiny").eval()  # no dropout
    reference_model.load_state_dict(fused_model.state_dict())
    # eps 1e-6, not the paper's 1e-9: the key bias's gradient is zero up to rounding (softmax ignores it), and
    # Adam would blow that rounding noise up to full-size steps in either implementation.
    config = OptimConfig(name="adamw", weight_decay=0.01, eps=1e-6)
    fused = build_optimizer(fused_model, config)
    assert fused.defaults["fused"] is True
    reference = torch.optim.AdamW(
        [{"params": g["params"], "weight_decay": g["weight_decay"]} for g in _groups(reference_model, 0.01)],
        lr=0.0, betas=config.betas, eps=config.eps, foreach=False,
    )  # fmt: skip
    ids = torch.randint(3, 500, (2, 12))
    for optimizer, model in ((fused, fused_model), (reference, reference_model)):
        for group in optimizer.param_groups:
            group["lr"] = 1e-3
        for _ in range(3):
            model(ids, labels=ids).loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    for (name, a), b in zip(fused_model.named_parameters(), reference_model.parameters(), strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5, msg=lambda m, name=name: f"{name}: {m}")


def _groups(model, weight_decay):
    params = [p for p in model.parameters() if p.requires_grad]
    return [
        {"params": [p for p in params if p.ndim >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
    ]
