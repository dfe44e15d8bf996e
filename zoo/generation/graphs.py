"""``compile="cuda-graphs"``: the per-token decode step captured once per run as a CUDA graph, then replayed.

At batch 1 a decode step is a few hundred small kernels, and on a GPU launching them from Python costs more
than running them. A CUDA graph records the kernels of one step once and replays them with one launch. A
graph replays fixed kernels on fixed addresses with fixed shapes, so the step it records must not grow:

    static shapes    the stack is shown a cache of L - 1 positions and one new query (L = prompt + new
                     tokens, the preallocated length), so every mask, key length and kernel is sized by L
                     alone; attention reads all L slots of the preallocated buffer through a (B, L) mask
                     ``seen`` that hides the slots not written yet and the prompt's left padding
    device index     the step writes its key/value at the real position, a (1,) device tensor, and
                     ``seen = padding & (arange(L) <= position)`` is computed inside the graph
    static inputs    ids (B, 1), positions (B|1, 1) and the write position are copied into buffers the
                     graph reads before each replay; the logits come out in a buffer the graph writes
    per run          the graph is captured at the first per-token step of a run, after the prefill, because
                     the run's KV cache and encoder output are the addresses it records; it dies with the run

The query is not told its own position through ``offset`` (the stack's ``cache.length``): it sits at L - 1
for the mask, which under a causal rule lets it see every key, and ``seen`` hides the rest. That is right for
causal full attention and for positions given by ``position_ids`` (learned, sinusoidal, rotary). It is wrong
for a position *bias* over query-key distances (T5's relative bias, ALiBi), for a rolling sliding-window
cache and for LongRoPE's switch of tables, so those refuse (`unsupported`).

On a device other than CUDA there is nothing to capture: the same static-shape step runs eagerly, so the
option is portable and the arithmetic is the one the graph replays (tested on CPU against eager decoding).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from zoo.generation.cache import CrossAttentionSlot, KVCache, SelfAttentionSlot
from zoo.generation.protocol import GenerationState, GenerativeModel

# Shapes: B rows, L preallocated length, K kv heads, D head dim, V vocab.


def unsupported(stack: Any, cache: KVCache) -> str | None:
    """Why a static-shape step cannot serve this run's decoder stack and cache, or None when it can."""
    positions = stack.positions
    if positions.role == "bias" or stack.position_bias is not None:
        return "its position bias (relative / ALiBi) depends on the query's position, which a graph fixes"
    if cache.window is not None:
        return "its sliding-window layers keep a rolling KV cache"
    if getattr(positions, "switch_length", None) is not None:
        return "LongRoPE switches rotary tables mid-run"
    if getattr(stack, "temperature_tuning", None) is not None:
        return "its temperature tuning scales each query by its slot, which a graph fixes"
    kinds = {pattern.kind for pattern in stack.patterns.distinct}
    if not kinds <= {"causal", "full", "sliding_window"}:
        return f"its attention patterns {sorted(kinds)} need the query's position"
    return None


class _StaticSlot:
    """A self-attention slot that writes this step's key/value at a device-side position and hands attention
    the whole (B, K, L, D) buffer."""

    filled = False

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, index: torch.Tensor) -> None:
        self._keys, self._values, self._index = keys, values, index  # (B, K, L, D) x 2, (1,) long

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self._keys.index_copy_(2, self._index, k.to(self._keys.dtype))  # k (B, K, 1, D)
        self._values.index_copy_(2, self._index, v.to(self._values.dtype))
        return self._keys, self._values

    def get(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self._keys, self._values


@dataclass
class _Slots:
    self_attn: _StaticSlot
    cross_attn: CrossAttentionSlot | None


class _StaticView:
    """The `zoo.stacks.StackCache` the static step shows the stack: L - 1 positions cached, keys in order."""

    def __init__(self, cache: KVCache, index: torch.Tensor) -> None:
        self.length = cache.max_length - 1
        slots = []
        for layer in cache.layers:
            assert isinstance(layer.self_attn, SelfAttentionSlot)  # no rolling layers (`unsupported`)
            slots.append(_Slots(_StaticSlot(*layer.self_attn.buffers, index), layer.cross_attn))
        self.layers: Sequence[_Slots] = slots

    def key_positions(self, new: int) -> None:
        return None

    def advance(self, steps: int) -> None:
        pass  # the run's own cache is advanced by `CudaGraphStep`, outside the graph


class _Static:
    """One run's static buffers, and its graph once captured."""

    def __init__(
        self,
        model: GenerativeModel,
        ids: torch.Tensor,
        position_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        cache: KVCache,
        state: GenerationState,
    ) -> None:
        B, L, device = ids.shape[0], cache.max_length, ids.device
        self.model, self.state, self.cache = model, state, cache
        self.ids = ids.clone()  # (B, 1)
        self.position_ids = position_ids.clone()  # (B|1, 1)
        self.index = torch.zeros(1, dtype=torch.long, device=device)  # (1,) the position written
        padding = torch.ones(B, L, dtype=torch.bool, device=device)  # (B, L): new tokens are real
        if attention_mask is not None:
            padding[:, : attention_mask.shape[1]] = attention_mask.bool()
        self.padding, self.slots = padding, torch.arange(L, device=device)  # (L,)
        self.view = _StaticView(cache, self.index)
        # Unwritten slots are read (under a False mask): zeros, because 0 x NaN from empty memory is NaN.
        for layer in self.view.layers:
            for buffer in (layer.self_attn._keys, layer.self_attn._values):
                buffer[:, :, cache.length :].zero_()
        self.graph: Any = None
        self.logits: torch.Tensor | None = None

    def forward(self) -> torch.Tensor:
        """The step on the static buffers: (B, V) logits. Everything here is what the graph records."""
        seen = self.padding & (self.slots <= self.index)  # (B, L)
        return self.model.next_token_logits(self.ids, self.position_ids, seen, self.view, self.state)

    def capture(self) -> None:
        """Warm up on a side stream (lazy initialisations must not happen while capturing), then record."""
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            self.forward()  # writes this step's key/value: the replay rewrites the same values
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.logits = self.forward()


class CudaGraphStep:
    """A `zoo.generation.session.StepFn` for one run: the per-token step on static shapes, captured as a CUDA
    graph at its first call on CUDA (run eagerly elsewhere). One instance per run (`generate`'s ``prepare``)."""

    def __init__(self) -> None:
        self._static: _Static | None = None

    def __call__(
        self,
        model: GenerativeModel,
        ids: torch.Tensor,
        position_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        cache: KVCache | None,
        state: GenerationState,
    ) -> torch.Tensor:
        """ids (B, 1), position_ids (B|1, 1), attention_mask (B, cached + 1) or None -> logits (B, V)."""
        if cache is None or not isinstance(cache, KVCache):
            raise ValueError("compile='cuda-graphs' needs the KV cache (use_cache=True)")
        static = self._static
        if static is None or static.cache is not cache:
            reason = unsupported(state.stack, cache)
            if reason is not None:
                raise ValueError(
                    f"compile='cuda-graphs' cannot decode this model: {reason}; use compile=True"
                )
            static = self._static = _Static(model, ids, position_ids, attention_mask, cache, state)
        static.ids.copy_(ids)
        static.position_ids.copy_(position_ids)
        static.index.fill_(cache.length)
        if ids.device.type != "cuda":
            logits = static.forward()
        else:
            if static.graph is None:
                static.capture()
            static.graph.replay()
            assert static.logits is not None
            logits = static.logits.clone()  # the graph overwrites its output at the next replay
        cache.advance(ids.shape[1])
        return logits
