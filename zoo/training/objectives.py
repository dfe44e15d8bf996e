"""What a task trains on: an `Objective` turns a model and a collated `Batch` into a summed loss.

The loop and validation call the task's objective (`zoo.training.tasks.base.Task.objective`) and never ask
which task it is:

    batch = objective.rollout(batch, device=...)        # an online objective's samples (GRPO); else as is
    count = objective.count(batch)                      # on the host, before any forward: what the loss sums
    sums = objective(model, batch, device=..., autocast=..., train=True)
    (sums.loss * world_size / step_count).backward()    # step_count: every micro-batch on every process

``count`` is what the summed loss is normalised by: target tokens for the token-level tasks, preference
pairs for DPO. The loop divides by the whole optimizer step's count (every micro-batch, every process), so
gradient accumulation and data parallelism give the gradient of one big batch whatever the unit.
``sums.metrics`` are further sums over the same units (DPO's rewards) that the records report as means.

`TokenCrossEntropy` is every token-level task's objective (translation, language modelling,
classification): label-smoothed cross-entropy in training, the plain NLL in validation (so ``val_ppl`` is a
true perplexity). DPO's is `zoo.training.tasks.dpo.DirectPreference`. Given ``chunk_tokens`` (a decoder's
task: ``loss.chunk_tokens``), the model computes the loss through its LM head a chunk of tokens at a time
(`zoo.losses.chunked`) and returns no logits: the same loss and gradients, never every logit at once. A
batch that fits one chunk is computed whole (`chunks`).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from zoo.losses import IGNORE_INDEX, label_smoothed_cross_entropy
from zoo.losses.chunked import ChunkedLoss
from zoo.training.batching import Batch


@dataclass
class ObjectiveSums:
    """One micro-batch's objective, summed over its units (on the device: nothing here syncs the host)."""

    loss: (
        torch.Tensor
    )  # scalar: the objective summed over the batch's units (train), or its plain form (eval)
    aux_loss: torch.Tensor | None = None  # a Mixture-of-Experts model's load-balancing loss, or None
    metrics: dict[str, torch.Tensor] = field(default_factory=dict)  # name -> sum over the units
    logits: torch.Tensor | None = None  # what a validation `ScoreAccumulator` reads: (N, V) or (B, L)
    targets: torch.Tensor | None = None  # aligned with ``logits``


def chunks(chunk_tokens: int | None, targets: torch.Tensor) -> bool:
    """Whether a batch scoring ``targets`` (N,) computes its loss through the LM head in chunks of
    ``chunk_tokens``: only when they are more than one chunk. One chunk would hold every logit anyway, so it
    saves nothing and costs the chunked loss's extra matmul through the head; the plain loss is used."""
    return chunk_tokens is not None and targets.shape[0] > chunk_tokens


class Objective(ABC):
    """The loss a task trains with, and what validation reports of it."""

    unit: str = "target token"  # what `count` counts, for run.json
    loss_name: str = ""  # names both losses in run.json and plots when they are not token NLL ("DPO")
    description: str = ""  # the training loss, for run.json (`zoo.training.report.records.write_run_info`)
    validation_description: str = ""

    def rollout(self, batch: Batch, *, device: torch.device) -> Batch:
        """The batch this objective trains on, made from the collated one before `count`: the batch itself,
        except for an online objective, which samples from the model being trained here (GRPO's
        completions, scored by its rewards); run once per batch, outside the forward's autograd."""
        return batch

    @abstractmethod
    def count(self, batch: Batch) -> int:
        """How many units ``batch``'s summed loss covers (read on the host, before the forward)."""

    @abstractmethod
    def __call__(
        self,
        model: nn.Module,
        batch: Batch,
        *,
        device: torch.device,
        autocast: AbstractContextManager | None = None,
        train: bool = True,
    ) -> ObjectiveSums:
        """The summed objective of ``batch`` (on the host, moved to ``device`` here) under ``model``;
        ``train``: the training loss (else the validation one, run under ``torch.no_grad`` by the caller)."""

    def summary(self, loss: float, count: int, metrics: Mapping[str, float]) -> dict[str, Any]:
        """A validation record's values from the sums over a whole split: ``val_loss`` (per unit), and
        ``val_``-prefixed means of the metrics."""
        per = max(count, 1)
        return {"val_loss": loss / per, **{f"val_{name}": value / per for name, value in metrics.items()}}


class TokenCrossEntropy(Objective):
    """Cross-entropy over the scored target tokens (-100 = not scored), label-smoothed in training
    (`zoo.losses.label_smoothed_cross_entropy`); the output head runs only at the scored positions.
    ``chunk_tokens``: through a decoder's LM head, that many tokens at a time (`zoo.losses.chunked`; the
    model is given ``chunked_loss`` and returns each token's loss, no logits) when a batch scores more
    tokens than that (`chunks`); None: all logits at once."""

    def __init__(self, *, label_smoothing: float = 0.0, chunk_tokens: int | None = None) -> None:
        self.label_smoothing = label_smoothing
        self.chunk_tokens = chunk_tokens
        smoothing = f"label smoothing {label_smoothing:g}" if label_smoothing else "no label smoothing"
        self.description = f"training objective per target token: cross-entropy with {smoothing}"
        self.validation_description = (
            "validation negative log-likelihood per target token (no label smoothing)"
        )

    def count(self, batch: Batch) -> int:
        return int((batch.targets != IGNORE_INDEX).sum())

    def __call__(
        self,
        model: nn.Module,
        batch: Batch,
        *,
        device: torch.device,
        autocast: AbstractContextManager | None = None,
        train: bool = True,
    ) -> ObjectiveSums:
        # The head runs only where a target is (skipping padding, and MLM's ~85% unscored positions).
        scored = batch.logits_mask()  # (B, T), on the CPU: selecting needs no device sync; or None
        targets = batch.scored_targets(scored).to(device, non_blocking=True)  # (N,)
        batch = batch.to(device)
        eps = self.label_smoothing if train else 0.0
        if chunks(self.chunk_tokens, targets):
            assert self.chunk_tokens is not None
            chunked = ChunkedLoss(targets, chunk_tokens=self.chunk_tokens, label_smoothing=eps)
            with autocast or nullcontext():
                out = model(**batch.inputs, logits_mask=scored, chunked_loss=chunked)
            assert out.token_losses is not None  # (N,): a decoder given chunked_loss
            return ObjectiveSums(
                loss=out.token_losses.sum(), aux_loss=out.aux_loss if train else None, targets=targets
            )
        with autocast or nullcontext():
            out = model(**batch.inputs, logits_mask=scored)
        logits = out.logits  # (N, V) or (B, L)
        sums = label_smoothed_cross_entropy(logits, targets, label_smoothing=eps)
        return ObjectiveSums(
            loss=sums.loss if train else sums.nll,
            aux_loss=out.aux_loss if train else None,
            logits=logits,
            targets=targets,
        )

    def summary(self, loss: float, count: int, metrics: Mapping[str, float]) -> dict[str, Any]:
        mean = loss / max(count, 1)
        # capped: an untrained model's ppl is huge, never inf
        return {"val_loss": mean, "val_ppl": math.exp(min(mean, 100.0))}
