"""Completions sampled from the model being trained, through zoo's serving engine, in the same process.

`sample` hands every (prompt, seed) to a `zoo.serving.Engine` built on the model itself — its current
weights, adapters included, no copy — and waits for them all. The engine batches them in its slots
(continuous batching, one KV cache of ``min(rows, max_batch)`` x ``max_length`` positions, freed when the
call returns), and a group's prompt is prefilled once and read from its prefix cache by the others. Each
completion samples with its own seeded generator (`zoo.serving.requests.Completion.seed`): the same seeds on
the same weights give the same tokens, whatever else runs beside them — what makes a resumed GRPO run
sample as the straight one did. The model is put in eval mode (no dropout) while it samples, and back in
the mode it was in afterwards.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from torch import nn

from zoo.serving import Completion, Done, Engine, Failed
from zoo.serving.requests import Event
from zoo.training.config import ConfigError

MAX_SLOTS = 64  # sequences decoded together at most; more wait for a free slot


@dataclass(frozen=True)
class Sampling:
    """How completions are sampled (GRPO's generation settings)."""

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0


@dataclass(frozen=True)
class Sampled:
    token_ids: tuple[int, ...]  # every generated token, the end-of-sequence (or end-of-turn) token included
    finished: bool  # it ended on an end token (else it ran out of max_new_tokens or of positions)


def sample(
    model: nn.Module,
    tokenizer: object,
    prompts: Sequence[Sequence[int]],
    seeds: Sequence[int],
    sampling: Sampling,
    *,
    stop_token_ids: Sequence[int] = (),
    max_length: int | None = None,
    continues_prompt: bool = True,
) -> list[Sampled]:
    """One completion of each prompt, prompt ``i`` sampled with generator seed ``seeds[i]``; ``max_length``:
    the longest prompt + completion a slot holds (default: the model's ``max_positions``)."""
    if any(type(p).__name__ == "DTensor" for p in model.parameters()):
        raise ConfigError(
            "task grpo samples from whole weights: distributed.strategy fsdp shards them; use ddp or one process"
        )
    rows = len(prompts)
    was_training = model.training
    engine = Engine(
        model,
        tokenizer,
        max_batch=min(rows, MAX_SLOTS),
        max_queue=rows,
        max_length=max_length,
    )
    results: list[Event | None] = [None] * rows
    done = threading.Event()
    left = [rows]
    lock = threading.Lock()

    def collect(i: int) -> Callable[[Event], None]:  # the engine's thread calls it with request i's events
        def emit(event: Event) -> None:
            if isinstance(event, Done | Failed):
                results[i] = event
                with lock:
                    left[0] -= 1
                    if not left[0]:
                        done.set()

        return emit

    requests = [
        Completion(
            prompt=list(prompt),
            max_tokens=sampling.max_new_tokens,
            emit=collect(i),
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k,
            seed=seed,
            stop_token_ids=tuple(stop_token_ids),
            continues_prompt=continues_prompt,
        )
        for i, (prompt, seed) in enumerate(zip(prompts, seeds))
    ]
    engine.start()
    try:
        engine.submit(requests)
        done.wait()
    finally:
        engine.close()
        model.train(was_training)
    sampled = []
    for event in results:
        if not isinstance(event, Done):
            message = event.message if isinstance(event, Failed) else "no answer"
            raise RuntimeError(f"sampling a completion failed: {message}")
        sampled.append(Sampled(event.token_ids, event.finish_reason == "stop"))
    return sampled
