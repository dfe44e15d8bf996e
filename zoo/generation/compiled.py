"""`decode_step` through ``torch.compile``, and the housekeeping of its compiled graphs.

torch.compile keeps compiled graphs on the code object of the function it compiles (and, where a graph
breaks, on the code of the functions it breaks in). zoo compiles only `decode_step` and private copies of
it, so the graphs dropped here are zoo's own: never ``torch._dynamo.reset()``, which would throw away every
compiled graph in the user's process.

    weights as inputs    one compiled `decode_step` serves every model and every weight update
    frozen weights       the weights are constants of the graph: one compiled copy per model, its graphs
                         dropped when the weights change in place, and when the model is collected
"""

from __future__ import annotations

import functools
import types
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from zoo.generation.protocol import GenerativeModel
from zoo.generation.session import StepFn, decode_step


def compiled_decode_step(model: GenerativeModel, *, rows: int) -> StepFn:
    """`decode_step` for ``model`` through ``torch.compile`` (dynamic shapes: the attended length grows).

    Half-precision models are compiled with Inductor's weight *freezing*: the weights become constants of
    the compiled graph, prepacked for oneDNN, which is where most of the speed comes from on CPU (bf16 decode
    ~1.4x faster than compiling without it). float32 is not frozen: at batch 8 prepacked weights lose to
    the default kernels (18.1 vs 15.8 ms/token on the bench's GPT shape), and at one or two rows the
    column-major layout (`zoo.generation.weight_layout`) reads the weights as fast as prepacking did, without
    a frozen copy of them.

    Frozen constants are one model's weights at one moment, so they must live in one graph on code of the
    model's own, where they can be dropped alone; ``fullgraph=True`` holds the frozen path to one graph.
    Padded batches compile to one graph too: the step never asks the mask whether it pads (`zoo.blocks.masks`:
    a given mask is applied; generation passes None for a batch without padding, decided once per call).
    """
    parameters = list(model.parameters())
    freeze = parameters[0].dtype in (torch.bfloat16, torch.float16)
    if not freeze:
        return _shared_step()
    versions = tuple(p._version for p in parameters)
    entry = _FROZEN.get(model)
    if entry is None:
        own = _copy_function(decode_step)
        entry = _FROZEN[model] = _FrozenStep(versions, own.__code__, _compile(own, freeze=True))
        # The model is gone: so are its graphs (not at interpreter exit, when torch may be half torn down).
        weakref.finalize(model, _drop_graphs, own.__code__).atexit = False
    elif entry.versions != versions:  # an in-place update since (an optimizer step, load_state_dict)
        _drop_graphs(entry.code)  # stale constants: the next call compiles anew
        entry.versions = versions
    return entry.step


@dataclass
class _FrozenStep:
    versions: tuple[int, ...]  # the weights' versions its constants were taken at
    code: types.CodeType  # its own copy of decode_step's code, where its graphs live
    step: StepFn


_FROZEN: weakref.WeakKeyDictionary[GenerativeModel, _FrozenStep] = weakref.WeakKeyDictionary()


@functools.cache
def _shared_step() -> StepFn:
    """Weights are graph inputs here, never baked in: one compiled step serves every model."""
    return _compile(decode_step, freeze=False)


def _compile(fn: StepFn, *, freeze: bool) -> StepFn:
    from torch._inductor import config as inductor_config  # heavy: only when compiling

    compiled = torch.compile(fn, dynamic=True, fullgraph=freeze)

    def step(*args: Any) -> torch.Tensor:
        # Compilation is lazy (first call, and any recompile), so the setting must hold around the call.
        with inductor_config.patch(freezing=freeze):
            return compiled(*args)

    return step


def _drop_graphs(code: types.CodeType) -> None:
    """Free the compiled graphs of one code object, and nothing else.

    torch.compiler has no public per-function reset (2.13's ``isolate_recompiles`` keeps each compile's
    graphs apart but never frees them), so this is ``torch._dynamo.reset_code``, on zoo's own copy.
    """
    torch._dynamo.reset_code(code)


def _copy_function(fn: Callable[..., Any]) -> types.FunctionType:
    """``fn`` with a code object of its own (``code.replace()`` returns a copy), so the graphs compiled
    from the copy are kept apart from the original's and from every other copy's."""
    return types.FunctionType(
        fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__
    )
