"""Beam requests in the batched engine: a request's beams are a group of slots that share its prompt.

Shapes: B slots, N beams of a group (its width, ``best_of``), V vocab, t tokens generated so far, D head dim.

A beam request (``Completion.beam``) reserves N free slots at once. Its prompt is prefilled (an
encoder-decoder's source encoded) once, in a prefill group beside any other newcomers; when it joins, the
prompt's keys (and the source, its cross-attention keys) are copied into each of its N slots, which then
hold the same columns, mask and positions. Its first step reads the prefill's logits; from then on every
decode step runs the group's N rows in the one batched forward with every other slot, and then, per group:

    log-softmax of its N rows (N, V) -> `zoo.generation.beam.BeamSearch.step`: the top 2N of N x V
    candidates, finished hypotheses kept and scored as ``generate`` keeps them -> which beam each slot
    continues, and its new token -> one index copy of the group's decoder columns within its slots
    (``keys[slots] = keys[slots[rows]]``), and the new tokens as the slots' next ids.

Nothing else moves: a group's source is the same in each of its slots, and so are its mask and positions.
Other requests in the batch go on as before; the loop is over groups (each a few small tensor operations),
never over tokens. A group ends when its search does (``max_tokens``, or no running beam can beat its
finished ones), and emits its n best hypotheses, best first, as n `Done` events (``Done.choice``); it
streams nothing. The outputs equal ``model.generate(num_beams=N, num_return_sequences=n, ...)`` of the
prompt alone: the same search on the same logits (up to the rounding of a batched forward).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from zoo.generation import TextStream
from zoo.generation.beam import BeamSearch
from zoo.generation.config import GenerationConfig, check_beams
from zoo.serving.requests import Completion, Done, FinishReason, RequestError
from zoo.serving.slots import SlotCache


def check_beam(request: Completion, *, slots: int, vocab_size: int) -> None:
    """Raise `RequestError` (``best_of``) for a beam request an engine of ``slots`` slots cannot run."""
    assert request.beam is not None
    width = request.beam.width
    if width > slots:  # a group runs all its beams at once
        raise RequestError(
            f"best_of ({width}) needs {width} slots at once; this server has {slots} (--max-batch)",
            param="best_of",
        )
    try:
        config = GenerationConfig(num_beams=width, max_new_tokens=request.max_tokens)
        check_beams(config, vocab_size=vocab_size)
    except ValueError as error:
        raise RequestError(str(error).removeprefix("generate: "), param="best_of") from None


@dataclass
class BeamGroup:
    """One beam request: its N slots (``members[i]`` holds beam i) and its search."""

    request: Completion
    members: Sequence[Any]  # the engine's jobs (`zoo.serving.engine._Job`), one per slot: ``.slot``
    search: BeamSearch
    history: torch.Tensor  # (N, max_tokens) each running beam's tokens so far, columns [0, t)
    eos: frozenset[int]
    text: Callable[[], TextStream]  # a fresh text stream for one hypothesis
    steps: int = 0

    @property
    def slots(self) -> list[int]:
        return [member.slot for member in self.members]

    def tokens(self) -> list[int]:
        """Each running beam's last token: what its slot feeds next (N,)."""
        return self.history[:, self.steps - 1].tolist()

    def advance(self, log_probs: torch.Tensor) -> tuple[torch.Tensor, bool]:
        """One step of the search on its beams' log-probabilities (N, V) -> the beam each slot continues
        (N,), and whether the search is over; the beams' tokens so far follow them."""
        t = self.steps
        rows, tokens, over = self.search.step(log_probs, self.history[:, :t])
        self.history[:, :t] = self.history[rows, :t]
        self.history[:, t] = tokens
        self.steps = t + 1
        return rows, over

    def finish(self) -> None:
        """Emit the n best hypotheses, best first: their tokens (an end token included), their text (an end
        token is not detokenised, as for any request), "stop" when an end token ended them."""
        n = self.request.choices
        sequences, _, lengths = self.search.best(n)
        for k, (row, length) in enumerate(zip(sequences.tolist(), lengths.tolist())):
            tokens = row[:length]
            ended = tokens[-1] in self.eos  # else it ran to max_tokens
            stream = self.text()
            text = stream.push(tokens[:-1] if ended else tokens) + stream.flush()
            reason: FinishReason = "stop" if ended else "length"
            self.request.emit(Done(text, tuple(tokens), reason, len(self.request.prompt), choice=k))


class BeamGroups:
    """The running beam requests of an engine (see the module docstring)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.groups: list[BeamGroup] = []

    def reserve(
        self, job: Any, slots: Sequence[int], *, eos: set[int], text: Callable[[], TextStream]
    ) -> BeamGroup:
        """The group of a beam request's ``job`` (`zoo.serving.engine._Job`), in ``slots`` (N): a job for
        each slot, ``job`` itself in the first, each pointing to the group (``.beam``); ``eos``: the model's
        end ids; ``text``: a fresh text stream for the request. It runs once it joins (`first`)."""
        request, room = job.request, job.room
        assert request.beam is not None
        N = request.beam.width
        ends = (set() if request.ignore_eos else set(eos)) | set(request.stop_token_ids)
        search = BeamSearch(
            1,
            N,
            prefix=0,  # the search sees the new tokens only: every beam shares the prompt
            max_new_tokens=room,
            eos=torch.tensor(sorted(ends), device=self.device) if ends else None,
            pad=0,
            length_penalty=request.beam.length_penalty,
            early_stopping=request.beam.early_stopping,
            device=self.device,
        )
        history = torch.zeros(N, room, dtype=torch.long, device=self.device)
        members = [job, *(replace(job, slot=slot, tokens=[]) for slot in slots[1:])]
        group = BeamGroup(request, members, search, history, frozenset(ends), text)
        for member in members:
            member.beam = group
        return group

    def first(self, group: BeamGroup, logits: torch.Tensor) -> bool:
        """The group's first step, on its prompt's next-token logits (V,): True when it is already over
        (``max_tokens`` 1); else it runs from now on (`step`)."""
        N = group.search.N
        log_probs = logits.float().log_softmax(dim=-1).expand(N, -1)  # (N, V): every beam is the prompt
        _, over = group.advance(log_probs)
        if over:
            group.finish()
        else:
            self.groups.append(group)
        return over

    def step(
        self, logits: torch.Tensor, cache: SlotCache, next_ids: torch.Tensor, starts: Sequence[int]
    ) -> list[BeamGroup]:
        """After a decode step's logits (R, V) over slots [0, R): each running group's search step, its
        slots' decoder keys reordered within the group (``starts``: each slot's first live column) and their
        next ids (B,) set -> the groups that ended (their hypotheses emitted; the caller frees the slots)."""
        ended = []
        for group in list(self.groups):
            if group.request.cancelled:  # its slots were freed with the request (`Engine._drop_cancelled`)
                self.groups.remove(group)
                continue
            slots = torch.tensor(group.slots, device=self.device)  # (N,)
            rows, over = group.advance(logits[slots].float().log_softmax(dim=-1))
            if over:
                group.finish()
                self.groups.remove(group)
                ended.append(group)
                continue
            start, end = starts[group.slots[0]], cache.length  # the same span in every slot of the group
            columns = cache.buffer[:, :, :, :, start:end]  # (layers, 2, B, K, columns, D)
            columns[:, :, slots] = columns[:, :, slots[rows]]
            next_ids[slots] = group.history[:, group.steps - 1]
        return ended

    def clear(self) -> None:
        """Forget every group (the engine failed them all)."""
        self.groups.clear()
