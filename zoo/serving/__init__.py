"""Serving: a continuous-batching engine and an OpenAI-compatible HTTP layer (``zoo serve``).

    engine = Engine(model, tokenizer, max_batch=8).start()      # slots, one batched KV cache, a thread
    engine.submit([Completion(prompt=ids, max_tokens=20, emit=callback)])
    engine.submit([Completion(prompt=ids, max_tokens=20, emit=callback, beam=BeamSettings(4, n=2))])
    app = create_app(engine, tokenizer, model_name="tiny")       # FastAPI (the `serve` extra), lazily

`zoo.serving.engine` schedules and decodes, `zoo.serving.slots` owns the batched cache, `zoo.serving.prefix`
keeps shared prompt prefixes' keys/values, `zoo.serving.beams` runs beam requests as groups of slots,
`zoo.serving.speculative` decodes by draft and verify, `zoo.serving.api` speaks HTTP, `zoo.serving.tools` reads and
forces tool calls, `zoo.serving.server` runs it (docs/serving.md).
"""

from zoo.serving.engine import Engine
from zoo.serving.requests import (
    BeamSettings,
    Completion,
    Delta,
    Done,
    Failed,
    PromptTooLong,
    QueueFull,
    RequestError,
)
from zoo.serving.speculative import Speculation

__all__ = [
    "BeamSettings",
    "Completion",
    "Delta",
    "Done",
    "Engine",
    "Failed",
    "PromptTooLong",
    "QueueFull",
    "RequestError",
    "Speculation",
]
