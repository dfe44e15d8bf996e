"""Packed rows regrouped by document for SDPA: attention that computes no score between two documents.

Shapes: B rows, T query length, S key length, H query heads, K key/value heads, D head dim; N real tokens,
G documents in a group, L a group's length.

A packed row's mask is block-diagonal (`masks.same_document`; `masks.same_pair` for cross-attention), and a
CPU's SDPA kernels skip no masked score: a row of 256 tokens holding documents of 20, 60 and 170 computes
256² scores per head and uses 20² + 60² + 170² (52%) of them. Here the tokens of each document are
gathered into a row of their own, documents of like length side by side in a group right-padded to its
longest (`SegmentPlan`), each group goes through SDPA, and the outputs go back where the tokens came from:

    packed rows (B, T)              groups (G, L)
    [a a a b b c c c c c c]         [c c c c c c]                       G = 1, L = 6
    [d d e e e e - - - - -]         [e e e e] [a a a -]                 G = 2, L = 4
                                    [b b] [d d]                         G = 2, L = 2

It is the rule of the dense mask, computed per document: a query reads keys of its own document only (by
construction), not after itself in a causal stack (``is_causal`` inside the group: with right padding a
real query's earlier keys are all real, so no mask is needed), and never a group's padding (a key mask
otherwise). Padding queries and tokens of no document (id -1 or padding in the mask) get zeros, where the
dense path gives finite garbage nobody reads. tests/blocks/test_segments.py checks it against
`masks.pattern_mask`.

The plan reads document ids on the host, so it is made only where that is free (`masks.values_readable`:
CPU tensors, not traced); `zoo.stacks` uses it where the dense mask would be used (flex_attention not
chosen) and nothing needs the dense scores (returned weights, a position bias, soft-capping, sinks).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from zoo.blocks.masks import values_readable

GROUP_RATIO = 0.75  # a document joins a group while at least this fraction of the group's longest
SMALL = 32  # documents this short share one group whatever their lengths (their scores cost little)
# The plan is used only when it spares each query at least this many keys' scores on average: gathering and
# scattering cost a few copies of every token, which short rows do not earn back (bench/seq2seq_packing.py,
# on a CPU: rows of 64 holding pairs of ~10 tokens were 19% slower than with the dense mask, rows of 256
# holding pairs of 5-200 tokens 6% faster).
MIN_KEYS_SPARED = 64


@dataclass(frozen=True)
class SegmentPlan:
    """Where each group's query and key slots come from, and where the outputs go back.

    ``queries`` (sum G Lq,) flat indices into the (B T) queries, group after group; ``keys`` (sum G Lk,)
    into the (B S) keys (None: the queries' own slots, self-attention); ``shapes`` (G, Lq, Lk) per group;
    ``key_masks`` per group (G, 1, 1, Lk) bool True = a real key, or None (every key real, or causal);
    ``back`` (B T,) for each query token its slot in the concatenated group outputs (the last slot + 1, a
    zero row, for tokens of no document); ``causal``: causal inside each document."""

    queries: torch.Tensor
    keys: torch.Tensor | None
    shapes: tuple[tuple[int, int, int], ...]
    key_masks: tuple[torch.Tensor | None, ...]
    back: torch.Tensor
    causal: bool
    rows: int  # B
    length: int  # T


def _documents(documents: torch.Tensor, keep: torch.Tensor | None, span: int) -> tuple[torch.Tensor, ...]:
    """(B, T) document ids (-1: none, all below ``span``) and padding (1 = token) -> each document's key
    (row * span + id, ascending), its tokens' flat indices grouped document after document in order, and
    each document's start and length there."""
    B, T = documents.shape
    real = documents >= 0
    if keep is not None:
        real = real & keep.bool()
    key = (torch.arange(B)[:, None] * span + documents)[real]  # (N,) row-major
    flat = torch.arange(B * T).view(B, T)[real]  # (N,)
    key, order = torch.sort(key, stable=True)
    ids, lengths = torch.unique_consecutive(key, return_counts=True)
    starts = torch.cumsum(lengths, 0) - lengths
    return ids, flat[order], starts, lengths


def _groups(lengths: torch.Tensor) -> list[torch.Tensor]:
    """Document indices in groups of like length, longest first: a group takes documents while they are at
    least `GROUP_RATIO` of its longest, or all of them once that is at most `SMALL`."""
    order = torch.argsort(lengths, descending=True, stable=True).tolist()
    sizes = lengths.tolist()
    groups: list[list[int]] = []
    longest = 0
    for i in order:
        if not groups or (longest > SMALL and sizes[i] < GROUP_RATIO * longest):
            groups.append([])
            longest = sizes[i]
        groups[-1].append(i)
    return [torch.tensor(g) for g in groups]


def _slots(
    flat: torch.Tensor, starts: torch.Tensor, lengths: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """One group's (G, L) slots: each document's token indices right-padded with its last one (never read),
    the (G, L) bool of real slots, and L."""
    width = int(lengths.max())
    step = torch.arange(width)[None]  # (1, L)
    real = step < lengths[:, None]  # (G, L)
    at = starts[:, None] + torch.minimum(step, lengths[:, None] - 1)  # (G, L)
    return flat[at], real, width


def self_plan(documents: torch.Tensor, padding: torch.Tensor | None, *, causal: bool) -> SegmentPlan | None:
    """The plan of a stack's self-attention over packed rows: ``documents`` (B, T) ids, ``padding`` (B, T)
    1 = token or None. None where the ids cannot be read for free, or no token has a document."""
    if not values_readable(documents) or bool((documents < 0).all()):
        return None
    B, T = documents.shape
    _, flat, starts, lengths = _documents(documents, padding, int(documents.max()) + 1)
    if len(lengths) == 0 or not _spares_enough(int((lengths * lengths).sum()), B, T, T):  # at best
        return None
    queries, shapes, key_masks, real_slots = [], [], [], []
    for group in _groups(lengths):
        slots, real, width = _slots(flat, starts[group], lengths[group])
        queries.append(slots.flatten())
        real_slots.append(real.flatten())
        shapes.append((len(group), width, width))
        padded = not causal and not bool(real.all())
        key_masks.append(real[:, None, None, :] if padded else None)  # (G, 1, 1, L)
    if not _spares_enough(sum(G * Lq * Lk for G, Lq, Lk in shapes), B, T, T):
        return None
    query_index = torch.cat(queries)
    return SegmentPlan(
        query_index, None, tuple(shapes), tuple(key_masks), _back(query_index, torch.cat(real_slots), B * T),
        causal, B, T,
    )  # fmt: skip


def cross_plan(
    documents: torch.Tensor,
    padding: torch.Tensor | None,
    memory_documents: torch.Tensor,
    memory_padding: torch.Tensor | None,
) -> SegmentPlan | None:
    """The plan of cross-attention over packed (source, target) pairs: target queries ``documents`` (B, T)
    read the source keys ``memory_documents`` (B, S) of their own pair, padding (1 = token) or None each.
    None where the ids cannot be read for free or a target pair has no source token (the dense path)."""
    if not (values_readable(documents) and values_readable(memory_documents)):
        return None
    if bool((documents < 0).all()):
        return None
    B, T = documents.shape
    span = max(int(documents.max()), int(memory_documents.max())) + 1  # the same (row, id) key both sides
    q_ids, q_flat, q_starts, q_lengths = _documents(documents, padding, span)
    k_ids, k_flat, k_starts, k_lengths = _documents(memory_documents, memory_padding, span)
    if len(q_ids) == 0 or len(k_ids) == 0:
        return None
    at = torch.searchsorted(k_ids, q_ids).clamp(max=len(k_ids) - 1)  # each target pair's source
    if not bool((k_ids[at] == q_ids).all()):
        return None
    k_starts, k_lengths = k_starts[at], k_lengths[at]
    S = memory_documents.shape[1]
    if not _spares_enough(int((q_lengths * k_lengths).sum()), B, T, S):  # even without group padding
        return None
    queries, keys, shapes, key_masks, real_slots = [], [], [], [], []
    for group in _groups(torch.maximum(q_lengths, k_lengths)):
        q_slots, q_real, q_width = _slots(q_flat, q_starts[group], q_lengths[group])
        k_slots, k_real, k_width = _slots(k_flat, k_starts[group], k_lengths[group])
        queries.append(q_slots.flatten())
        keys.append(k_slots.flatten())
        real_slots.append(q_real.flatten())
        shapes.append((len(group), q_width, k_width))
        key_masks.append(None if bool(k_real.all()) else k_real[:, None, None, :])  # (G, 1, 1, Lk)
    if not _spares_enough(sum(G * Lq * Lk for G, Lq, Lk in shapes), B, T, S):
        return None
    query_index = torch.cat(queries)
    return SegmentPlan(
        query_index, torch.cat(keys), tuple(shapes), tuple(key_masks),
        _back(query_index, torch.cat(real_slots), B * T), False, B, T,
    )  # fmt: skip


def _spares_enough(scores: int, B: int, T: int, S: int) -> bool:
    """Whether ``scores`` are at least `MIN_KEYS_SPARED` per query fewer than the dense mask's (B T S)."""
    return B * T * S - scores >= MIN_KEYS_SPARED * B * T


def _back(queries: torch.Tensor, real: torch.Tensor, tokens: int) -> torch.Tensor:
    """(tokens,) each query token's slot among the groups' outputs; tokens in no slot: one past the last."""
    back = torch.full((tokens,), len(queries), dtype=torch.long)
    back[queries[real]] = torch.nonzero(real).squeeze(1)
    return back


Kernel = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, "torch.Tensor | None", bool], torch.Tensor]
"""(q, k, v, mask, is_causal) -> output: SDPA as `zoo.blocks.attention.sdpa` calls it."""


def attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: SegmentPlan, kernel: Kernel
) -> torch.Tensor:
    """q (B, H, T, D), k (B, K, S, D), v (B, K, S, Dv) of packed rows -> (B, H, T, Dv): each group of
    documents gathered, attended by ``kernel``, and put back (zeros for tokens of no document)."""
    B, H, T, D = q.shape
    K, S, Dv = k.shape[1], k.shape[2], v.shape[3]
    q_flat = q.transpose(1, 2).reshape(B * T, H, D)
    k_flat, v_flat = k.transpose(1, 2).reshape(B * S, K, D), v.transpose(1, 2).reshape(B * S, K, Dv)
    keys = plan.queries if plan.keys is None else plan.keys
    q_all = q_flat.index_select(0, plan.queries)  # (sum G Lq, H, D)
    k_all, v_all = k_flat.index_select(0, keys), v_flat.index_select(0, keys)  # (sum G Lk, K, D|Dv)
    # split, not sliced: a slice's gradient is a zero tensor of the whole as large as q_all, one per group
    q_groups = q_all.split([G * Lq for G, Lq, _ in plan.shapes])
    k_groups = k_all.split([G * Lk for G, _, Lk in plan.shapes])
    v_groups = v_all.split([G * Lk for G, _, Lk in plan.shapes])
    outs = []
    for (G, Lq, Lk), mask, qg, kg, vg in zip(plan.shapes, plan.key_masks, q_groups, k_groups, v_groups):
        qg = qg.view(G, Lq, H, D).transpose(1, 2)  # (G, H, Lq, D)
        kg, vg = kg.view(G, Lk, K, D).transpose(1, 2), vg.view(G, Lk, K, Dv).transpose(1, 2)  # (G, K, Lk, D)
        out = kernel(qg, kg, vg, mask, plan.causal)  # (G, H, Lq, Dv)
        outs.append(out.transpose(1, 2).reshape(G * Lq, H, Dv))
    outs.append(q_flat.new_zeros(1, H, Dv))  # the slot of tokens of no document
    out = torch.cat(outs).index_select(0, plan.back)  # (B T, H, Dv)
    return out.view(B, T, H, Dv).transpose(1, 2)  # (B, H, T, Dv)
