"""Every layer's self-attention mask for one forward of a stack, built once per distinct pattern.

    layer patterns ──> one mask per distinct pattern (block_sparse with random blocks: one per layer)
        full / causal, nothing unusual ──> `masks.self_attention_mask`: None and SDPA's is_causal fast path
        flex_attention chosen          ──> a flex `BlockMask` (`zoo.blocks.flex`)
        otherwise                      ──> `masks.pattern_mask`: a dense bool mask for SDPA

"Nothing unusual" means no rolling KV cache, no 3-D user mask, no packed documents and, for prefix_lm, no
prefix lengths. Packed documents (``document_ids``) AND every pattern with `masks.within_documents`; on
long rows flex_attention then skips the blocks between documents, as it does for the sparse patterns.
A sliding window (or a chunk) at least as long as the sequence is plain causal (or full) attention and takes
that path.

Packed rows whose every layer is full or causal attention, where flex_attention is not chosen and the
stack needs no dense scores (``segmentable``), skip the dense mask: a `segments.SegmentPlan` regroups each
document's tokens and attention runs per group of documents (`zoo.blocks.segments`), the same rule
computed without the scores between documents. Cross-attention over packed pairs likewise.

Cross-attention has one mask for every layer (`cross_attention_mask`): the source padding, or for packed
(source, target) pairs the pair rule (`masks.pair_rule`), dense for SDPA or a flex `BlockMask` on the
same terms as self-attention's.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, replace

import torch
from torch.nn.attention.flex_attention import BlockMask

from zoo.blocks import flex, masks, segments
from zoo.spec.patterns import (
    AttentionPattern,
    BlockSparsePattern,
    ChunkedPattern,
    SlidingWindowPattern,
)

LayerMask = tuple[
    torch.Tensor | BlockMask | segments.SegmentPlan | None, bool
]  # (mask, is_causal) for `Attention.forward`


@dataclass(frozen=True)
class StackPatterns:
    """A stack's layer patterns, grouped once at build time: each group shares one mask per forward."""

    distinct: tuple[AttentionPattern, ...]  # one per group
    seeds: tuple[int, ...]  # per group: the layer index a block-sparse layout is seeded with
    group_of: tuple[int, ...]  # per layer application: its group

    @classmethod
    def of(cls, patterns: Sequence[AttentionPattern]) -> StackPatterns:
        keys: dict[Hashable, int] = {}
        distinct: list[AttentionPattern] = []
        seeds: list[int] = []
        group_of: list[int] = []
        for layer, pattern in enumerate(patterns):
            per_layer = isinstance(pattern, BlockSparsePattern) and pattern.random_blocks > 0  # seed + layer
            key = (pattern, layer if per_layer else None)
            if key not in keys:
                keys[key] = len(distinct)
                distinct.append(pattern)
                seeds.append(layer)
            group_of.append(keys[key])
        return cls(tuple(distinct), tuple(seeds), tuple(group_of))

    @property
    def all(self) -> list[AttentionPattern]:
        """One pattern per layer application."""
        return [self.distinct[group] for group in self.group_of]


def self_attention_masks(
    patterns: StackPatterns,
    *,
    causal: bool,
    attention_mask: torch.Tensor | None,
    q_len: int,
    offset: int = 0,
    key_positions: torch.Tensor | None = None,
    prefix_lengths: torch.Tensor | None = None,
    document_ids: torch.Tensor | None = None,
    dense_only: bool = False,
    grad: bool = False,
    segmentable: bool = False,
    device: torch.device,
) -> list[LayerMask]:
    """One (mask, is_causal) per layer application, for ``q_len`` queries after ``offset`` cached positions.

    ``attention_mask``: None, the (B, offset + q_len) padding or a (B, q_len, offset + q_len) bool user mask.
    ``key_positions`` (Tk,): a rolling KV cache's key positions in slot order (-1 = empty), else None; they
    apply to the sliding-window layers (the ones that roll), the others' keys being in order.
    ``prefix_lengths`` (B,): prefix_lm's prefixes in real tokens. ``document_ids`` (B, q_len): the document
    of each token of packed rows (no cache), which no query looks out of. ``dense_only``: the call needs the dense
    mask (weights returned, a position bias, attention dropout); ``grad``: gradients flow through it.
    ``segmentable``: the layers may take a `segments.SegmentPlan` for packed rows (no weights returned, no
    position bias, no soft-capping or sinks).
    Traceable by torch.compile: no spec object is built or hashed here.
    """
    length = offset + q_len
    plain = attention_mask is None or attention_mask.dim() == 2  # padding, not a 3-D user mask
    dense_only = dense_only or (grad and device.type == "cpu")
    if segmentable and document_ids is not None and plain and offset == 0 and key_positions is None:
        planned = _segment_plans(
            patterns, attention_mask, document_ids, q_len=q_len, dense_only=dense_only, device=device
        )
        if planned is not None:
            return planned
    frames: dict[bool, masks.Frame] = {}  # by whether the keys come from rolling slots
    built: list[LayerMask] = []
    for pattern, seed in zip(patterns.distinct, patterns.seeds):
        kind = pattern.kind
        rolled = key_positions if isinstance(pattern, SlidingWindowPattern) else None
        if (
            isinstance(pattern, SlidingWindowPattern)
            and not torch.compiler.is_exporting()  # exported: the window mask, right for every length
            and length <= pattern.window
        ):
            kind = "causal" if causal else "full"  # a window spanning the sequence hides nothing
        if (
            isinstance(pattern, ChunkedPattern)
            and not torch.compiler.is_exporting()
            and length <= pattern.size
        ):
            kind = "causal"  # one chunk holds the whole sequence
        if kind == "prefix_lm" and prefix_lengths is None:
            kind = "causal"
        use_flex = flex.use_flex(
            kind,
            q_len=q_len,
            device=device,
            dense_only=dense_only,
            documents=document_ids is not None,
        )
        simple = plain and rolled is None and document_ids is None
        if not use_flex and simple and kind in ("full", "causal"):
            built.append(
                masks.self_attention_mask(
                    attention_mask, q_len=q_len, k_len=length, causal=causal, device=device
                )
            )
            continue
        frame = frames.get(rolled is not None)
        if frame is None:
            frame = frames[rolled is not None] = masks.make_frame(
                attention_mask, q_len=q_len, offset=offset, key_positions=rolled, device=device
            )
        prefix, framed = None, frame
        if kind == "prefix_lm" and prefix_lengths is not None:
            padding = attention_mask if plain else None
            prefix = masks.prefix_keys(prefix_lengths.to(device), padding, length=length)  # (B, length)
            framed = replace(frame, batch=prefix.shape[0])  # the rule varies by row even without padding
        chunks = None
        if isinstance(pattern, ChunkedPattern):
            chunks = masks.chunk_table(
                attention_mask if plain else None,
                document_ids.to(device) if document_ids is not None else None,
                size=pattern.size,
                length=length,
                device=device,
            )  # (B|1, length)
            framed = replace(framed, batch=max(framed.batch, chunks.shape[0]))  # the rule varies by row
        rule = masks.pattern_rule(
            pattern if kind == pattern.kind else None,
            causal=causal,
            layer=seed,
            length=length,
            prefix=prefix,
            chunks=chunks,
            device=device,
        )
        if document_ids is not None:
            rule = masks.within_documents(rule, document_ids.to(device))
            framed = replace(framed, batch=document_ids.shape[0])  # the rule varies by row
        if use_flex:
            built.append((flex.block_mask(rule, framed, tile=flex.tile_for(pattern)), False))
        else:
            built.append((masks.pattern_mask(rule, framed), False))
    return [built[group] for group in patterns.group_of]


