"""The optimizer: Adam with the paper's settings (beta 0.9 / 0.98, eps 1e-9) or AdamW, and gradient clipping.

``adamw8bit`` / ``adamw4bit`` are torchao's AdamW8bit / AdamW4bit (Dettmers et al. 2021, arXiv:2110.02861;
Li et al. 2023, arXiv:2309.01507): both moments block-quantised, about 2 / 1 bytes per trained parameter
against fp32 Adam's 8 (a tensor under 4,096 elements keeps fp32 moments, as torchao decides). Their step is
torch.compile'd per parameter shape (the first step compiles). torchao keeps the learning rate as a tensor,
filled in place by `set_learning_rate`; the checkpoint saves the quantised moments' own parts
(`zoo.training.run.checkpoints`), so a resume continues bit for bit.

Weight decay, when asked for, applies to matrices (embeddings included) and never to biases or norm
weights, as in GPT-2 / nanoGPT. The learning rate is set by the loop from the schedule before each step.
"""

from __future__ import annotations

import torch
from torch import nn

from zoo._extras import install_hint
from zoo.quant.library import TorchaoMissingError, import_torchao
from zoo.training.config import ConfigError, OptimConfig

LOW_BIT = {"adamw8bit": "AdamW8bit", "adamw4bit": "AdamW4bit"}  # optim.name -> torchao.optim class


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
    if config.name in LOW_BIT:
        try:
            low_bit = getattr(import_torchao("torchao.optim"), LOW_BIT[config.name])
        except TorchaoMissingError:
            raise ConfigError(f"optim.name {config.name} needs torchao: {install_hint('quant')}") from None
        return low_bit(groups, lr=0.0, betas=config.betas, eps=config.eps)
    optimizer_class = torch.optim.AdamW if config.name == "adamw" else torch.optim.Adam
    # The fused kernel (one pass per tensor) runs ~3.5x faster than the default for-each one on CPU (24 vs
    # 91 ms for 42M parameters on 2 cores) and is Hugging Face Trainer's default on CUDA and CPU alike.
    params = decay + no_decay
    fused = all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in params) or None
    # lr is a placeholder: the schedule sets it before every step.
    return optimizer_class(groups, lr=0.0, betas=config.betas, eps=config.eps, fused=fused)


def set_learning_rate(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Every group's learning rate; kept a tensor (filled in place) where the optimizer holds it as one,
    as torchao's low-bit ones do (their compiled step takes it as an input, not a constant)."""
    tensor_lr = type(optimizer).__module__.startswith("torchao.")
    for group in optimizer.param_groups:
        if isinstance(group["lr"], torch.Tensor):
            group["lr"].fill_(lr)
        else:
            group["lr"] = torch.tensor(lr, dtype=torch.float32) if tensor_lr else lr


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
