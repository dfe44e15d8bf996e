"""Attention patterns: which keys each query of a stack's self-attention may see.

A stack has one pattern (``pattern``), or one per layer (``layer_patterns``: Gemma-style alternation of
local and global layers, Qwen2's ``max_window_layers``). Padding is composed with every pattern;
cross-attention is never patterned (it sees the whole source, minus its padding).

    full            every key                                   encoder stacks (the default there)
    causal          keys j <= i                                 causal stacks (the default there)
    sliding_window  causal: i - window < j <= i; bidirectional: |i - j| < window   (Mistral; Longformer)
    prefix_lm       j <= i, or j inside the row's prefix        decoder-only stacks (UniLM, T5's prefix LM)
    block_sparse    window, global and random blocks            encoder stacks (BigBird, Zaheer et al. 2020)
    chunked         causal, j in the same chunk of size tokens  causal stacks (Llama 4's attention_chunk_size)

Which pattern fits which stack is checked by the model spec (`zoo.spec.model`), where the stack is known.
This module imports no torch.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, NonNegativeInt, PositiveInt

from zoo.spec.blocks import Spec


class FullPattern(Spec):
    """Every query sees every (non-padding) key: bidirectional attention."""

    kind: Literal["full"] = "full"


class CausalPattern(Spec):
    """Query i sees keys j <= i: the standard decoder."""

    kind: Literal["causal"] = "causal"


class SlidingWindowPattern(Spec):
    """A local window of ``window`` keys (Mistral's ``sliding_window``; Longformer's local attention).

    In a causal stack query i sees keys i - window < j <= i (``window`` keys, itself included), as
    transformers' Mistral does; in a bidirectional stack it sees |i - j| < window. A decoder whose every
    layer has a window decodes with a rolling KV cache of ``window`` keys per layer.
    """

    kind: Literal["sliding_window"] = "sliding_window"
    window: PositiveInt = Field(description="Keys each query sees (causal: itself and window - 1 before).")


class PrefixLMPattern(Spec):
    """Bidirectional over a prefix, causal after it (UniLM; Raffel et al. 2020's prefix LM).

    Query i sees key j if j <= i or j lies in its row's prefix. Prefix lengths are given per row at forward
    time (``prefix_lengths=`` of a decoder-only model's forward, counted in real tokens); without them the
    stack is plainly causal.
    """

    kind: Literal["prefix_lm"] = "prefix_lm"


class BlockSparsePattern(Spec):
    """BigBird's block-sparse attention (Zaheer et al. 2020, ITC variant), bidirectional stacks only.

    The sequence is cut into blocks of ``block_size`` (the last one may be shorter). A query block sees the
    ``window_blocks`` blocks centred on it, the ``global_blocks`` first and last blocks (which also see
    everything), and ``random_blocks`` more chosen from the rest by a generator seeded with
    ``seed + layer index``: fixed per layer, the same for every batch.
    """

    kind: Literal["block_sparse"] = "block_sparse"
    block_size: PositiveInt = Field(64, description="Tokens per block; a shorter last block is allowed.")
    window_blocks: PositiveInt = Field(
        3, description="Odd: the query's own block and (window_blocks - 1) / 2 blocks on each side."
    )
    global_blocks: NonNegativeInt = Field(
        1, description="Blocks at the start and as many at the end that attend to and are seen by all."
    )
    random_blocks: NonNegativeInt = Field(
        3, description="Extra blocks per query block, drawn among those it does not already see."
    )
    seed: NonNegativeInt = Field(0, description="The random blocks of layer i come from seed + i.")


class ChunkedPattern(Spec):
    """Chunked local attention (Llama 4's ``attention_chunk_size``), causal stacks only.

    A row's tokens are cut into fixed chunks of ``size`` by their position (counted from the row's first real
    token, and from each packed document's start): query i sees keys j <= i of its own chunk only. Unlike a
    sliding window, the first query of a chunk sees itself alone, so a rolling cache of ``size`` keys would not
    do: chunked layers decode with the full cache.
    """

    kind: Literal["chunked"] = "chunked"
    size: PositiveInt = Field(description="Tokens per chunk (attention_chunk_size).")


AttentionPattern = Annotated[
    FullPattern
    | CausalPattern
    | SlidingWindowPattern
    | PrefixLMPattern
    | BlockSparsePattern
    | ChunkedPattern,
    Field(discriminator="kind"),
]
