"""How much a spec may ask for, given the tensors a file holds: checked before anything is built.

A checkpoint carries its own spec (zoo's metadata, or Hugging Face's config.json), and the spec decides how
many layers are built and how large the fixed tables are. A 400 kB file whose spec says
``num_layers: 10**9`` would have the loader build a billion layers. So the spec is first held against the
tensors the file's headers describe:

    layers      each stack's stored layers (1 when ALBERT-shared)  <=  the layers the file has tensors for
    widths      d_model, vocab_size, d_ff, every attention's heads  <=  the largest dimension of any tensor
    size        parameters + fixed buffer elements                   <=  ZOO_MAX_PARAMETERS (counted on a
                                                                         meta-device build, after the two above)
    allocation  fixed tables (sinusoids, rotary angles, ALiBi)
                + tensors initialised afresh (``strict=False``)      <=  max(file's elements, TABLE_ALLOWANCE)

The first two hold for every file zoo writes and every Hugging Face checkpoint whose config matches its
weights (a layer has tensors, a width is some tensor's dimension), so they refuse only files whose spec
contradicts their tensors (``strict=False`` does not relax them). The third is a budget: a small model with
a very long context (a 64-wide head and a million positions: 2**27 table elements) needs it raised, with
the environment variable ``ZOO_MAX_TABLE_ELEMENTS=268435456`` (the CLI too) or, in Python,
``zoo.io.checkpoint.limits.TABLE_ALLOWANCE = 2**28``; both are read at each load, the variable first.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from torch import nn

from zoo.io.checkpoint.files import CheckpointError
from zoo.models.build import check_size
from zoo.spec import ModelSpec, SpecError
from zoo.spec.limits import env_limit

# Elements (not bytes) a load may allocate beyond what the file holds: 2**25 float32 is 128 MiB.
TABLE_ALLOWANCE = 2**25
ALLOWANCE_ENV = "ZOO_MAX_TABLE_ELEMENTS"


def table_allowance() -> int:
    """``$ZOO_MAX_TABLE_ELEMENTS`` when set (an integer; ``1e9`` is accepted), else `TABLE_ALLOWANCE`."""
    return env_limit(ALLOWANCE_ENV, TABLE_ALLOWANCE)


def zoo_layers_held(names: Iterable[str], stack: str) -> set[int]:
    """Layer indices of ``stack`` that zoo tensor ``names`` hold (``decoder.layers.3.…`` -> 3)."""
    pattern = re.compile(rf"{re.escape(stack)}\.layers\.(\d+)\.")
    return {int(match[1]) for name in names if (match := pattern.match(name))}


def numbered_parts(names: Iterable[str]) -> set[int]:
    """Every number that is a whole dotted part of a tensor name (``h.3.attn`` -> 3): whatever a Hugging Face
    family calls its layers (``h``, ``layers``, ``layer``, ``block``), a checkpoint with N layers has N."""
    return {int(part) for name in names for part in name.split(".") if part.isascii() and part.isdigit()}


def check_spec_fits(
    spec: ModelSpec,
    shapes: Mapping[str, tuple[int, ...]],
    layers_held: Mapping[str, set[int]],
    *,
    source: str,
    held_by: str = "the file",
    error: type[ValueError] = CheckpointError,
) -> None:
    """Refuse ``spec`` when it asks for more layers or wider tensors than ``shapes`` (name -> shape) hold,
    or a model over ``ZOO_MAX_PARAMETERS`` (`zoo.models.build.check_size`).

    ``layers_held``: for each stack name, the layer indices the file holds tensors for. Raises ``error``
    naming ``source`` and the spec field (or the limit), before anything but the meta-device count is built
    from the spec; the layers and widths first, so that count runs on what the file can hold.
    """
    for name, stack in spec.stacks().items():
        stored = 1 if stack.share_layers else stack.num_layers
        held = layers_held.get(name, set())
        if stored > len(held):
            raise error(
                f"{source}: the spec says {stack.sources['num_layers']} {stack.num_layers}"
                f"{' (one shared layer)' if stack.share_layers else ''} but {held_by} holds tensors for "
                f"{len(held)} layer{'s' if len(held) != 1 else ''}; refusing to build it"
            )
    largest = max((n for shape in shapes.values() for n in shape), default=0)
    for field, value in _widths(spec):
        if value > largest:
            raise error(
                f"{source}: the spec says {field} {value} but the largest tensor dimension in {held_by} is "
                f"{largest}; refusing to build it"
            )
    try:
        check_size(spec)
    except SpecError as problem:
        raise error(f"{source}: {problem}") from None


def check_allocation(
    model: nn.Module,
    spec: ModelSpec,
    *,
    loaded: set[str],
    file_elements: int,
    source: str,
    error: type[ValueError] = CheckpointError,
) -> None:
    """Refuse to give a meta-built ``model`` real storage when the tensors the file does not provide (fixed
    tables, and those not ``loaded`` from it) exceed ``max(file_elements, TABLE_ALLOWANCE)`` elements."""
    tables = sum(
        buffer.numel()
        for module in model.modules()
        for name, buffer in module._buffers.items()
        if buffer is not None and name in module._non_persistent_buffers_set
    )
    fresh = {name: t for name, t in model.state_dict().items() if name not in loaded}
    needed = tables + sum(t.numel() for t in fresh.values())
    allowance = max(file_elements, table_allowance())
    if needed <= allowance:
        return
    parts = [f"fixed tables for max_positions {spec.max_positions}: {tables:,}"] if tables else []
    if fresh:
        largest = max(fresh, key=lambda name: fresh[name].numel())
        parts.append(
            f"{len(fresh)} tensors not in the file (largest {largest} {list(fresh[largest].shape)}): "
            f"{needed - tables:,}"
        )
    raise error(
        f"{source}: the spec needs {needed:,} elements the file does not hold ({'; '.join(parts)}), more "
        f"than the {allowance:,} allowed (as many as the file holds, and at least {ALLOWANCE_ENV} or "
        f"zoo.io.checkpoint.limits.TABLE_ALLOWANCE); refusing to allocate them (to allow it: "
        f"{ALLOWANCE_ENV}={needed})"
    )


def _widths(spec: ModelSpec) -> list[tuple[str, Any]]:
    """(field, value) for each width that is a dimension of some tensor of the model the spec describes."""
    widths: list[tuple[str, Any]] = [("d_model", spec.d_model), ("vocab_size", spec.vocab_size)]
    source_vocab = getattr(spec, "source_vocab_size", None)  # encoder-decoder specs only
    if source_vocab:
        widths.append(("source_vocab_size", source_vocab))
    for stack in spec.stacks().values():
        widths.append((f"{stack.sources['ffn']}.d_ff", stack.ffn.d_ff))
        for role in ("attention", "cross_attention"):
            attention = getattr(stack, role)
            if attention is not None:
                widths.append((f"{stack.sources[role]}.num_heads", attention.num_heads))
    return widths
