"""Block-sparse attention through ``torch.nn.attention.flex_attention``, for the attention patterns.

A patterned mask (`zoo.blocks.masks`) is mostly empty at long lengths: a window of 256 over 4096 keys
hides 94% of the scores. SDPA with a dense boolean mask still computes every score (and on CPU turns the
mask into a (B, 1, Tq, Tk) float bias first); flex_attention skips the empty key blocks and applies the
rule only inside the blocks that are partly visible. The rule is the same function the dense mask is built
from, evaluated at the kernel's indices as a ``mask_mod``, so the two paths cannot disagree.

Which kernel runs a call (`attention_kernel`, or the ``ZOO_ATTENTION_KERNEL`` environment variable):

    auto (default)  flex for sliding_window, block_sparse and prefix_lm calls, and for packed documents
                    (flex's document mask), with at least `FLEX_MIN_QUERIES` queries, where flex can run
                    them; SDPA with the dense mask otherwise
    flex            flex for every pattern (full and causal included), wherever flex can run the call
    sdpa            never flex

Under ``torch.export`` (`zoo.export`) every pattern takes SDPA with the dense mask: the exported graph
must serve every length, so it cannot pick a kernel by the traced one.

Flex cannot run a call that asks for the attention weights (``output_attentions``), adds a position bias
(T5's relative bias, ALiBi), applies attention dropout in training, or needs gradients on a CPU (torch has
no CPU backward for it); those take SDPA whatever the setting. flex_attention is compiled
(``torch.compile``) on first use per shape; a query row with no visible key gives zeros (SDPA's path opens
such rows instead): both are rows nobody reads.

Soft-capped attention (`AttentionSpec.softcap`, Gemma 2) runs here with `softcap_score_mod` as the
``score_mod``; on the dense path, where SDPA has no soft-capping, `zoo.blocks.attention` takes the math path.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Literal

import torch
from torch.nn.attention.flex_attention import BlockMask, flex_attention

from zoo.blocks.masks import Frame, Rule
from zoo.spec.patterns import AttentionPattern, BlockSparsePattern

Kernel = Literal["auto", "flex", "sdpa"]
KERNELS: tuple[Kernel, ...] = ("auto", "flex", "sdpa")
SPARSE_PATTERNS = ("sliding_window", "block_sparse", "prefix_lm", "chunked")
# Below this many queries the dense mask is cheap: on CPU the two kernels were even at 1024 (bench/README.md).
FLEX_MIN_QUERIES = 1024
BLOCK = 128  # flex_attention's default tile: (BLOCK queries) x (BLOCK keys) per block-table entry

_kernel: list[Kernel] = []  # the innermost `attention_kernel` setting, if any


def _env_kernel() -> Kernel:
    value = os.environ.get("ZOO_ATTENTION_KERNEL", "auto")
    if value not in KERNELS:
        raise ValueError(f"ZOO_ATTENTION_KERNEL={value!r}: expected one of {', '.join(KERNELS)}")
    return value


@contextmanager
def attention_kernel(kernel: Kernel) -> Iterator[None]:
    """Run self-attention with ``kernel`` inside the block (like ``torch.nn.attention.sdpa_kernel``).

    >>> with zoo.blocks.flex.attention_kernel("sdpa"):
    ...     model(ids)  # the dense-mask path, whatever the length
    """
    if kernel not in KERNELS:
        raise ValueError(f"attention_kernel: kernel {kernel!r} is not one of {', '.join(KERNELS)}")
    _kernel.append(kernel)
    try:
        yield
    finally:
        _kernel.pop()


def current_kernel() -> Kernel:
    """The kernel setting in force: the innermost `attention_kernel`, else ``ZOO_ATTENTION_KERNEL``."""
    return _kernel[-1] if _kernel else _env_kernel()


def use_flex(
    pattern_kind: str, *, q_len: int, device: torch.device, dense_only: bool, documents: bool = False
) -> bool:
    """Whether a self-attention call with this pattern should run through flex_attention.

    ``dense_only``: the call needs the dense mask (weights returned, a position bias, dropout, CPU grads).
    ``documents``: the rows pack several documents (a block-diagonal mask: sparse, whatever the pattern).
    """
    kernel = current_kernel()
    if kernel == "sdpa" or dense_only or device.type not in ("cpu", "cuda"):
        return False
    if torch.compiler.is_exporting():  # one graph for every length: no choice made on the traced one
        return False
    if kernel == "flex":
        return True
    return (pattern_kind in SPARSE_PATTERNS or documents) and q_len >= FLEX_MIN_QUERIES


def tile_for(pattern: AttentionPattern) -> int:
    """The block-table tile for ``pattern``: BigBird's own block when it is 32 or 64 wide (its blocks then
    fill whole tiles: measured 2x faster at 4096 than 128-wide tiles cutting through them), else `BLOCK`."""
    if isinstance(pattern, BlockSparsePattern) and pattern.block_size in (32, 64):
        return pattern.block_size
    return BLOCK


def block_mask(rule: Rule | None, frame: Frame, *, tile: int = BLOCK) -> BlockMask:
    """The flex_attention block mask of ``rule`` composed with ``frame`` (padding, cache slots, user mask).

    The block tables are computed one query tile at a time, so building them takes O(tile x Tk) memory
    instead of create_block_mask's dense (B, Tq, Tk).
    """
    q_pos, k_pos, keep, user = frame.q_pos, frame.k_pos, frame.keep, frame.user
    Tq, Tk, rows, device = len(q_pos), len(k_pos), frame.rows, q_pos.device
    row_ids = torch.arange(rows, device=device)[:, None, None]

    def mask_mod(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        allowed = rule(b, q_pos[q_idx], k_pos[kv_idx]) if rule is not None else q_idx >= 0
        if keep is not None:
            allowed = allowed & keep[b, kv_idx]
        if user is not None:
            allowed = allowed & user[b, q_idx, kv_idx]
        return allowed

    q_blocks, k_blocks = -(-Tq // tile), -(-Tk // tile)
    partial = torch.zeros(rows, q_blocks, k_blocks, dtype=torch.bool, device=device)
    full = torch.zeros_like(partial)
    k_idx = torch.arange(Tk, device=device)[None, None, :]
    for i in range(q_blocks):  # one query tile at a time: (rows, tile, Tk) bool, never (rows, Tq, Tk)
        q_idx = torch.arange(i * tile, min((i + 1) * tile, Tq), device=device)
        rows_of = mask_mod(row_ids, None, q_idx[None, :, None], k_idx).expand(rows, len(q_idx), Tk)
        rows_of = torch.nn.functional.pad(rows_of, (0, k_blocks * tile - Tk))  # past the end: hidden
        blocks = rows_of.view(rows, len(q_idx), k_blocks, tile)
        seen, everything = blocks.any(dim=(1, 3)), blocks.all(dim=(1, 3))
        full[:, i] = everything & (len(q_idx) == tile)  # a short last query tile stays partial
        partial[:, i] = seen & ~full[:, i]
    return BlockMask.from_kv_blocks(
        *_ordered(partial), *_ordered(full), BLOCK_SIZE=tile, mask_mod=mask_mod, seq_lengths=(Tq, Tk)
    )


def _ordered(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, Q, K) bool block table -> (rows, 1, Q) counts and (rows, 1, Q, K) indices, visible first."""
    counts = blocks.sum(dim=-1, dtype=torch.int32)
    indices = blocks.to(torch.int8).argsort(dim=-1, descending=True, stable=True).to(torch.int32)
    return counts[:, None], indices[:, None]


