"""Validation: the task's objective over a split (plus any per-task scores), and BLEU of greedy (or beam)
translations.

For the token-level tasks the validation loss is the plain negative log-likelihood per target token (no
label smoothing), so ``val_ppl = exp(val_loss)`` is a true perplexity; DPO reports its loss per pair and its
rewards (`zoo.training.objectives`). Translation goes through ``model.generate``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import nn

from zoo.io.tokenizer import Tokenizer
from zoo.io.tokenizer.lengths import char_budget, cut_before_encoding
from zoo.training.batching import Batch
from zoo.training.bleu import BleuMetric, corpus_bleu
from zoo.training.objectives import Objective, TokenCrossEntropy

if TYPE_CHECKING:
    from zoo.models.encoder_decoder import EncoderDecoderModel


class ScoreAccumulator(Protocol):
    """Validation scores beyond the loss, accumulated batch by batch; ``compute`` names them."""

    def update(self, logits: torch.Tensor, targets: torch.Tensor) -> None: ...
    def compute(self) -> dict[str, float]: ...


@torch.no_grad()
def validate(
    objective: Objective,
    model: nn.Module,
    batches: Iterable[Batch],
    *,
    device: torch.device,
    autocast: AbstractContextManager | None = None,
    metric: ScoreAccumulator | None = None,
) -> dict[str, Any]:
    """The task's objective over ``batches`` in eval mode (`Objective.summary`: ``val_loss``, and
    ``val_ppl`` or the objective's own means); restores the model's train/eval mode. ``metric`` (e.g.
    `zoo.training.tasks.classification.ClassificationMetric`) sees every batch's scored logits and targets."""
    was_training = model.training
    model.eval()
    loss, count = 0.0, 0
    metrics: dict[str, float] = {}
    try:
        for batch in batches:
            batch = objective.rollout(batch, device=device)  # GRPO's completions, sampled from ``model``
            units = objective.count(batch)
            sums = objective(model, batch, device=device, autocast=autocast, train=False)
            if metric is not None and sums.logits is not None and sums.targets is not None:
                metric.update(sums.logits, sums.targets)
            loss += float(sums.loss)
            count += units
            for name, value in sums.metrics.items():
                metrics[name] = metrics.get(name, 0.0) + float(value)
    finally:
        model.train(was_training)
    return objective.summary(loss, count, metrics)


def validation_loss(
    model: nn.Module,
    batches: Iterable[Batch],
    *,
    device: torch.device,
    autocast: AbstractContextManager | None = None,
    metric: ScoreAccumulator | None = None,
) -> tuple[float, float]:
    """(mean NLL per target token, perplexity) over ``batches`` (`validate` with `TokenCrossEntropy`)."""
    values = validate(TokenCrossEntropy(), model, batches, device=device, autocast=autocast, metric=metric)
    return values["val_loss"], values["val_ppl"]


def translate(
    model: EncoderDecoderModel,
    sources: Sequence[str],
    *,
    source_tokenizer: Tokenizer,
    target_tokenizer: Tokenizer,
    batch_size: int = 64,
    num_beams: int = 1,
    max_new_tokens: int | None = None,
    device: torch.device | str | None = None,
) -> list[str]:
    """Translate ``sources`` with ``model.generate`` (greedy unless ``num_beams > 1``), in input order.

    Sentences are batched by length so little padding is decoded; each output stops at its first eos.
    """
    spec = model.spec
    device = torch.device(device) if device is not None else next(model.parameters()).device
    limit = spec.max_positions
    texts, _ = cut_before_encoding(list(sources), char_budget(source_tokenizer, limit))  # a 20 MB line too
    encoded = [ids[:limit] for ids in source_tokenizer.encode_batch(texts, add_eos=True)]
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]))
    outputs: list[str] = [""] * len(encoded)
    eos, pad = spec.eos_token_id, spec.pad_token_id or 0
    for start in range(0, len(order), batch_size):
        rows = order[start : start + batch_size]
        width = max(len(encoded[i]) for i in rows)
        input_ids = torch.full((len(rows), width), pad, dtype=torch.long)
        attention_mask = torch.zeros_like(input_ids)
        for r, i in enumerate(rows):
            input_ids[r, : len(encoded[i])] = torch.tensor(encoded[i])
            attention_mask[r, : len(encoded[i])] = 1
        new_tokens = max_new_tokens or min(limit - 1, 2 * width + 10)
        generated = model.generate(
            input_ids.to(device),
            attention_mask=attention_mask.to(device),
            max_new_tokens=new_tokens,
            num_beams=num_beams,
        )
        for r, i in enumerate(rows):
            ids = generated[r, 1:].tolist()  # drop the decoder start token
            if eos is not None and eos in ids:
                ids = ids[: ids.index(eos)]
            outputs[i] = target_tokenizer.decode(ids)
    return outputs


def bleu(
    model: EncoderDecoderModel,
    pairs: Sequence[tuple[str, str]],
    *,
    source_tokenizer: Tokenizer,
    target_tokenizer: Tokenizer,
    num_beams: int = 1,
    max_new_tokens: int | None = None,
    metric: BleuMetric = "sacrebleu",
) -> float:
    """Corpus BLEU (0-100) of the model's translations of ``pairs`` (source, reference).

    ``metric`` picks the definition (`zoo.training.bleu`); sacrebleu's is the one zoo reports.
    """
    hypotheses = translate(
        model,
        [source for source, _ in pairs],
        source_tokenizer=source_tokenizer,
        target_tokenizer=target_tokenizer,
        num_beams=num_beams,
        max_new_tokens=max_new_tokens,
    )
    return corpus_bleu(hypotheses, [reference for _, reference in pairs], metric=metric)
