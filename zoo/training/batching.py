"""The batch a task collates, and which batches each optimizer step takes.

Batches are planned from the lengths alone (`zoo.training.data.planning`): units (examples, or packed
windows) sorted by length, ties broken by a seeded permutation, cut greedily under ``max_tokens`` padded
tokens, so each batch holds sequences of nearly one length and pads little (the bucketing of fairseq and
tensor2tensor). The batches stay the same every epoch; their order is reshuffled per epoch from
``(seed, epoch)``. So the data position of a run is two integers, and resuming rebuilds exactly the batches
a straight run would have seen. A step takes ``grad_accum x processes`` batches of the epoch's order, and
each process collates only its own (every ``world_size``-th of them): no process reads another's tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from zoo.losses import IGNORE_INDEX
from zoo.training.data.planning import plan_batches


@dataclass
class Batch:
    inputs: dict[str, torch.Tensor]  # model keyword arguments: input_ids (B, S), attention_mask, ...
    # (B, T) aligned with the logits, -100 = not scored; or (B,), one class per sequence (classification)
    targets: torch.Tensor
    num_tokens: int  # real (non-pad) input tokens, source and target, for throughput

    def logits_mask(self) -> torch.Tensor | None:
        """(B, T) bool: the positions with a target, where the model's token-level head need run (the
        model's ``logits_mask``); None for one target per sequence, where the head runs once a row."""
        return self.targets != IGNORE_INDEX if self.targets.dim() == 2 else None

    def scored_targets(self, logits_mask: torch.Tensor | None) -> torch.Tensor:
        """The targets aligned with the logits a forward with ``logits_mask`` returns: (N,) or (B,)."""
        return self.targets[logits_mask] if logits_mask is not None else self.targets

    def to(self, device: torch.device | str) -> Batch:
        """The batch on ``device``, without the masks that hide nothing (every row full length).

        Whether a mask pads anything is free to read here on the CPU; on an accelerator the model would not
        read it (a host sync) and would apply it all the same (`zoo.blocks.masks`), keeping SDPA off its
        flash kernel. A missing mask means no padding, so the results are the same.
        """
        inputs = {
            name: t.to(device, non_blocking=True)
            for name, t in self.inputs.items()
            if not (name.endswith("attention_mask") and bool(t.all()))
        }
        return Batch(inputs, self.targets.to(device, non_blocking=True), self.num_tokens)


class BatchOrder:
    """Which batches each optimizer step takes: ``group`` at a time (grad_accum x processes), through each
    epoch's shuffled order; the leftover batches that cannot fill a step are skipped for that epoch.

    ``lengths``: (U,) or (U, sides) padded tokens per unit; ``describe(u)`` names unit u in the message of
    one that alone exceeds ``max_tokens``. The whole data position is ``(epoch, position)``: restoring
    those two continues exactly.
    """

    def __init__(
        self,
        lengths: np.ndarray,
        *,
        max_tokens: int,
        max_sentences: int | None = None,
        group: int,
        seed: int,
        shuffle: bool = True,
        describe: Callable[[int], str] | None = None,
    ) -> None:
        self.lengths, self.max_tokens, self.max_sentences = lengths, max_tokens, max_sentences
        self.group, self.seed, self.shuffle, self.describe = group, seed, shuffle, describe
        self.epoch = self.position = 0
        self._plan: tuple[int, list[np.ndarray]] = (0, self.batches(0))  # (epoch, its batches), one at a time
        self.num_batches = len(self._plan[1])
        if self.num_batches < group:
            raise ValueError(
                f"the training data makes {self.num_batches} batches, fewer than one step needs ({group}: "
                "grad_accum x processes); lower batch.max_tokens or grad_accum"
            )

    def batches(self, epoch: int) -> list[np.ndarray]:
        """Epoch ``epoch``'s batches (unit indices), in the order it visits them; a function of (seed, epoch)."""
        if self._planned(epoch):
            return self._plan[1]
        return plan_batches(
            self.lengths,
            max_tokens=self.max_tokens,
            max_examples=self.max_sentences,
            seed=self.seed,
            epoch=epoch,
            shuffle=self.shuffle,
            describe=self.describe,
        )

    def _planned(self, epoch: int) -> bool:
        return hasattr(self, "_plan") and self._plan[0] == epoch

    @property
    def steps_per_epoch(self) -> int:
        return self.num_batches // self.group

    def next_group(self) -> list[tuple[int, np.ndarray]]:
        """The next step's batches over all processes, each with its index in the epoch's order (process r
        takes ``[r::world_size]``)."""
        if self.position + self.group > self.num_batches:
            self.epoch, self.position = self.epoch + 1, 0
        if not self._planned(self.epoch):
            self._plan = (self.epoch, self.batches(self.epoch))
        start = self.position
        self.position += self.group
        return [(i, self._plan[1][i]) for i in range(start, start + self.group)]


def plan_once(
    lengths: np.ndarray,
    *,
    max_tokens: int,
    max_sentences: int | None = None,
    describe: Callable[[int], str] | None = None,
) -> list[np.ndarray]:
    """Batches of a split read once in length order (validation): no shuffle."""
    return plan_batches(
        lengths, max_tokens=max_tokens, max_examples=max_sentences, shuffle=False, describe=describe
    )
