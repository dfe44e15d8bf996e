"""The continuous-batching engine: a fixed number of slots, one batched KV cache, one background thread.

Shapes: B slots (``max_batch``), L = the longest sequence a slot holds (prompt + new tokens), V vocab,
k requests prefilled together, T their (left-padded) prompt length.

Each turn of the engine's loop:

    1. take new requests (a bounded queue: `submit` raises `QueueFull` when every slot is busy and
       ``max_queue`` requests already wait) and drop cancelled ones, freeing their slots;
    2. prefill: start a group of waiting requests when slots are free (as many as fit ``prefill_tokens``
       padded tokens), or run the next chunk of the group already started — at most one chunk a turn, so
       a long prompt delays the running sequences' next token by one chunk, not by its whole prefill.
       The group's own small cache holds its keys; after its last chunk each request samples its first
       token and joins a slot: its keys are copied to end at the shared cursor (`zoo.serving.slots`);
    3. decode: ONE forward of the next token of every busy slot, then each request's own sampling,
       detokenisation and stop checks; a finished request leaves its slot at once.
       With ``speculative=`` (``zoo serve --draft`` / ``--prompt-lookup``), a round of draft and verify
       instead: every slot drafts, one forward verifies all (`zoo.serving.speculative`).

A prompt that begins with blocks another prompt prefilled before reads their keys/values from the prefix
cache (`zoo.serving.prefix`) into its group's cache and prefills only the rest; after its last chunk, a
group's full prompt blocks are kept there. A request that scores its prompt (``echo``) reads nothing.

A request that asks for log-probabilities gets them from the same step (`zoo.serving.logprobs`: one
log-softmax and top-k over the rows that ask); one that asks for its prompt's (``echo``) has its group's
prefill run through the model's forward, which keeps every position's logits, chunk by chunk; with
``max_tokens`` 0 it finishes there, without taking a slot's turn.

A request held to a grammar (structured output, ``Completion.grammar``) has its row's logits masked to the
tokens the grammar allows, in the same step (`zoo.serving.sampling`), and finishes ("stop") as soon as its
text is complete. A request finishes on an end-of-sequence token, a stop string, ``max_tokens``, or when its sequence would
outgrow the model's ``max_positions`` (finish reason "length"). Greedy requests are token-equal to
``model.generate`` of each prompt alone: a slot's keys, mask and positions are those of a left-padded row.

An encoder-decoder model's prompt is its source, and its slots are batched the same way: a group of
newcomers' sources of like length (`Engine._like_sources`: as many as fit ``prefill_tokens`` padded tokens)
is encoded together in one turn, and the group runs its decoder start token at once; that step projects
each layer's cross-attention keys/values, which join the slot with the encoder output
(`zoo.serving.sources`) beside the start token's keys. From then on the decode step runs every live slot,
each attending to its own source (padded to the longest running one, masked). A source is encoded whole in one turn, however long: an encoder's attention
is bidirectional, so a source cannot be cut into chunks that give the same output. The rows' positions are
their own (a slot's decoder keys are contiguous columns, so a relative bias such as T5's, computed from
column differences, sees each row's own distances). An encoder-decoder has no prefix cache, and cannot
score its source (``echo``).

A beam request (``Completion.beam``, vLLM's ``use_beam_search``) is a group of ``best_of`` slots that share
its prompt's prefill (`zoo.serving.beams`): they run in the same decode step as every other slot, and after
it each group's search picks its beams' continuations and reorders its slots' keys within the group.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import torch

from zoo.generation import GenerationState, KVCache, TextStream
from zoo.generation.compiled import compiled_decode_step
from zoo.generation.config import check_model
from zoo.generation.constrain import Constraint, GrammarError, Vocabulary, vocabulary
from zoo.generation.session import StepFn, decode_step
from zoo.generation.weight_layout import use_decoding_layout
from zoo.serving.beams import BeamGroup, BeamGroups, check_beam
from zoo.serving.logprobs import score
from zoo.serving.prefix import DEFAULT_BYTES, PrefixCache, PrefixStats, block_keys
from zoo.serving.requests import (
    Completion,
    Delta,
    Done,
    Failed,
    FinishReason,
    PromptTooLong,
    QueueFull,
    RequestError,
    StopText,
    TokenLogprob,
)
from zoo.serving.sampling import RowSampling
from zoo.serving.slots import SlotCache
from zoo.serving.sources import SourceSlots, like_lengths
from zoo.serving.speculative import Speculation, SpeculativeStep

logger = logging.getLogger(__name__)

IDLE_WAIT_S = 0.05  # how long the idle loop sleeps on its inbox before looking at its flags again
SOURCE_SCAN = 64  # the waiting sources an encoder-decoder's group is chosen from (`Engine._like_sources`)


@dataclass
class _Job:
    """One request in the engine: its sampling state, its text so far, its slot."""

    request: Completion
    room: int  # new tokens it may still take at most: max_tokens, within max_positions
    generator: torch.Generator | None  # None: greedy
    text: TextStream
    stop: StopText
    tokens: list[int] = field(default_factory=list)
    slot: int = -1
    logprobs: list[TokenLogprob] = field(default_factory=list)  # one per token (a request that asks)
    sent: int = 0  # the log-probabilities already emitted in a Delta
    prompt_logprobs: list[TokenLogprob] = field(default_factory=list)  # echo: one per prompt token
    constraint: Constraint | None = None  # the request's grammar, as it stands
    blocks: list[bytes] | None = None  # its prompt's prefix-cache block keys, once asked for
    beam: BeamGroup | None = None  # a beam request's group, once its slots are reserved (each slot a job)

    @property
    def scores_prompt(self) -> bool:
        return self.request.echo and self.request.logprobs is not None

    @property
    def prompt_length(self) -> int:
        return len(self.request.prompt)

    @property
    def members(self) -> list[_Job]:
        """The jobs holding its slots: itself, or its beam group's (itself first)."""
        return [self] if self.beam is None else list(self.beam.members)


