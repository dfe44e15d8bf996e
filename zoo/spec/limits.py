"""Upper bounds on what a spec may ask for: each field when it validates, the whole model before it is built.

A spec is data, often from a file: ``num_layers: 1000000000`` is easy to write and would otherwise hang
``zoo show`` building a billion layers, or end in an allocator traceback. Each bound is generous (several
times today's largest published models) and can be raised with an environment variable:

    ZOO_MAX_PARAMETERS  1e12       parameters + fixed buffer elements, the whole model (`parameters_message`)
    ZOO_MAX_LAYERS      10,000     num_layers of each stack
    ZOO_MAX_POSITIONS   1,048,576  max_positions, and a learned table's offset
    ZOO_MAX_WIDTH       1,048,576  d_model, factorized_dim, d_ff, num_heads, num_kv_heads, head_dim, num_buckets
    ZOO_MAX_VOCAB       16,777,216 vocab_size, source_vocab_size, segment_vocab_size, num_labels

The fields are checked when a spec validates (`check_limits`; no torch). The whole model's size is
counted on the model itself, built on the meta device, and refused there before any real allocation
(`zoo.models.build.check_size`; zoo.spec imports no torch, so the count cannot run here).

The variables are read at every check, so ``os.environ["ZOO_MAX_LAYERS"] = "20000"`` takes effect for the
next spec. Values are integers (``1_000_000`` and ``1e13`` are accepted).

Two more bounds live here for what configs and commands ask of the machine rather than of a spec:

    ZOO_MAX_VOCAB       also bounds a tokenizer's trained vocab_size (the BPE trainer allocates by it)
    ZOO_MAX_THREADS     4 per CPU   num_threads (torch.set_num_threads: each thread has its own stack)
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from zoo.spec.blocks import InputEmbeddingSpec
from zoo.spec.errors import number
from zoo.spec.stacks import ResolvedStack


class LimitedSpec(Protocol):
    """What the field limits read from a model spec (`zoo.spec.model` validates with this module, so it
    cannot be imported here); family-specific fields (heads, source_vocab_size) are read if present."""

    @property
    def vocab_size(self) -> int: ...
    @property
    def d_model(self) -> int: ...
    @property
    def max_positions(self) -> int: ...
    @property
    def embedding(self) -> InputEmbeddingSpec: ...
    def stacks(self) -> dict[str, ResolvedStack]: ...


def env_limit(env: str, default: int) -> int:
    """``$env`` when set (a positive integer; ``1e9`` is accepted), else ``default``; read at every check."""
    text = os.environ.get(env, "").strip()
    if not text:
        return default
    try:
        value = int(float(text)) if any(c in text for c in ".eE") else int(text)
    except (ValueError, OverflowError):
        value = 0
    if value <= 0:
        raise ValueError(f"the environment variable {env} must be a positive integer, got {text[:40]!r}")
    return value


@dataclass(frozen=True)
class Limit:
    env: str  # the environment variable that overrides it
    default: int
    unit: str  # what is counted, for messages

    @property
    def value(self) -> int:
        return env_limit(self.env, self.default)


PARAMETERS = Limit("ZOO_MAX_PARAMETERS", 10**12, "parameters and buffer elements")
LAYERS = Limit("ZOO_MAX_LAYERS", 10_000, "layers per stack")
POSITIONS = Limit("ZOO_MAX_POSITIONS", 2**20, "positions")
WIDTH = Limit("ZOO_MAX_WIDTH", 2**20, "")
VOCAB = Limit("ZOO_MAX_VOCAB", 2**24, "")


def check_limits(spec: LimitedSpec) -> None:
    """Raise ValueError naming the field, its value, the limit and how to raise it, if a field of ``spec``
    is too big. A build may then trust every size (the whole model's is checked on its meta-device build)."""
    for field, value, limit in _fields(spec):
        if value is not None and value > limit.value:
            raise ValueError(_message(field, value, limit))


def parameters_message(params: int, buffers: int) -> str | None:
    """Why a model of ``params`` parameters and ``buffers`` fixed buffer elements is too big (one line,
    naming ``ZOO_MAX_PARAMETERS`` and how to raise it), or None when it is within the limit."""
    if params + buffers <= PARAMETERS.value:
        return None
    return (
        f"the model would have {number(params)} parameters and {number(buffers)} fixed buffer elements, "
        f"over the limit of {number(PARAMETERS.value)} {PARAMETERS.unit}; "
        f"set the environment variable {PARAMETERS.env} to allow more (e.g. {PARAMETERS.env}={params + buffers})"
    )


def _message(field: str, value: int, limit: Limit) -> str:
    unit = f" {limit.unit}" if limit.unit else ""
    return (
        f"{field} ({number(value)}) is over the limit of {number(limit.value)}{unit}; "
        f"set the environment variable {limit.env} to allow more (e.g. {limit.env}={value})"
        if value.bit_length() <= 100
        else f"{field} ({number(value)}) is over the limit of {number(limit.value)}{unit} ({limit.env})"
    )


def _fields(spec: LimitedSpec) -> Iterator[tuple[str, int | None, Limit]]:
    """(dotted field, value, limit) for every size a spec sets, stack overrides under their own path."""
    yield "vocab_size", spec.vocab_size, VOCAB
    yield "source_vocab_size", getattr(spec, "source_vocab_size", None), VOCAB
    heads: Any = getattr(spec, "heads", None)
    yield "heads.num_labels", getattr(heads, "num_labels", None), VOCAB
    # a dual encoder's (`zoo.spec.dual`): the projection, SigLIP's text head and attention-pooling MLP
    yield "heads.projection.dim", getattr(getattr(heads, "projection", None), "dim", None), WIDTH
    yield "heads.text_head_dim", getattr(heads, "text_head_dim", None), WIDTH
    yield "heads.image_pooling.d_ff", getattr(getattr(heads, "image_pooling", None), "d_ff", None), WIDTH
    yield "embedding.segment_vocab_size", spec.embedding.segment_vocab_size, VOCAB
    yield "d_model", spec.d_model, WIDTH
    yield "embedding.factorized_dim", spec.embedding.factorized_dim, WIDTH
    yield "max_positions", spec.max_positions, POSITIONS
    for stack in spec.stacks().values():
        src = stack.sources
        yield src["num_layers"], stack.num_layers, LAYERS
        for block in ("attention", "cross_attention"):
            attention = getattr(stack, block)
            if attention is not None:
                yield f"{src[block]}.num_heads", attention.num_heads, WIDTH
                yield f"{src[block]}.num_kv_heads", attention.num_kv_heads, WIDTH
                yield f"{src[block]}.head_dim", attention.head_dim, WIDTH
        yield f"{src['ffn']}.d_ff", stack.ffn.d_ff, WIDTH
        if stack.ffn.kind == "moe":
            for field in ("num_experts", "shared_d_ff", "dense_d_ff"):
                yield f"{src['ffn']}.{field}", getattr(stack.ffn, field), WIDTH
        if stack.embedding is not None:
            yield f"{stack.name}.embedding.max_positions", stack.embedding.max_positions, POSITIONS
            yield f"{stack.name}.embedding.num_mel_bins", stack.embedding.num_mel_bins, WIDTH
        position = stack.position
        if position.kind == "learned":
            yield f"{src['position']}.offset", position.offset, POSITIONS
            if position.relative_bias is not None:
                yield (
                    f"{src['position']}.relative_bias.num_buckets",
                    position.relative_bias.num_buckets,
                    WIDTH,
                )
        if position.kind == "relative_bias":
            yield f"{src['position']}.num_buckets", position.num_buckets, WIDTH


MAX_MIN_FREQUENCY = 2**32 - 1  # a tokenizer's min_frequency: a count of occurrences (tokenizers takes a u64)


def max_threads() -> int:
    """The most CPU threads a config may ask for: ``$ZOO_MAX_THREADS``, else 4 per CPU of this machine (a
    thread pool of 100,000 ends in a MemoryError or a panic, and past the CPU count only adds contention)."""
    return env_limit("ZOO_MAX_THREADS", 4 * (os.cpu_count() or 1))


def threads_message(field: str, value: int) -> str | None:
    """Why ``value`` CPU threads are too many for ``field``, or None when they are not."""
    limit = max_threads()
    if value <= limit:
        return None
    return (
        f"{field} ({number(value)}) is more than the {limit} threads this machine allows ({os.cpu_count()} "
        f"CPUs); set the environment variable ZOO_MAX_THREADS to allow more"
    )


def over_limit(field: str, value: int, limit: Limit) -> str | None:
    """Why ``value`` is too large for ``field`` under ``limit`` (naming how to raise it), or None."""
    return _message(field, value, limit) if value > limit.value else None