def _segment_plans(
    patterns: StackPatterns,
    padding: torch.Tensor | None,
    documents: torch.Tensor,
    *,
    q_len: int,
    dense_only: bool,
    device: torch.device,
) -> list[LayerMask] | None:
    """Per layer application, the `segments.SegmentPlan` of its pattern (full, or causal inside each
    document, as `masks.pattern_rule` reads them); None where a layer has another pattern, flex_attention is
    chosen, or the plan cannot be made (the dense or flex path then)."""
    kinds = [pattern.kind for pattern in patterns.distinct]
    if any(kind not in ("full", "causal") for kind in kinds):
        return None
    if flex.use_flex("causal", q_len=q_len, device=device, dense_only=dense_only, documents=True):
        return None
    plans: dict[str, segments.SegmentPlan] = {}
    for kind in set(kinds):
        plan = segments.self_plan(documents, padding, causal=kind == "causal")
        if plan is None:
            return None
        plans[kind] = plan
    return [(plans[kinds[group]], False) for group in patterns.group_of]


def with_position_bias(
    layer_masks: list[LayerMask], bias: torch.Tensor, *, q_len: int, k_len: int, dtype: torch.dtype
) -> list[LayerMask]:
    """Fold an additive position bias (T5's relative bias, ALiBi) into every distinct dense mask, once."""
    folded: dict[tuple[int, bool], LayerMask] = {}
    out = []
    for mask, is_causal in layer_masks:
        key = (id(mask), is_causal)
        if key not in folded:
            dense = mask
            if is_causal:  # the bias must be materialised, so the causal mask must be too
                dense = masks.causal_mask(q_len, k_len, device=bias.device)[None, None]
            assert not isinstance(dense, (BlockMask, segments.SegmentPlan)), (
                "a position bias takes the dense path"
            )
            folded[key] = masks.with_bias(dense, bias, dtype=dtype), False
        out.append(folded[key])
    return out


def cross_attention_mask(
    memory_mask: torch.Tensor | None,
    *,
    document_ids: torch.Tensor | None = None,
    memory_document_ids: torch.Tensor | None = None,
    q_len: int,
    padding: torch.Tensor | None = None,
    dense_only: bool = False,
    grad: bool = False,
    segmentable: bool = False,
    device: torch.device,
) -> torch.Tensor | BlockMask | segments.SegmentPlan | None:
    """Cross-attention's mask, shared by every layer: ``memory_mask`` (B, S) source padding -> (B, 1, 1, S)
    (None without padding). With packed pairs, ``document_ids`` (B, q_len) and ``memory_document_ids``
    (B, S), a pair id per target and per source token: each target query reads only its own pair's source,
    a dense (B, 1, q_len, S) mask, or a flex `BlockMask` where `flex.use_flex` picks flex for packed rows.
    ``dense_only``, ``grad`` and ``segmentable`` as in `self_attention_masks`; ``padding`` (B, q_len) the
    targets' padding (1 = token), for the plan."""
    if document_ids is None or memory_document_ids is None:
        return masks.cross_attention_mask(memory_mask)
    dense_only = dense_only or (grad and device.type == "cpu")
    use_flex = flex.use_flex("full", q_len=q_len, device=device, dense_only=dense_only, documents=True)
    if segmentable and not use_flex:
        plan = segments.cross_plan(document_ids, padding, memory_document_ids, memory_mask)
        if plan is not None:
            return plan
    frame = masks.cross_frame(
        memory_mask,
        q_len=q_len,
        k_len=memory_document_ids.shape[1],
        rows=document_ids.shape[0],
        device=device,
    )
    rule = masks.pair_rule(document_ids.to(device), memory_document_ids.to(device))
    return flex.block_mask(rule, frame) if use_flex else masks.pattern_mask(rule, frame)
