"""Speculative decoding in the serving engine: every slot drafts, the target verifies all slots in one forward.

Shapes: B slots, R rows of a round (slots [0, R)), k drafted tokens at most per slot, n the round's width
(the most any slot drafted), V vocab, L cache columns.

A round replaces the engine's decode step (`zoo.serving.engine.Engine`) when it serves with ``--draft`` or
``--prompt-lookup``:

    draft      each busy slot proposes up to k tokens after its prompt and output: by n-gram lookup in them
               (`Lookup`, on the host lists the engine keeps anyway: no device work), or greedily / sampled
               from a draft model over its own slot cache (`DraftModel`, one batched step per token).
    verify     ONE forward of the target over every slot's next token and its drafts, columns [c, c + n] of
               the shared cache at each slot's own positions -> logits (R, n + 1, V).
    accept     per slot, as `zoo.generation.speculative`: greedy takes the longest prefix where the
               target's argmax equals the draft, then the target's own token (plain greedy's tokens);
               sampling accepts draft d with probability min(1, p(d) / q(d)) and draws the first rejected
               one from norm(max(0, p - q)) (a lookup draft is deterministic: q one-hot), drawing from the
               request's own generator.
    roll back  a slot keeps the columns of its next token and its accepted drafts; its rejected columns
               are masked in its row. The cursor moves n + 1 for every slot::

                   columns      c  c+1 c+2 c+3 c+4          n = 4
                   slot 0       t  d1  d2  x   x            accepted 2: t2 (the target's) is fed next round
                   slot 1       t  d1  d2  d3  d4           accepted all 4 (+ the target's 5th token)
                   slot 2       t  x   x   x   x            a penalised request: no drafts (plain step)

    compact    when the next round would not fit, every slot's kept columns are packed to end at the new
               cursor (one copy per slot; rare: the cache has k + 1 spare columns per round it may take).

A slot's columns have holes, but its keys carry their own positions (`Engine.positions`), so rotary and
learned absolute positions see each slot's own sequence. What measures distance in columns (a sliding
window, chunked or block-sparse attention, ALiBi or a relative bias) would see the holes: refused at start,
as are an encoder-decoder and ``--compile`` (the verify step has n + 1 columns).

A request this path cannot honour exactly drafts nothing and takes a plain step in the same forward (its
row feeds its next token only, the engine's `RowSampling` chooses): repetition, presence and frequency
penalties, ``logit_bias`` and a grammar (each reads the sequence, or a state, per token). ``logprobs`` are
honoured (each token's log-softmax at its own column).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from zoo.generation.config import check_model
from zoo.generation.session import decode_step
from zoo.generation.speculative import Verifier
from zoo.generation.weight_layout import use_decoding_layout
from zoo.serving.requests import Completion, TokenLogprob
from zoo.serving.slots import SlotCache

# The engine (`zoo.serving.engine.Engine`, whose state a round reads and updates) and its jobs: typed as Any,
# since the engine imports this module (no import cycle, not even for types).
Engine = Any
_Job = Any

MAX_NGRAM = 2  # prompt lookup's longest n-gram (transformers' max_matching_ngram_size default)


@dataclass(frozen=True)
class Speculation:
    """How the engine drafts: with ``draft`` (a smaller decoder with the target's vocabulary, on its device)
    or by prompt lookup (``lookup=True``), one of them; ``tokens``: drafts per slot and round (k)."""

    draft: Any = None
    lookup: bool = False
    tokens: int = 4

    def __post_init__(self) -> None:
        if (self.draft is None) == (not self.lookup):
            raise ValueError("speculative decoding: give a draft model or prompt lookup, one of them")
        if self.tokens < 1:
            raise ValueError(f"speculative decoding: draft tokens must be >= 1, got {self.tokens}")


def exact(request: Completion) -> bool:
    """Whether the speculative path gives ``request`` exactly what a plain step would: nothing that reads
    the sequence or a state per token (those requests take plain steps, `SpeculativeStep`)."""
    r = request
    return (
        r.repetition_penalty == 1.0
        and not r.presence_penalty
        and not r.frequency_penalty
        and not r.logit_bias
        and r.grammar is None
    )


def check_columns(model: Any, where: str) -> None:
    """Refuse a model whose attention measures distance in cache columns (holes would shift it)."""
    stack = model.prepare_generation(
        torch.zeros(1, 1, dtype=torch.long, device=next(model.parameters()).device), None, num_beams=1
    ).stack
    kinds = {p.kind for p in stack.patterns.all}
    if kinds != {"causal"} or stack.positions.role == "bias" or stack.position_bias is not None:
        raise ValueError(
            f"zoo serve: {where} (speculative decoding) needs causal attention with rotary or absolute "
            f"positions; this model has {sorted(kinds)} attention, {stack.positions.role} positions"
            + (" and a relative position bias" if stack.position_bias is not None else "")
        )


def squeeze(cache: SlotCache, slots: list[int]) -> list[int]:
    """Pack each of ``slots``' unmasked columns to end at one new cursor (the most any holds), in order;
    -> each slot's first column. Other slots' rows must be fully masked (idle)."""
    counts = cache.mask[:, : cache.length].sum(dim=1).tolist()  # one host read, once per compaction
    end = max((counts[i] for i in slots), default=0)
    firsts = []
    for i in slots:
        n = counts[i]
        kept = cache.mask[i, : cache.length].nonzero().flatten()  # (n,)
        row = cache.buffer[:, :, i]  # (N, 2, K, L, D)
        row[:, :, :, end - n : end] = row.index_select(3, kept)  # a copy: the spans may overlap
        cache.mask[i] = False
        cache.mask[i, end - n : end] = True
        firsts.append(end - n)
    cache.cursor.length = end
    return firsts


class Lookup:
    """Prompt lookup: the tokens that followed the earliest earlier occurrence of a slot's last n-gram
    (n = 2, then 1) in its prompt and output (transformers' prompt lookup decoding), on host lists."""

    def propose(
        self, engine: Engine, busy: list[int], rows: int, caps: list[int]
    ) -> tuple[torch.Tensor, list[int], torch.Tensor | None]:
        found: list[list[int]] = [[] for _ in range(rows)]
        for i in busy:
            if caps[i]:
                job = engine.slots[i]
                assert job is not None
                found[i] = _lookup([*job.request.prompt, *job.tokens], caps[i])
        width = max((len(f) for f in found), default=0)
        drafts = torch.tensor([f + [0] * (width - len(f)) for f in found], dtype=torch.long)  # (R, n)
        return drafts.to(engine.device, non_blocking=True), [len(f) for f in found], None

    def accepted(self, accepted: torch.Tensor, counts: list[int]) -> None:
        pass


def _lookup(sequence: list[int], k: int) -> list[int]:
    """Up to k tokens after the earliest earlier occurrence of the sequence's last n-gram, longest n first."""
    length = len(sequence)
    for n in range(min(MAX_NGRAM, length - 1), 0, -1):
        tail = sequence[-n:]
        first = tail[0]
        for start in range(length - n):
            if sequence[start] == first and sequence[start : start + n] == tail:
                return sequence[start + n : min(start + n + k, length)]
    return []


class DraftModel:
    """A draft model over its own slot cache (the engine's slot indices, its own columns, holes and cursor).

    Each round it first feeds every slot the tokens of its sequence it has not cached (a new request's whole
    prompt, or the last round's target token and fully accepted draft), right-aligned in one forward, then
    drafts k tokens one batched step at a time. A slot whose request changed slots (`Engine._pack`) has its
    row copied along; a new request is prefilled here, in that first forward.
    """

    def __init__(self, model: Any, engine: Engine, k: int) -> None:
        self.model = check_model(model)
        model.eval()
        target = engine.model.spec
        if self.model.spec.vocab_size != target.vocab_size or not self.model.continues_input:
            raise ValueError(
                f"zoo serve: the --draft model must be a decoder with the model's vocab_size "
                f"({target.vocab_size}); it has {self.model.spec.vocab_size}"
            )
        if self.model.spec.max_positions < engine.limit:
            raise ValueError(
                f"zoo serve: the --draft model's max_positions ({self.model.spec.max_positions}) is shorter "
                f"than the {engine.limit} positions a slot holds (--max-length)"
            )
        if next(model.parameters()).device != engine.device:
            raise ValueError(f"zoo serve: the --draft model is on another device than {engine.device}")
        check_columns(self.model, "--draft")
        use_decoding_layout(self.model, rows=engine.max_batch)
        self.k = k
        device = engine.device
        self.state = self.model.prepare_generation(
            torch.zeros(1, 1, dtype=torch.long, device=device), None, num_beams=1
        )
        B = engine.max_batch
        # a sequence (<= limit) after the longest held one (<= limit + k): the catch-up fits after compacting
        self.cache = SlotCache(self.state.stack, slots=B, length=2 * (engine.limit + k + 1))
        self.owner: list[_Job | None] = [None] * B
        self.cached = [0] * B  # tokens of the owner's sequence whose keys the row holds
        self.fed = [0] * B  # its sequence length when this round's drafts were made
        self.first = 0  # the column of this round's first draft's key

    def _sync(self, engine: Engine, busy: list[int]) -> None:
        """Follow the engine's slots: copy a moved request's row, forget finished ones, start new ones."""
        where = {id(job): i for i, job in enumerate(self.owner) if job is not None}
        mask, buffer = self.cache.mask, self.cache.buffer
        for i in busy:
            job = engine.slots[i]
            if self.owner[i] is job:
                continue
            old = where.get(id(job))
            if old is not None and self.owner[old] is job:  # moved down (`Engine._pack`)
                buffer[:, :, i] = buffer[:, :, old]
                mask[i] = mask[old]
                self.cached[i] = self.cached[old]
                self.owner[old] = None
                mask[old] = False
            else:
                mask[i] = False
                self.cached[i] = 0
            self.owner[i] = job
        for i, job in enumerate(self.owner):
            if job is not None and engine.slots[i] is not job:
                self.owner[i] = None
                mask[i] = False

    def propose(
        self, engine: Engine, busy: list[int], rows: int, caps: list[int]
    ) -> tuple[torch.Tensor, list[int], torch.Tensor | None]:
        self._sync(engine, busy)
        cache, device = self.cache, engine.device
        jobs: list[_Job | None] = [engine.slots[i] if i in busy else None for i in range(rows)]
        sequences = {i: [*job.request.prompt, *job.tokens] for i, job in enumerate(jobs) if job is not None}
        width = max(len(s) - self.cached[i] for i, s in sequences.items())  # >= 1: the last token
        if cache.length + width + self.k > cache.max_length:
            squeeze(cache, busy)
        ids = torch.zeros(rows, width, dtype=torch.long)
        positions = torch.zeros(rows, width, dtype=torch.long)
        fresh = torch.zeros(rows, width, dtype=torch.bool)
        for i, sequence in sequences.items():  # right-aligned: every row's last token in the last column
            new = sequence[self.cached[i] :]
            pad = width - len(new)
            ids[i, pad:] = torch.tensor(new)
            positions[i, pad:] = torch.arange(self.cached[i], len(sequence))
            fresh[i, pad:] = True
            self.fed[i] = len(sequence)
        live = fresh[:, -1].to(device)  # (R,)
        cache.mask[:rows, cache.length : cache.length + width] = fresh.to(device)
        ids, positions = ids.to(device), positions.to(device)
        sampled = [i for i in busy if caps[i] and jobs[i].generator is not None]  # type: ignore[union-attr]
        drafts, probs = [], []
        for step in range(self.k):
            end = cache.length + ids.shape[1]
            logits = decode_step(
                self.model,
                ids,
                positions,
                cache.mask[:rows, :end],
                cache.view(rows),  # type: ignore[arg-type]  # a StackCache, as StepFn's KVCache is
                self.state,
            ).float()  # (R, V)
            token = logits.argmax(dim=-1)  # (R,)
            if sampled:
                token, q = _draw(engine, logits, token, sampled, [jobs[i] for i in sampled])
                probs.append(q)
            drafts.append(token)
            if step + 1 < self.k:  # the last draft's key is made next round, if the target accepts it
                if step == 0:
                    self.first = cache.length
                cache.mask[:rows, cache.length] = live
                ids, positions = token[:, None], positions[:, -1:] + 1
        q_all = torch.stack(probs, dim=1) if sampled else None  # (R, k, V): zeros in rows not sampled
        return torch.stack(drafts, dim=1), [min(self.k, cap) for cap in caps], q_all

    def accepted(self, accepted: torch.Tensor, counts: list[int]) -> None:
        """``accepted`` (R,) drafts taken per row (on the device; ``counts`` the same on the host): keep the
        keys of each slot's accepted drafts (the first k - 1 were fed), mask the others'."""
        if self.k > 1:
            fed = torch.arange(self.k - 1, device=accepted.device)  # (k - 1,)
            self.cache.mask[: len(counts), self.first : self.first + self.k - 1] &= fed < accepted[:, None]
        for i, m in enumerate(counts):
            if self.owner[i] is not None:
                self.cached[i] = self.fed[i] + min(m, self.k - 1)


def _draw(
    engine: Engine, logits: torch.Tensor, tokens: torch.Tensor, rows: list[int], jobs: list[_Job]
) -> tuple[torch.Tensor, torch.Tensor]:
    """The sampled rows' drafts from the draft's warped distribution (their requests' settings and
    generators) -> tokens (R,), q (R, V) (zeros in the other rows)."""
    picked = torch.tensor(rows, device=logits.device)  # (S,)
    warped = engine.sampling.warp(logits[picked], picked, [job.request for job in jobs]).softmax(dim=-1)
    q = torch.zeros_like(logits).index_copy(0, picked, warped)  # (R, V)
    drawn = _inverse(warped, [job.generator for job in jobs])  # (S,)
    return tokens.index_copy(0, picked, drawn), q


def _inverse(p: torch.Tensor, generators: list[Any]) -> torch.Tensor:
    """One token per row of p (S, V) (probabilities, unnormalised), by one uniform number from each row's
    own generator (as `RowSampling.choose` draws: a seeded request's draws are its own)."""
    cdf = p.cumsum(dim=-1)  # (S, V)
    uniform = torch.stack([torch.rand((), generator=g, device=g.device) for g in generators])
    drawn = torch.searchsorted(cdf, (uniform.to(cdf.device) * cdf[:, -1])[:, None]).squeeze(1)
    return drawn.clamp(max=p.shape[-1] - 1)


class SpeculativeStep:
    """The engine's decode step by draft and verify (the module's docstring); counts drafts proposed and
    accepted over the engine's life (``proposed``, ``taken``)."""

    def __init__(self, engine: Engine, speculation: Speculation) -> None:
        if engine.seq2seq:
            raise ValueError("zoo serve: --draft / --prompt-lookup work with decoder-only models")
        if not isinstance(engine.model, Verifier):
            raise ValueError("zoo serve: speculative decoding needs a model with all_token_logits")
        check_columns(engine.model, "--draft" if speculation.draft is not None else "--prompt-lookup")
        self.engine, self.k = engine, speculation.tokens
        self.drafter: Lookup | DraftModel = (
            Lookup() if speculation.draft is None else DraftModel(speculation.draft, engine, self.k)
        )
        # spare columns for the rounds' holes: a compaction every few rounds at most
        spare = 8 * (self.k + 1)
        engine.cache = SlotCache(engine.stack, slots=engine.max_batch, length=engine.limit + spare)
        self.proposed = self.taken = 0

    def __call__(self) -> None:
        e = self.engine
        busy = [i for i, job in enumerate(e.slots) if job is not None and bool(e.live[i])]
        if not busy:
            return
        busy = e._pack(busy)
        R = busy[-1] + 1
        caps = [0] * R  # drafts each slot may take: within its room; none for a request it cannot honour
        for i in busy:
            job = e.slots[i]
            assert job is not None
            if exact(job.request):
                caps[i] = max(0, min(self.k, job.room - len(job.tokens) - 1))
        if any(caps):
            drafts, counts, q = self.drafter.propose(e, busy, R, caps)
        else:
            drafts, counts, q = torch.zeros(R, 0, dtype=torch.long, device=e.device), [0] * R, None
        accepted, out = self._verify(busy, R, drafts, counts, q)
        if any(caps):
            self.drafter.accepted(accepted, [row[0] for row in out])

    def _verify(
        self, busy: list[int], R: int, drafts: torch.Tensor, counts: list[int], q: torch.Tensor | None
    ) -> tuple[torch.Tensor, list[list[int]]]:
        """Verify every slot's drafts in one forward, take each slot's accepted tokens, roll back the rest
        -> accepted (R,) and, per row, [accepted, drafts..., the token after them] (host lists)."""
        e, cache = self.engine, self.engine.cache
        n = max(counts)
        if cache.length + n + 1 > cache.max_length:
            for i, first in zip(busy, squeeze(cache, busy)):
                e.starts[i] = first
            n = min(n, cache.max_length - cache.length - 1)
            counts = [min(count, n) for count in counts]
        drafts = drafts[:, :n]
        c, device = cache.length, e.device
        steps = torch.arange(n + 1, device=device)  # (n + 1,)
        ids = torch.cat([e.next_ids[:R, None], drafts], dim=1)  # (R, n + 1)
        positions = e.positions[:R, None] + steps  # (R, n + 1)
        cache.mask[:R, c : c + n + 1] = True  # idle rows see their own columns: no row is all masked
        model: Any = e.model  # a Verifier (checked at start)
        logits = model.all_token_logits(
            ids, positions, cache.mask[:R, : c + n + 1], cache.view(R), e._state(R), n + 1
        ).float()  # (R, n + 1, V)
        allowed = torch.tensor(counts, device=device)  # (R,)
        jobs = [e.slots[i] if i in busy else None for i in range(R)]
        target = logits.argmax(dim=-1)  # (R, n + 1): greedy accepts while it equals the draft
        match = (target[:, :n] == drafts) & (steps[None, :n] < allowed[:, None])
        accepted = match.long().cumprod(dim=1).sum(dim=1)  # (R,)
        tokens = target
        sampled = [i for i, job in enumerate(jobs) if job is not None and counts[i] and job.generator]
        if sampled:
            accepted, tokens = self._rejection(
                logits, drafts, q, allowed, counts, sampled, jobs, accepted, tokens
            )
        plain = [job if job is not None and not counts[i] else None for i, job in enumerate(jobs)]
        failures: dict[int, str] = {}
        if any(job is not None for job in plain):  # no drafts: the engine's own sampling, as a plain step
            chosen = e.sampling.choose(
                logits[:, 0],
                e.rows[:R],
                [job.request if job is not None else None for job in plain],
                [job.generator if job is not None else None for job in plain],
            )
            failures = e.sampling.failures
            tokens = tokens.clone()
            tokens[:, 0] = torch.where(allowed > 0, tokens[:, 0], chosen)
        last = tokens.gather(1, accepted[:, None]).squeeze(1)  # (R,) the target's token after the accepted
        cache.mask[:R, c : c + n + 1] = (steps[None] <= accepted[:, None]) & e.live[:R, None]
        e.next_ids[:R] = torch.where(e.live[:R], last, e.next_ids[:R])
        e.positions[:R] += (accepted + 1) * e.live[:R]
        out = torch.cat([accepted[:, None], drafts, last[:, None]], dim=1).tolist()  # one host read a round
        entries = self._logprobs(logits, out, jobs)
        for i in busy:
            job = e.slots[i]
            assert job is not None
            m = out[i][0]
            self.proposed += counts[i]
            self.taken += m
            if i in failures:  # its grammar failed: this request alone
                e._fail(job, failures[i])
                e._release(job)
                continue
            logprobs = entries[i]
            for j, token in enumerate([*out[i][1 : 1 + m], out[i][-1]]):
                if e._add(job, token, logprobs[j] if logprobs is not None else None):
                    e._release(job)
                    break
        return accepted, out

    def _rejection(
        self,
        logits: torch.Tensor,
        drafts: torch.Tensor,
        q: torch.Tensor | None,
        allowed: torch.Tensor,
        counts: list[int],
        rows: list[int],
        jobs: list[_Job | None],
        accepted: torch.Tensor,
        tokens: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The sampled rows' acceptance by the rejection rule (`zoo.generation.speculative`), drawing from
        each request's own generator -> accepted (R,), tokens (R, n + 1) with each row's token after its
        accepted drafts at its column ``accepted``."""
        e = self.engine
        n1, V = logits.shape[1:]
        n = n1 - 1
        picked = torch.tensor(rows, device=logits.device)  # (S,)
        held = [jobs[i] for i in rows]
        requests = [job.request for job in held if job is not None]
        generators = [job.generator for job in held if job is not None and job.generator is not None]
        p = e.sampling.warp(
            logits[picked].flatten(0, 1),
            picked.repeat_interleave(n1),
            [r for r in requests for _ in range(n1)],
        ).softmax(dim=-1)
        p = p.view(len(rows), n1, V)  # (S, n + 1, V) the target's distribution at each column
        d = drafts[picked]  # (S, n)
        p_d = p[:, :n].gather(2, d[..., None]).squeeze(2)  # (S, n)
        q_rows = q[picked, :n] if q is not None else None  # (S, n, V)
        q_d = q_rows.gather(2, d[..., None]).squeeze(2) if q_rows is not None else torch.ones_like(p_d)
        # one uniform number per draft of the row's own, from its own generator: a seeded request draws the
        # same numbers whatever the other slots drafted (the round's width n is theirs too)
        own = [counts[i] for i in rows]
        u = torch.ones(len(rows), n, device=p.device)  # (S, n): columns past a row's drafts are not read
        for row, (g, count) in enumerate(zip(generators, own)):
            u[row, :count] = torch.rand(count, generator=g, device=g.device).to(p.device)
        ok = (u * q_d < p_d) & (torch.arange(n, device=p.device)[None] < allowed[picked, None])
        m = ok.long().cumprod(dim=1).sum(dim=1)  # (S,)
        at = m[:, None, None].expand(-1, 1, V)
        p_m = p.gather(1, at).squeeze(1)  # (S, V) the target's distribution after the accepted drafts
        below = m.clamp(max=max(n - 1, 0))[:, None, None].expand(-1, 1, V)  # the rejected draft's column
        if q_rows is not None:
            q_m = q_rows.gather(1, below).squeeze(1)  # (S, V)
        else:
            q_m = torch.zeros_like(p_m).scatter_(1, d.gather(1, below[:, :, 0]), 1.0)  # one-hot on it
        residual = (p_m - q_m).clamp(min=0)
        residual = torch.where(residual.sum(dim=1, keepdim=True) > 0, residual, p_m)
        rejected = (m < allowed[picked])[:, None]  # else every draft was taken: the bonus token from p
        drawn = _inverse(torch.where(rejected, residual, p_m), generators)
        tokens = tokens.clone()
        tokens[picked, m] = drawn
        return accepted.index_copy(0, picked, m), tokens

    def _logprobs(
        self, logits: torch.Tensor, out: list[list[int]], jobs: list[_Job | None]
    ) -> list[list[TokenLogprob | None] | None]:
        """Per row, the log-probability of each of its new tokens at its own column (a request that asks)."""
        found: list[list[TokenLogprob | None] | None] = [None] * len(jobs)
        places = [
            (i, j)
            for i, job in enumerate(jobs)
            if job is not None and job.request.logprobs is not None
            for j in range(out[i][0] + 1)
        ]
        if not places:
            return found
        rows = torch.tensor([i for i, _ in places], device=logits.device)
        cols = torch.tensor([j for _, j in places], device=logits.device)
        tokens = torch.tensor(
            [out[i][1 + j] if j < out[i][0] else out[i][-1] for i, j in places], device=logits.device
        )
        entries = self.engine._logprobs(logits[rows, cols], tokens, [jobs[i] for i, _ in places])
        for (i, _), entry in zip(places, entries):
            found[i] = [*(found[i] or []), entry]
        return found
