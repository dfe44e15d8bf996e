"""Length-bucketed batches by token count, and the collation of a batch into model inputs.

Examples are sorted by length once (ties broken by a seeded shuffle) and cut greedily into batches of at
most ``max_tokens`` padded tokens, so each batch holds sequences of nearly one length and pads little
(the bucketing of fairseq and tensor2tensor). The batches stay the same every epoch; their order is
reshuffled per epoch from ``(seed, epoch)``. So the data position of a run is two integers, and resuming
rebuilds exactly the batches a straight run would have seen.

Teacher forcing for seq2seq: the decoder reads the target shifted right behind the start token and is
scored against the target itself:

    target            x1 x2 x3 eos
    decoder input  bos x1 x2 x3          (the decoder start token, then the target minus its last token)
    targets           x1 x2 x3 eos       padded with -100, never with the pad id

For causal LM the targets are the inputs shifted left (position t predicts token t + 1); for masked LM
they are the original ids at the masked positions. Every collated batch has ``targets`` aligned with the
logits, so one loss function serves all three tasks.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from zoo.losses import IGNORE_INDEX
from zoo.training.config import Task
from zoo.training.data import DataError, EncodedExamples, lengths
from zoo.training.masking import mask_tokens


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


def plan_batches(
    data: EncodedExamples, *, max_tokens: int, max_sentences: int | None = None, seed: int = 0
) -> list[list[int]]:
    """Example indices per batch; a batch costs ``len(batch) * (longest source + longest target)``."""
    source_lengths, target_lengths = lengths(data)
    order = list(range(len(data)))
    random.Random(seed).shuffle(order)  # ties in length end up in a seeded, not file, order
    order.sort(key=lambda i: (source_lengths[i], target_lengths[i]))
    batches: list[list[int]] = []
    batch: list[int] = []
    longest_source = longest_target = 0
    for i in order:
        cost = source_lengths[i] + target_lengths[i]
        if cost > max_tokens:
            raise DataError(
                f"{data.origins[i]}: one example has {cost} tokens, more than batch.max_tokens ({max_tokens})"
            )
        s, t = max(longest_source, source_lengths[i]), max(longest_target, target_lengths[i])
        full = max_sentences is not None and len(batch) == max_sentences
        if batch and (full or (len(batch) + 1) * (s + t) > max_tokens):
            batches.append(batch)
            batch, s, t = [], source_lengths[i], target_lengths[i]
        batch.append(i)
        longest_source, longest_target = s, t
    batches.append(batch)
    return batches


def epoch_order(num_batches: int, *, seed: int, epoch: int, shuffle: bool = True) -> list[int]:
    """The order in which an epoch visits the batches; a function of (seed, epoch) only."""
    order = list(range(num_batches))
    if shuffle:
        random.Random(seed * 1_000_003 + epoch).shuffle(order)
    return order


class BatchOrder:
    """Which batches each optimizer step takes: ``group`` at a time (grad_accum x processes), through each
    epoch's shuffled order; the leftover batches that cannot fill a step are skipped for that epoch.

    The whole data position is ``(epoch, position)``: restoring those two continues exactly.
    """

    def __init__(self, num_batches: int, *, group: int, seed: int, shuffle: bool = True) -> None:
        if num_batches < group:
            raise ValueError(
                f"the training data makes {num_batches} batches, fewer than one step needs ({group}: "
                "grad_accum x processes); lower batch.max_tokens or grad_accum"
            )
        self.num_batches, self.group, self.seed, self.shuffle = num_batches, group, seed, shuffle
        self.epoch = self.position = 0
        self._order: tuple[int, list[int]] = (-1, [])  # (epoch, its order), computed once an epoch

    @property
    def steps_per_epoch(self) -> int:
        return self.num_batches // self.group

    def next_group(self) -> list[int]:
        """The batch indices of the next step, over all processes (process r takes ``[r::world]``)."""
        if self.position + self.group > self.num_batches:
            self.epoch, self.position = self.epoch + 1, 0
        if self._order[0] != self.epoch:
            order = epoch_order(self.num_batches, seed=self.seed, epoch=self.epoch, shuffle=self.shuffle)
            self._order = (self.epoch, order)
        chosen = self._order[1][self.position : self.position + self.group]
        self.position += self.group
        return chosen


class Collator:
    """Turns example indices into a `Batch` for one task."""

    def __init__(
        self,
        data: EncodedExamples,
        *,
        task: Task,
        pad_id: int,
        start_id: int | None = None,
        mask_id: int | None = None,
        special_ids: tuple[int, ...] = (),
        vocab_size: int | None = None,
        mlm_probability: float = 0.15,
    ) -> None:
        self.data, self.task, self.pad_id, self.start_id = data, task, pad_id, start_id
        if task == "seq2seq" and start_id is None:
            raise ValueError("seq2seq collation needs the decoder start token id")
        if task == "masked_lm":
            if mask_id is None or vocab_size is None:
                raise ValueError("masked_lm needs a tokenizer with a mask token ([MASK] or <mask>)")
            self.mask_id, self.mlm_probability = mask_id, mlm_probability
            self.special = torch.tensor(sorted(set(special_ids) | {pad_id, mask_id}))
            allowed = torch.ones(vocab_size, dtype=torch.bool)
            allowed[self.special] = False
            self.replacements = allowed.nonzero().squeeze(1)  # (R,) random replacements: no special tokens

    def __call__(self, indices: list[int], *, generator: torch.Generator | None = None) -> Batch:
        targets = [self.data.targets[i] for i in indices]
        if self.task == "seq2seq":
            sources = [self.data.sources[i] for i in indices]  # type: ignore[index]
            input_ids, attention_mask = self._pad(sources, self.pad_id)  # (B, S)
            start_id = self.start_id
            assert start_id is not None  # __init__ refuses seq2seq without one
            decoder_inputs = [[start_id, *ids[:-1]] for ids in targets]
            decoder_input_ids, decoder_mask = self._pad(decoder_inputs, self.pad_id)  # (B, T)
            labels, _ = self._pad(targets, IGNORE_INDEX)  # (B, T)
            inputs = {
                "input_ids": input_ids,
                "attention_mask": attention_mask,
                "decoder_input_ids": decoder_input_ids,
                "decoder_attention_mask": decoder_mask,
            }
            return Batch(inputs, labels, int(attention_mask.sum() + decoder_mask.sum()))
        input_ids, attention_mask = self._pad(targets, self.pad_id)  # (B, T)
        if self.task == "causal_lm":
            shifted = [[*ids[1:], IGNORE_INDEX] for ids in targets]  # position t predicts token t + 1
            labels, _ = self._pad(shifted, IGNORE_INDEX)
        else:
            maskable = attention_mask.bool() & ~torch.isin(input_ids, self.special)
            input_ids, labels = mask_tokens(
                input_ids,
                maskable=maskable,
                mask_token_id=self.mask_id,
                replacement_ids=self.replacements,
                probability=self.mlm_probability,
                generator=generator,
            )
        inputs = {"input_ids": input_ids, "attention_mask": attention_mask}
        return Batch(inputs, labels, int(attention_mask.sum()))

    @staticmethod
    def _pad(sequences: list[list[int]], value: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Right-pad to the longest: (B, L) ids and the (B, L) 1/0 mask."""
        width = max(map(len, sequences))
        ids = torch.full((len(sequences), width), value, dtype=torch.long)
        mask = torch.zeros((len(sequences), width), dtype=torch.long)
        for row, seq in enumerate(sequences):
            ids[row, : len(seq)] = torch.tensor(seq, dtype=torch.long)
            mask[row, : len(seq)] = 1
        return ids, mask