@dataclass
class _Prefill:
    """A group of prompts prefilled together, left-padded to T, a chunk per engine turn."""

    jobs: list[_Job]
    slots: torch.Tensor  # (k,) the slots they will join
    ids: torch.Tensor  # (k, T)
    mask: torch.Tensor  # (k, T) bool
    positions: torch.Tensor  # (k, T)
    cache: KVCache  # (k, T) columns
    chunk: int
    done: int = 0
    source: torch.Tensor | None = None  # (k, S) an encoder-decoder's sources, right-padded
    source_mask: torch.Tensor | None = None  # (k, S) bool
    memory: torch.Tensor | None = None  # (k, S, C) their encoder output, once encoded


class Engine:
    """Serve completions from ``model`` (with ``tokenizer`` to detokenise) with continuous batching.

    >>> engine = Engine(model, tokenizer, max_batch=8).start()
    >>> engine.submit([Completion(prompt=ids, max_tokens=20, emit=print)])
    >>> engine.close()
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        max_batch: int = 8,
        max_queue: int = 64,
        max_length: int | None = None,
        prefill_tokens: int = 512,
        compile: bool = False,
        prefix_cache_bytes: int = DEFAULT_BYTES,
        speculative: Speculation | None = None,
    ) -> None:
        """``max_length``: the longest sequence (prompt + new tokens) a slot holds, default and at most the
        model's ``max_positions``; ``prefill_tokens``: the padded prompt tokens one prefill chunk runs;
        ``prefix_cache_bytes``: the most the prefix cache holds (0: none; an encoder-decoder has none);
        ``speculative``: decode by draft and verify (`zoo.serving.speculative`)."""
        self.model = check_model(model)
        model.eval()
        spec = self.model.spec
        if max_batch < 1 or max_queue < 0 or prefill_tokens < 1 or prefix_cache_bytes < 0:
            raise ValueError(
                "max_batch and prefill_tokens must be >= 1, max_queue and prefix_cache_bytes >= 0"
            )
        self.seq2seq = not self.model.continues_input
        # an encoder-decoder's decoder starts from this token (`_decoder_prompt`)
        self.start_token = self.model.decoder_start_token_id if self.seq2seq else None
        self.limit = min(spec.max_positions, max_length or spec.max_positions)
        if self.limit < 2:
            raise ValueError(f"max_length ({self.limit}) leaves no room for a prompt and a new token")
        self.tokenizer = tokenizer
        self.max_batch, self.max_queue, self.prefill_tokens = max_batch, max_queue, prefill_tokens
        # the spec's end-of-sequence token, as `model.generate` reads it (outputs equal generate's)
        self.eos = {spec.eos_token_id} if spec.eos_token_id is not None else set()
        self.device = next(model.parameters()).device
        self._inbox: queue.SimpleQueue[Completion | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._in_flight = 0  # submitted and not yet finished: the queue bound counts these
        self._closing = False
        self._thread: threading.Thread | None = None
        # an encoder-decoder prefills nothing here (one `stream` a request): nothing to reuse
        self.prefix = PrefixCache(prefix_cache_bytes) if prefix_cache_bytes and not self.seq2seq else None
        if speculative is not None and compile:  # refused before the step is compiled
            raise ValueError("zoo serve: --compile does not combine with --draft / --prompt-lookup")
        self._setup_slots(compile)
        self.speculative = SpeculativeStep(self, speculative) if speculative is not None else None

    def _setup_slots(self, compile: bool) -> None:
        stack = self.model.prepare_generation(
            torch.zeros(1, 1, dtype=torch.long, device=self.device), None, num_beams=1
        ).stack
        if getattr(stack.positions, "switch_length", None) is not None:
            # LongRoPE re-rotates every cached key once a sequence passes its original context (`Session`):
            # slots of different lengths share one forward, so that cannot be done per slot.
            raise ValueError("zoo serve: models with LongRoPE scaling (switch_length) cannot be batched")
        if getattr(stack.positions, "dynamic", None) is not None:
            # dynamic NTK's rates follow the longest sequence in each forward: a slot's tokens would depend
            # on the lengths of the others sharing its steps
            raise ValueError("zoo serve: models with dynamic-NTK rotary scaling cannot be batched")
        self.stack = stack
        B, L = self.max_batch, self.limit
        self.sources = (
            SourceSlots(stack, slots=B, length=self.model.spec.max_positions) if self.seq2seq else None
        )
        self.cache = SlotCache(stack, slots=B, length=L, sources=self.sources)
        self.next_ids = torch.zeros(B, dtype=torch.long, device=self.device)  # (B,) the token each slot feeds
        self.positions = torch.zeros(B, dtype=torch.long, device=self.device)  # (B,) its position
        self.live = torch.zeros(B, dtype=torch.bool, device=self.device)  # (B,) busy slots
        self.sampling = RowSampling(
            B, self.model.spec.vocab_size, self.device
        )  # each slot's settings and penalties
        self.rows = torch.arange(B, device=self.device)  # (B,)
        self.slots: list[_Job | None] = [None] * B
        self.starts = [0] * B  # the first live column of each busy slot
        use_decoding_layout(
            self.model, rows=B
        )  # the weights' layout for B rows a step (generation.weight_layout)
        self.step: StepFn = compiled_decode_step(self.model, rows=B) if compile else decode_step
        self.state = self.model.prepare_generation(
            torch.zeros(1, 1, dtype=torch.long, device=self.device), None, num_beams=1
        )
        self.waiting: deque[_Job] = deque()
        self.prefill: _Prefill | None = None
        self.beams = BeamGroups(self.device)

    # ---- the client side (any thread) ----

    def start(self) -> Engine:
        """Start the engine's thread; returns self."""
        self._thread = threading.Thread(target=self._loop, name="zoo-serve-engine", daemon=True)
        self._thread.start()
        return self

    def check(self, request: Completion) -> None:
        """Raise `RequestError` (a bad parameter) or `PromptTooLong` for a request this engine cannot take."""
        request.check()
        vocab = self.model.input_vocab_size
        if min(request.prompt) < 0 or max(request.prompt) >= vocab:
            raise RequestError(f"prompt token ids must lie in [0, {vocab})", param="prompt")
        out = self.model.spec.vocab_size
        for name, ids in (("logit_bias", request.logit_bias), ("stop_token_ids", request.stop_token_ids)):
            if any(not 0 <= i < out for i in ids):
                raise RequestError(f"{name} token ids must lie in [0, {out})", param=name)
        if request.beam is not None:
            if self.speculative is not None:  # a draft-and-verify round has no place for a group's search
                raise RequestError(
                    "use_beam_search is not served with speculative decoding (zoo serve --draft or "
                    "--prompt-lookup); serve without it for beam requests",
                    param="use_beam_search",
                )
            check_beam(request, slots=self.max_batch, vocab_size=self.model.spec.vocab_size)
        if self.seq2seq and request.echo:  # a source is read, not predicted: nothing scores it
            raise RequestError("echo is not supported for encoder-decoder models", param="echo")
        if request.grammar is not None:
            try:
                self.vocabulary()  # built once, here rather than in the engine's step
            except GrammarError as error:
                raise RequestError(str(error), param="response_format") from None
        most = self.model.spec.max_positions if self.seq2seq else self.limit - 1
        if len(request.prompt) > most:
            raise PromptTooLong(
                f"the prompt has {len(request.prompt)} tokens; this model takes at most {most}"
                + ("" if self.seq2seq else " (to leave room for one new token)"),
                param="prompt",
            )

    def vocabulary(self) -> Vocabulary:
        """The tokenizer's tokens as the grammar engine reads them (built on first use, then cached)."""
        return vocabulary(self.tokenizer, self.model.spec.vocab_size)

    def submit(self, requests: Sequence[Completion]) -> None:
        """Queue ``requests`` together (all or none): `QueueFull` when they do not fit; `RequestError` for a
        bad one. Their events come through each request's ``emit``, from the engine's thread."""
        for request in requests:
            self.check(request)
        rows = sum(request.rows for request in requests)  # sequences: a beam request runs best_of
        if rows > self.max_batch + self.max_queue:  # never fits, busy or idle: the request is wrong
            raise RequestError(
                f"n must be at most {self.max_batch + self.max_queue} (the {self.max_batch} running and "
                f"{self.max_queue} waiting sequences this server holds), got {rows}",
                param="n",
            )
        with self._lock:
            if self._closing:
                raise QueueFull("the server is shutting down")
            if self._in_flight + rows > self.max_batch + self.max_queue:
                raise QueueFull(
                    f"the server is busy: {self.max_batch} requests running and {self.max_queue} waiting"
                )
            self._in_flight += rows
        for request in requests:
            self._inbox.put(request)

    def running(self) -> bool:
        """Whether the engine's thread runs and is not shutting down (`/health`)."""
        return self._thread is not None and self._thread.is_alive() and not self._closing

    def load(self) -> tuple[int, int, int | None]:
        """(sequences running, sequences waiting, slots), read without stopping the engine (`/metrics`): a
        busy slot is a live row; what was submitted and is not running waits (in the inbox, the queue or a
        prefill)."""
        with self._lock:  # the count of what it holds (submitted, not finished)
            held = self._in_flight
        running = int(self.live.sum())
        return running, max(held - running, 0), self.max_batch

    def prefix_stats(self) -> PrefixStats | None:
        """The prefix cache's counters (`/metrics`), or None without one."""
        return None if self.prefix is None else self.prefix.stats()

    def close(self) -> None:
        """Stop: requests still running or waiting get `Failed` ("the server is shutting down")."""
        with self._lock:
            self._closing = True
        self._inbox.put(None)
        if self._thread is not None:
            self._thread.join()

    # ---- the engine's thread ----

    def _loop(self) -> None:
        with torch.inference_mode():
            while not self._closing:
                try:
                    self._turn()
                except Exception as error:  # a bug must not kill the server: fail what ran, go on
                    logger.exception("zoo serve: engine step failed")
                    self._fail_all(f"internal error: {error}")
            self._fail_all("the server is shutting down")

    def _turn(self) -> None:
        busy = self.prefill is not None or bool(self.waiting) or any(self.slots)
        self._take(block=not busy)
        self._drop_cancelled()
        self._prefill_chunk()
        if any(self.slots):
            (self.speculative or self._decode)()

    def _take(self, *, block: bool) -> None:
        """Move new requests from the inbox to the waiting queue (waiting a little when idle)."""
        try:
            request = self._inbox.get(timeout=IDLE_WAIT_S) if block else self._inbox.get_nowait()
        except queue.Empty:
            return
        while request is not None:
            try:
                job = self._job(request)
            except GrammarError as error:  # the grammar and this tokenizer: that request alone fails
                request.emit(Failed(str(error)))
                self._retire()
                job = None
            if job is not None:
                self.waiting.append(job)
            try:
                request = self._inbox.get_nowait()
            except queue.Empty:
                return

    def _job(self, request: Completion) -> _Job:
        if self.seq2seq:
            room = min(request.max_tokens, self.limit - 1)  # after the start token
        else:
            room = min(request.max_tokens, self.limit - len(request.prompt))
        generator = None
        if request.temperature > 0:
            generator = torch.Generator(device=self.device)
            generator.manual_seed(request.seed if request.seed is not None else int(torch.seed()))
        job = _Job(request, room, generator, self._text(request), StopText(request.stop))
        if request.grammar is not None:
            stop = [*request.stop_token_ids, *(() if request.ignore_eos else self.eos)]
            job.constraint = Constraint(request.grammar, self.vocabulary(), stop=stop)
        return job

    def _text(self, request: Completion) -> TextStream:
        """A fresh text stream for ``request``'s new tokens."""
        # a source is not the beginning of the text, nor is a chat's prompt
        context = request.prompt if request.continues_prompt and not self.seq2seq else ()
        return TextStream(self.tokenizer, prompt_ids=context, skip_special_tokens=request.skip_special_tokens)

    def _drop_cancelled(self) -> None:
        for job in [j for j in self.waiting if j.request.cancelled]:
            self.waiting.remove(job)
            self._retire(job.request.rows)
        for i, held in enumerate(self.slots):  # a slot reserved by the prefill: dropped when it joins
            if held is not None and held.request.cancelled and bool(self.live[i]):
                self._release(held)
                self._retire()

    # prefill

    def _prefill_chunk(self) -> None:
        if self.prefill is None:
            self.prefill = self._start_prefill()
            if self.prefill is None:
                return
        run = self.prefill
        if run.source is not None:  # an encoder-decoder's group: encoded and started in one turn
            logits = self._encode(run)
            self.prefill = None
            self._join(run, logits)
            return
        start, end = run.done, min(run.done + run.chunk, run.ids.shape[1])
        padded = not bool(run.mask.all())  # asked once a chunk: no mask at all takes SDPA's causal path
        mask = run.mask[:, :end] if padded else None
        if any(job.scores_prompt for job in run.jobs):  # every position's logits: the forward keeps them
            model: Any = self.model  # a decoder (`check_model`): its forward takes a cache
            every = model(
                run.ids[:, start:end], mask, position_ids=run.positions[:, start:end], cache=run.cache
            ).logits  # (k, t, V)
            self._score_prompts(run, every, start)
            logits = every[:, -1]  # (k, V)
        else:
            logits = decode_step(
                self.model, run.ids[:, start:end], run.positions[:, start:end], mask, run.cache, self.state
            )  # (k, V)
        run.done = end
        if end == run.ids.shape[1]:
            self.prefill = None
            self._join(run, logits)

    def _score_prompts(self, run: _Prefill, logits: torch.Tensor, start: int) -> None:
        """The log-probabilities of the prompt tokens that the chunk's logits (k, t, V) from column ``start``
        predict (each column predicts the next one's token), for the group's requests that ask."""
        T = run.ids.shape[1]
        n = (
            min(start + logits.shape[1], T - 1) - start
        )  # the last column predicts a new token, not the prompt
        if n <= 0:
            return
        rows = [row for row, job in enumerate(run.jobs) if job.scores_prompt]
        picked = torch.tensor(rows, device=self.device)  # (e,)
        top = max(run.jobs[row].request.logprobs or 0 for row in rows)
        targets = run.ids[picked, start + 1 : start + 1 + n]  # (e, n)
        entries = score(logits[picked, :n].flatten(0, 1), targets.flatten(), top)  # e * n
        for i, row in enumerate(rows):
            job = run.jobs[row]
            first = T - job.prompt_length  # the prompt's first column: columns before it are padding
            job.prompt_logprobs += entries[i * n + max(first - start, 0) : (i + 1) * n]

    def _start_prefill(self) -> _Prefill | None:
        free = [i for i, job in enumerate(self.slots) if job is None]
        if not free or not self.waiting or self.waiting[0].request.rows > len(free):
            return None  # (a beam request waits for all its slots)
        if self.seq2seq:
            group = self._like_sources(len(free))
            longest = rest = max(job.prompt_length for job in group)
        else:
            group, longest, rest = self._prompt_group(len(free))
        slots, taken = [], 0
        for job in group:
            job.slot = free[taken]
            slots.append(job.slot)
            if job.request.beam is not None:  # a job for each slot of its group, beam i in slot i
                slots_of = free[taken : taken + job.request.rows]
                self.beams.reserve(job, slots_of, eos=self.eos, text=partial(self._text, job.request))
            taken += job.request.rows
            for member in job.members:
                self.slots[member.slot] = member  # reserved: not busy until it joins (`live`)
            if job.scores_prompt:  # nothing predicts the first token
                job.prompt_logprobs = [TokenLogprob(job.request.prompt[0], None)]
        if self.seq2seq:
            return self._start_sources(group, slots, longest)
        k, T = len(group), longest
        ids = torch.zeros(k, T, dtype=torch.long)
        mask = torch.zeros(k, T, dtype=torch.bool)
        for row, job in enumerate(group):  # left padding, as generate pads a batch
            ids[row, T - job.prompt_length :] = torch.tensor(job.request.prompt)
            mask[row, T - job.prompt_length :] = True
        ids, mask = ids.to(self.device), mask.to(self.device)
        cache = self._group_cache(k, T)
        if rest < T:
            self._read_prefixes(group, cache, T - rest)
        if self.prefix is not None:
            self.prefix.miss_tokens += sum(min(job.prompt_length, rest) for job in group)
        return _Prefill(
            jobs=group,
            slots=torch.tensor(slots, device=self.device),
            ids=ids,
            mask=mask,
            positions=(mask.long().cumsum(dim=1) - 1).clamp(min=0),  # (k, T) left pads skipped
            cache=cache,
            chunk=max(1, self.prefill_tokens // k),
            done=T - rest,
        )

    def _prompt_group(self, free: int) -> tuple[list[_Job], int, int]:
        """Waiting decoder prompts to prefill together, in order, and (longest, rest): a group runs the
        columns from the first one any row must compute, ``rest`` wide, k rows (k * rest <= the chunk's
        padded tokens); without cached prefixes every prompt is all rest, and T = rest."""
        group = [self.waiting.popleft()]
        longest, rest = group[0].prompt_length, self._uncached(group[0])
        used = group[0].request.rows  # the slots the group takes: a beam request's prompt fills best_of
        while self.waiting and used + self.waiting[0].request.rows <= free:
            rest_next = max(rest, self._uncached(self.waiting[0]))
            if rest_next * (len(group) + 1) > self.prefill_tokens:
                break
            job = self.waiting.popleft()
            group.append(job)
            longest, rest, used = max(longest, job.prompt_length), rest_next, used + job.request.rows
        return group, longest, rest

    def _like_sources(self, free: int) -> list[_Job]:
        """Waiting sources to encode together: the first in the queue, and those of the next `SOURCE_SCAN`
        whose lengths are like its (`like_lengths`), as many as fit ``free`` slots and the chunk's padded
        tokens. A group is padded to its longest, so grouping like lengths spares the encoder the padding
        that arrival order would give it (sources of 4-60 words in arrival order: 44% of the places were
        padding); a source left waiting is first in the queue within as many turns as it has jobs ahead."""
        scanned = [self.waiting[i] for i in range(min(len(self.waiting), SOURCE_SCAN))]
        chosen = like_lengths(
            [job.prompt_length for job in scanned],
            [job.request.rows for job in scanned],
            slots=free,
            budget=self.prefill_tokens,
        )
        group = [scanned[i] for i in chosen]
        for job in group:
            self.waiting.remove(job)
        return group

    def _group_cache(self, k: int, T: int) -> KVCache:
        """A prefill group's own cache: k rows of T columns (and cross-attention slots, to be filled)."""
        return KVCache(
            num_layers=self.cache.buffer.shape[0],
            batch_size=k,
            num_kv_heads=self.cache.buffer.shape[3],
            head_dim=self.cache.buffer.shape[5],
            max_length=T,
            cross_attention=self.seq2seq,
            dtype=self.cache.buffer.dtype,
            device=self.device,
        )

    def _start_sources(self, group: list[_Job], slots: list[int], longest: int) -> _Prefill:
        """An encoder-decoder's group: its sources right-padded to the longest (S), the decoder's start
        token as each row's one-column prompt."""
        k, S = len(group), longest
        source = torch.zeros(k, S, dtype=torch.long)
        source_mask = torch.zeros(k, S, dtype=torch.bool)
        for row, job in enumerate(group):  # right padding: a source's columns are [0, length) in its slot
            source[row, : job.prompt_length] = torch.tensor(job.request.prompt)
            source_mask[row, : job.prompt_length] = True
        assert self.start_token is not None  # an encoder-decoder has one (`EncoderDecoderModel`)
        return _Prefill(
            jobs=group,
            slots=torch.tensor(slots, device=self.device),
            ids=torch.full((k, 1), self.start_token, dtype=torch.long, device=self.device),
            mask=torch.ones(k, 1, dtype=torch.bool, device=self.device),
            positions=torch.zeros(k, 1, dtype=torch.long, device=self.device),
            cache=self._group_cache(k, 1),
            chunk=1,
            source=source.to(self.device),
            source_mask=source_mask.to(self.device),
        )

    def _encode(self, run: _Prefill) -> torch.Tensor:
        """Encode the group's sources, then run its start tokens, which projects every layer's cross-attention
        keys/values into the group's cache -> the first tokens' logits (k, V)."""
        assert run.source is not None and run.source_mask is not None
        padded = not bool(run.source_mask.all())
        encoded = self.model.prepare_generation(run.source, run.source_mask if padded else None, num_beams=1)
        run.memory = encoded.memory
        return decode_step(self.model, run.ids, run.positions, None, run.cache, encoded)  # (k, V)

    def _uncached(self, job: _Job) -> int:
        """The prompt tokens ``job`` must prefill: those after its longest cached block prefix (at least
        one, for the first token's logits); all of them for a request that scores its prompt (``echo``)."""
        if self.prefix is None or job.scores_prompt:
            return job.prompt_length
        if job.blocks is None:
            job.blocks = block_keys(job.request.prompt, self.prefix.block)
        return job.prompt_length - self.prefix.match(job.blocks, most=job.prompt_length - 1)

    def _read_prefixes(self, group: list[_Job], cache: KVCache, start: int) -> None:
        """Fill columns [0, start) of the group's cache (T columns, rows left-padded): each row's cached
        prompt tokens there, zeros in its pads (masked, but 0 * NaN would still be NaN); start the cache's
        cursor at ``start``, where the first chunk begins."""
        assert self.prefix is not None
        T = cache.max_length
        cache.buffer[:, :, :, :, :start].zero_()  # (N, 2, k, K, start, D)
        for row, job in enumerate(group):
            first = T - job.prompt_length  # the row's first prompt column
            reused = start - first  # its prompt tokens before the group's first computed column
            if reused > 0:
                assert job.blocks is not None  # matched in `_uncached`
                cache.buffer[:, :, row, :, first:start] = self.prefix.read(job.blocks, reused)
                self.prefix.hit_tokens += reused
        cache.length = start

    def _join(self, run: _Prefill, logits: torch.Tensor) -> None:
        """The group's first tokens; the ones not finished by it take their slots at the cursor."""
        jobs = run.jobs
        if self.prefix is not None:
            self._keep_prefixes(run)
        sampled = [None if job.beam else job for job in jobs]  # a beam group's search chooses for it
        for job in jobs:  # the slots are reserved for them: their rows sample for them from now on
            self.sampling.set(job.slot, job.request, job.constraint, prompt=self._decoder_prompt(job))
        chosen = self.sampling.choose(
            logits,
            run.slots,
            [j.request if j else None for j in sampled],
            [j.generator if j else None for j in sampled],
        )
        entries = self._logprobs(logits, chosen, jobs)
        first = chosen.tolist()
        failures = self.sampling.failures
        staying = []
        for row, job in enumerate(jobs):
            if job.request.cancelled:
                self._retire(job.request.rows)
            elif row in failures:  # its grammar failed: this request alone
                self._fail(job, failures[row])
            elif job.room == 0:  # max_tokens 0 (echo): the prompt is scored, nothing is generated
                self._finish(job, "length")
            elif job.beam is not None:
                if not self.beams.first(job.beam, logits[row]):
                    staying.append(row)
                    continue
                self._retire(job.request.rows)  # over at its first token (max_tokens 1)
            elif not self._add(job, first[row], entries[row]):
                staying.append(row)
                continue
            for member in job.members:
                self.slots[member.slot] = None
        if not staying:
            return
        T = run.ids.shape[1]
        cursor = self.cache.length
        if not self.live.any():
            self.cache.cursor.length = cursor = T  # nothing to keep: start afresh
            self.cache.mask.zero_()
        elif cursor < T:  # the prompt is longer than the running sequences: make room before the cursor
            oldest = min(
                self.starts[i] for i, job in enumerate(self.slots) if job is not None and self.live[i]
            )
            self.cache.shift(oldest, T - cursor)
            self.starts = [s + T - cursor for s in self.starts]
            cursor = T
        # each staying row fills its slot, a beam request's all of its group's (the same prompt in each)
        targets = [(row, member) for row in staying for member in jobs[row].members]
        keep = torch.tensor([row for row, _ in targets], device=self.device)  # (k',)
        rows = torch.tensor([member.slot for _, member in targets], device=self.device)  # (k',)
        keys = run.cache.buffer[:, :, keep]  # (N, 2, k', K, T, D)
        self.cache.place(rows, keys, run.mask[keep])
        if self.sources is not None:
            assert run.source_mask is not None and run.memory is not None
            filled = [layer.cross_attn for layer in run.cache.layers]  # projected by the start tokens' step
            cross = torch.stack(
                [torch.stack(slot.get()) for slot in filled if slot is not None]
            )  # (N, 2, k, K, S, D)
            self.sources.place(rows, run.memory[keep], cross[:, :, keep], run.source_mask[keep])
        lengths = [len(self._decoder_prompt(jobs[row])) for row, _ in targets]  # the columns each holds
        for (_, member), length in zip(targets, lengths):
            self.starts[member.slot] = cursor - length
        nexts: list[int] = []  # a beam group's: its beams' first tokens
        for row in staying:
            beam = jobs[row].beam
            nexts += [first[row]] if beam is None else beam.tokens()
        self.next_ids[rows] = torch.tensor(nexts, device=self.device)
        self.positions[rows] = torch.tensor(lengths, device=self.device)
        self.live[rows] = True

    def _decoder_prompt(self, job: _Job) -> Sequence[int]:
        """The tokens ``job``'s decoder starts from: its prompt, or an encoder-decoder's start token."""
        return job.request.prompt if self.start_token is None else (self.start_token,)

    def _keep_prefixes(self, run: _Prefill) -> None:
        """Keep the full prompt blocks of a finished prefill in the prefix cache (complete whatever became
        of the requests since: a cancelled one's keys are still its prompt's)."""
        assert self.prefix is not None
        T = run.ids.shape[1]
        for row, job in enumerate(run.jobs):
            if job.blocks is None:
                job.blocks = block_keys(job.request.prompt, self.prefix.block)
            if job.blocks:
                first = T - job.prompt_length
                self.prefix.insert(job.blocks, run.cache.buffer[:, :, row, :, first:])  # (N, 2, K, P, D)

    # decode

    def _decode(self) -> None:
        busy = [i for i, job in enumerate(self.slots) if job is not None and bool(self.live[i])]
        if not busy:
            return
        cache = self.cache
        busy = self._pack(busy)
        if cache.length == cache.max_length:  # compact: every live span moves to start at column 0
            oldest = min(self.starts[i] for i in busy)
            assert oldest > 0, "a slot reached the cache length without finishing"
            cache.shift(oldest, -oldest)
            self.starts = [s - oldest for s in self.starts]
        rows = busy[-1] + 1
        c = cache.length
        cache.mask[:rows, c] = True  # idle slots attend to their own column only: no row is all masked
        logits = self.step(
            self.model,
            self.next_ids[:rows, None],
            self.positions[:rows, None],
            cache.mask[:rows, : c + 1],
            cache.view(rows),  # type: ignore[arg-type]  # a StackCache, as StepFn's KVCache is
            self._state(rows),
        )  # (rows, V)
        cache.mask[:rows, c] = self.live[:rows]
        self.positions[:rows] += self.live[:rows]
        running = [  # a beam group's rows are chosen by its search, below
            job if job is not None and i in busy and job.beam is None else None
            for i, job in enumerate(self.slots[:rows])
        ]
        tokens = self.sampling.choose(
            logits,
            self.rows[:rows],
            [job.request if job is not None else None for job in running],
            [job.generator if job is not None else None for job in running],
        )
        self.next_ids[:rows] = tokens
        entries = self._logprobs(logits, tokens, running)
        chosen = tokens.tolist()
        failures = self.sampling.failures
        for i in busy:
            job = self.slots[i]
            assert job is not None
            if job.beam is not None:
                continue
            if i in failures:  # its grammar failed: this request alone
                self._fail(job, failures[i])
                self._release(job)
            elif self._add(job, chosen[i], entries[i]):
                self._release(job)
        for group in self.beams.step(logits, self.cache, self.next_ids, self.starts):
            for member in group.members:
                self._release(member)
            self._retire(len(group.members))

    def _pack(self, busy: list[int]) -> list[int]:
        """Move the last busy slots down into free ones below them, so that a step runs only as many rows
        as are busy (it runs every slot up to the last busy one): -> the busy slots after the moves. A move
        copies one slot's live columns (and its source), once; every step after it runs a row less."""
        while True:
            last = busy[-1]
            hole = next((i for i in range(last) if self.slots[i] is None), None)
            if hole is None:
                return busy
            self._move(last, hole)
            busy = sorted([*busy[:-1], hole])

    def _move(self, src: int, dst: int) -> None:
        """Slot ``src``'s request, keys, source and sampling state move to the free slot ``dst``."""
        job = self.slots[src]
        assert job is not None and self.slots[dst] is None
        start, end = self.starts[src], self.cache.length
        self.cache.buffer[:, :, dst, :, start:end] = self.cache.buffer[:, :, src, :, start:end]
        self.cache.mask[dst] = self.cache.mask[src]
        for tensor in (self.next_ids, self.positions, self.live):
            tensor[dst] = tensor[src]
        self.sampling.move(src, dst)
        if self.sources is not None:
            self.sources.move(src, dst)
        self.starts[dst], job.slot = start, dst
        self.slots[dst] = job
        self._release(job, src)

    def _state(self, rows: int) -> GenerationState:
        """The generation state of a step over slots [0, rows): an encoder-decoder's carries their sources."""
        if self.sources is None:
            return self.state
        memory, mask = self.sources.read(rows)  # (rows, S, C), (rows, S)
        return replace(self.state, memory=memory, memory_mask=mask)

    def _logprobs(
        self, logits: torch.Tensor, tokens: torch.Tensor, jobs: Sequence[_Job | None]
    ) -> list[TokenLogprob | None]:
        """For each of R rows (logits (R, V), tokens (R,)): its token's log-probability when its job asks,
        computed for the rows that ask at once; None for the others."""
        rows = [i for i, job in enumerate(jobs) if job is not None and job.request.logprobs is not None]
        found: list[TokenLogprob | None] = [None] * len(jobs)
        if not rows:
            return found
        picked = torch.tensor(rows, device=logits.device)  # (r,)
        top = max(jobs[i].request.logprobs or 0 for i in rows)  # type: ignore[union-attr]
        for i, entry in zip(rows, score(logits[picked], tokens[picked], top)):
            found[i] = entry
        return found

    # per request

    def _add(self, job: _Job, token: int, logprob: TokenLogprob | None = None) -> bool:
        """Record a new token of ``job`` (and its log-probability, when asked for): emit its new text, or
        finish it (True) when it ended."""
        job.tokens.append(token)
        if logprob is not None:
            job.logprobs.append(logprob)
        request = job.request  # an end token is not detokenised: the text ends here
        ended = (token in self.eos and not request.ignore_eos) or token in request.stop_token_ids
        # the grammar's text is whole with this token: it ends here too (no end token needed)
        complete = not ended and job.constraint is not None and job.constraint.done
        text = job.text.flush() if ended else job.text.push(token)
        if complete:
            text += job.text.flush()
            ended = True
        piece, stopped = job.stop.add(text)
        full = len(job.tokens) >= job.room
        if full and not (stopped or ended):
            more, stopped = job.stop.add(job.text.flush())
            piece += more
        if not (stopped or ended or full):
            if piece:
                self._delta(job, piece, token)
            return False
        if not stopped:
            piece += job.stop.rest()
        if piece:
            self._delta(job, piece, token)
        self._finish(job, "stop" if stopped or ended else "length")
        return True

    def _delta(self, job: _Job, piece: str, token: int) -> None:
        """Emit new text, with the log-probabilities not sent yet (a token held back, as a possible start
        of a stop string, is sent with the text that follows it)."""
        job.request.emit(Delta(piece, (token,), tuple(job.logprobs[job.sent :])))
        job.sent = len(job.logprobs)

    def _finish(self, job: _Job, reason: FinishReason) -> None:
        job.request.emit(
            Done(
                job.stop.text,
                tuple(job.tokens),
                reason,
                job.prompt_length,
                tuple(job.logprobs),
                tuple(job.prompt_logprobs),
            )
        )
        self._retire()

    def _fail(self, job: _Job, message: str) -> None:
        """End ``job`` with `Failed` (a client that left hears nothing)."""
        if not job.request.cancelled:
            job.request.emit(Failed(message))
        self._retire()

    def _release(self, job: _Job, slot: int | None = None) -> None:
        """Free ``job``'s slot (it finished, or was cancelled), or ``slot``, which it left (`_move`)."""
        i = job.slot if slot is None else slot
        self.slots[i] = None
        self.live[i] = False
        self.cache.mask[i] = False
        self.positions[i] = 0
        self.next_ids[i] = 0
        if self.sources is not None:
            self.sources.free(i)

    def _retire(self, count: int = 1) -> None:
        with self._lock:
            self._in_flight -= count

    def _fail_all(self, message: str) -> None:
        """Fail every request the engine holds (and any still in its inbox), and reset the batch."""
        jobs = list(self.waiting) + [job for job in self.slots if job is not None]
        held = sum(job.request.rows for job in self.waiting) + len(jobs) - len(self.waiting)
        self.waiting.clear()
        self.beams.clear()
        self.prefill = None
        self.slots = [None] * self.max_batch
        self.live.zero_()
        self.cache.mask.zero_()
        self.positions.zero_()
        if self.sources is not None:
            self.sources.clear()
        requests = list({id(job.request): job.request for job in jobs}.values())  # a beam's slots: one
        while True:
            try:
                request = self._inbox.get_nowait()
            except queue.Empty:
                break
            if request is not None:
                requests.append(request)
                held += request.rows
        for request in requests:
            if not request.cancelled:
                request.emit(Failed(message))
        self._retire(held)
