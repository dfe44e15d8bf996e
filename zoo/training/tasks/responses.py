"""A prompt and its response(s) on a decoder, only the response scored (dpo's pairs, kto's examples; grpo's
targets): a sequence is framed as causal_lm frames a document, and the targets are the next tokens at the
response positions (and eos), -100 elsewhere:

    row         bos p1 p2 p3 r1 r2 eos
    targets     -100 except r1 r2 eos

A record is cut to the length limit as one sequence, its end first (``data.too_long: truncate``), so a
prompt that fills the limit leaves nothing to train: such a record is dropped and counted.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from zoo.losses import IGNORE_INDEX
from zoo.training.data.sources import Record
from zoo.training.tasks.base import Framing, LengthCuts, Limits, Split, Units, measured_units, pad


def cut_responses(
    records: list[Record],
    ids: dict[str, list[Any]],
    responses: Sequence[str],
    *,
    cuts: LengthCuts,
    over: set[int],
    extra: int,
) -> dict[str, list[list[int] | None]]:
    """The raw ids of ``ids["prompt"]`` and of each of ``responses`` (sides of ``ids``), each prompt +
    response cut to the limit as one sequence of ``extra`` framing tokens (`LengthCuts.apply`), the prompt
    alike in every response's row: the first response decides. A dropped record is None on every side."""
    prompts = ids["prompt"]
    joined = {side: [[*p, *r] for p, r in zip(prompts, ids[side])] for side in responses}
    first = joined[responses[0]]
    cuts.apply(  # a record whose prompt fills the limit has nothing left to train: dropped, counted
        records,
        [(joined[side], extra) for side in responses],
        over,
        trains=lambda i: len(first[i]) > len(prompts[i]),
    )
    kept: dict[str, list[list[int] | None]] = {side: [] for side in ("prompt", *responses)}
    for i, prompt in enumerate(prompts):
        if first[i] is None:  # skipped (too_long: skip): dropped on every side
            for side in kept:
                kept[side].append(None)
            continue
        kept["prompt"].append(first[i][: len(prompt)])  # cut alike in every row, if at all
        for side in responses:
            kept[side].append(joined[side][i][len(prompt) :])
    return kept


def response_units(split: Split, frame: Framing, limits: Limits, responses: Sequence[str]) -> Units:
    """One unit per record, costing two rows of its prompt + longest response, framed; a record trains
    when the length limit leaves it a response token (eos is no answer)."""
    data, extra, bos = split.data, frame.extra, int(frame.bos is not None)

    def measure(start: int, stop: int) -> np.ndarray:
        longest = data.read_lengths(responses[0], start, stop)
        for side in responses[1:]:
            longest = np.maximum(longest, data.read_lengths(side, start, stop))
        length = data.read_lengths("prompt", start, stop).astype(np.int64) + longest + extra  # (n,)
        return np.stack([length, length], axis=1)  # (n, 2): the batch pads both rows to it

    def trains(examples: np.ndarray) -> np.ndarray:
        if frame.eos is None:  # framing's cut keeps the last token: a response's
            return np.ones(len(examples), dtype=bool)
        offsets = data.offsets("prompt")
        prompt = offsets[examples + 1] - offsets[examples]  # (n,)
        return bos + prompt + 1 < limits.max_length

    return measured_units(split, measure, columns=2, limits=limits, trains=trains)


def response_targets(ids: torch.Tensor, mask: torch.Tensor, starts: list[int]) -> torch.Tensor:
    """(R, T) targets of right-padded rows ``ids`` and ``mask`` (R, T) whose responses begin at ``starts``
    (R,): position t holds token t + 1 where that is a response token, -100 elsewhere."""
    start = torch.tensor(starts)  # (R,)
    position = torch.arange(1, ids.shape[1])  # (T - 1,): where target t - 1 sits
    scored = mask[:, 1:].bool() & (position[None, :] >= start[:, None])  # (R, T - 1)
    targets = torch.full_like(ids, IGNORE_INDEX)  # (R, T): position t predicts token t + 1
    targets[:, :-1] = torch.where(scored, ids[:, 1:], IGNORE_INDEX)
    return targets


class ResponseRows:
    """What a collator of prompt + response rows holds (dpo's `PreferenceCollator`, kto's
    `UnpairedCollator`), and its rows: framed, cut to ``max_length``, right-padded, responses scored."""

    def __init__(self, split: Split, units: Units, *, framing: Framing, pad_id: int, max_length: int) -> None:
        self.data, self.units, self.framing = split.data, units, framing
        self.pad_id, self.max_length = pad_id, max_length

    def scored_rows(
        self, prompts: list[list[int]], responses: Sequence[list[list[int]]]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Each group of ``responses`` in turn, response i after prompt i -> (R, T) ids, mask and targets."""
        bos = self.framing.bos is not None
        sequences, starts = [], []
        for group in responses:
            for prompt, response in zip(prompts, group):
                framed = self.framing([*prompt, *response], self.max_length)
                sequences.append(framed)
                starts.append(min(bos + len(prompt), len(framed) - 1))  # first response token (eos at least)
        ids, mask = pad(sequences, self.pad_id)  # (R, T)
        return ids, mask, response_targets(ids, mask, starts)