@functools.cache  # one function per cap: the compiled flex_attention is not retraced for a new closure
def softcap_score_mod(cap: float) -> Any:
    """flex_attention's ``score_mod`` for Gemma 2's logit soft-capping: score -> cap * tanh(score / cap),
    applied to the scaled score before the mask, as the math path (`zoo.blocks.attention`) does."""

    def score_mod(score: Any, b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        return torch.tanh(score / cap) * cap

    return score_mod


def flex_attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: BlockMask,
    *,
    scale: float,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """q (B, H, T, D), k/v (B, K, S, D) with K dividing H -> (B, H, T, D), through compiled flex_attention;
    ``softcap``: soft-capped scores (`softcap_score_mod`); ``sinks`` (H,): attention sinks, one more logit
    per head in each softmax (`zoo.blocks.attention`), applied from the log-sum-exp flex returns."""
    score_mod = softcap_score_mod(softcap) if softcap is not None else None
    gqa = k.shape[1] != q.shape[1]
    if sinks is None:
        out = _compiled()(q, k, v, score_mod=score_mod, block_mask=mask, scale=scale, enable_gqa=gqa)
        assert isinstance(out, torch.Tensor)  # no return_lse: a tensor, not a tuple
        return out
    out, lse = _compiled()(
        q, k, v, score_mod=score_mod, block_mask=mask, scale=scale, enable_gqa=gqa, return_lse=True
    )  # (B, H, T, D), (B, H, T): lse of the real keys' logits (-inf where a row sees none)
    # softmax with the sink = softmax over the keys x Z / (Z + exp(sink)) = sigmoid(lse - sink)
    keep = torch.sigmoid(lse.float() - sinks.float().view(1, -1, 1))  # (B, H, T)
    return out * keep.unsqueeze(-1).to(out.dtype)


@functools.cache
def _compiled() -> Any:
    """flex_attention through torch.compile: the fused kernel (uncompiled, it materialises every score)."""
    return torch.compile(flex_attention, dynamic=False)
