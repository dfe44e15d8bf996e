"""The optimizer: Adam with the paper's settings (beta 0.9 / 0.98, eps 1e-9) or AdamW, and gradient clipping.

Weight decay, when asked for, applies to matrices (embeddings included) and never to biases or norm
weights, as in GPT-2 / nanoGPT. The learning rate is set by the loop from the schedule before each step.
"""

from __future__ import annotations

import torch
from torch import nn

from zoo.training.config import OptimConfig


def build_optimizer(model: nn.Module, config: OptimConfig) -> torch.optim.Optimizer:
    """Adam or AdamW over ``model``'s trainable parameters, in two groups: with and without decay."""
    decay: list[nn.Parameter] = []
    no_decay: list[nn.Parameter] = []
    for param in model.parameters():
        if param.requires_grad:
            (decay if param.ndim >= 2 else no_decay).append(param)
    groups = [
        {"params": decay, "weight_decay": config.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    optimizer_class = torch.optim.AdamW if config.name == "adamw" else torch.optim.Adam
    # The fused kernel (one pass per tensor) runs ~3.5x faster than the default for-each one on CPU (24 vs
    # 91 ms for 42M parameters on 2 cores) and is Hugging Face Trainer's default on CUDA and CPU alike.
    params = decay + no_decay
    fused = all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in params) or None
    # lr is a placeholder: the schedule sets it before every step.
    return optimizer_class(groups, lr=0.0, betas=config.betas, eps=config.eps, fused=fused)


def set_learning_rate(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def clip_gradients(model: nn.Module, max_norm: float | None) -> torch.Tensor:
    """Scale gradients so their global L2 norm is at most ``max_norm``; returns the norm before clipping
    (a tensor on the device: reading it would wait for the GPU)."""
    params = [p for p in model.parameters() if p.grad is not None]
    if not params:
        return torch.zeros(())
    # With no limit, an infinite one still measures the norm (the clip factor is clamped to exactly 1).
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm is not None else float("inf"))
    if hasattr(norm, "full_tensor"):  # FSDP2: a DTensor holding the norm over every shard
        norm = norm.full_tensor()
    return norm
