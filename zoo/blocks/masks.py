"""The mask contract, written once. Every attention mask in zoo is made here.

User masks are ``(B, T)`` with 1 = token, 0 = padding (the Hugging Face convention). Internally a mask is
boolean, ``True`` = may attend, broadcastable to ``(B, H, Tq, Tk)``, and goes straight to
``scaled_dot_product_attention``. Per family:

    encoder self-attention   key padding                       padding_mask(src)          (B, 1, 1, S)
    decoder self-attention   causal AND key padding            self_attention_mask(...)   (B, 1, T, T)
    cross-attention          the encoder's key padding         padding_mask(src)          (B, 1, 1, S)

With a KV cache the decoder has ``Tk = cache length + Tq`` keys and query ``i`` sits at absolute position
``Tk - Tq + i``: the causal mask is offset by the cache length. When there is no padding and no offset the
mask is not built at all and SDPA's ``is_causal=True`` does the work.

Attention patterns (`zoo.spec.patterns`) are rules on absolute positions, one function per pattern:
``rule(row, query position, key position) -> may attend``, on broadcasting index tensors. A `Frame` says
where this forward's queries and keys sit (a rolling KV cache hands its keys over in slot order, with their
positions) and which keys are real; `pattern_mask` composes a rule with the frame into the dense mask,
and `zoo.blocks.flex` evaluates the very same rule as a flex_attention ``mask_mod``. Positions count slots,
padding included: with padding only at the ends (left or right) the distance between two real tokens is
the same as without it, so windows see the same tokens. A caller's own ``(B, T, S)`` bool mask (True = may
attend) rides in the frame and is ANDed in.

Packed rows (several documents cut into one training window) add one more rule, ANDed with the pattern's:
a query sees only keys of its own document (`within_documents`, from per-token document ids). Packed
encoder-decoder rows (several (source, target) pairs a row) carry a document id per source token and per
target token, the same id for the two sides of one pair: the encoder's self-attention is block-diagonal
and the decoder's causal per pair (`within_documents` on each side), and cross-attention reads only its
pair's source (`same_pair`, composed with the source padding in `cross_frame`). On long packed rows the
same rules run without a dense mask at all: `zoo.blocks.segments` gathers each document's tokens and
attends per document (tested against the mask made here).

"No padding" is a ``None`` mask. Whether a given mask pads anything is a question about its values, and
asking it costs a device-to-host sync on an accelerator (and a graph break under ``torch.compile``), once
per stack per forward. So it is asked only where the answer is free — a plain CPU tensor, outside any
tracing (`values_readable`) — and everywhere else a given mask is built and applied, even if all ones.
Callers that know there is no padding pass None (generation decides once per `generate` call, on the host).

A query with nothing to attend to (a left-padding position in a causal decoder, any query of a row that is
all padding) would give a softmax over an empty set, which is NaN. Such rows are opened to every key
instead: their outputs are finite garbage at positions nobody reads, and the real rows are untouched.
Additive masks (a position bias folded in) hide keys with the most negative value *finite in the dtype they
are applied in*: a float32 ``finfo.min`` becomes -inf in bfloat16 and float16 (`additive_as`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily

from zoo.spec.patterns import (
    AttentionPattern,
    BlockSparsePattern,
    ChunkedPattern,
    FullPattern,
    PrefixLMPattern,
    SlidingWindowPattern,
)

Mask = torch.Tensor  # bool, True = may attend, broadcastable to (B, H, Tq, Tk); or an additive float bias
Rule = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
"""(row, query position, key position) -> may attend: index tensors in (any broadcasting shapes), bool out."""


def values_readable(tensor: torch.Tensor) -> bool:
    """Whether reading ``tensor``'s values costs nothing: a plain CPU tensor, not traced or compiled.

    On an accelerator a read is a host sync; a meta tensor has no values; under ``torch.compile``, FakeTensor
    or jit tracing a read is data-dependent control flow (a graph break, or an error).
    """
    return (
        not torch.compiler.is_compiling()  # first: the checks below need not be traceable
        and not torch.jit.is_tracing()
        and tensor.device.type == "cpu"
        and type(tensor) in (torch.Tensor, torch.nn.Parameter)  # not a FakeTensor or another subclass
        and tensor.numel() > 0
    )


def padding_of(attention_mask: torch.Tensor | None) -> torch.Tensor | None:
    """The user's (B, T) mask as the padding to apply: None without one, or when it visibly pads nothing.

    "Visibly" only where reading is free (`values_readable`); elsewhere the mask is kept, never read.
    """
    if attention_mask is None:
        return None
    if values_readable(attention_mask) and bool(attention_mask.bool().all()):
        return None
    return attention_mask


def padding_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, S) 1/0 -> (B, 1, 1, S) bool: which keys are real tokens (a row of padding only: every key)."""
    return open_empty_rows(attention_mask.bool()[:, None, None, :])


def causal_mask(q_len: int, k_len: int, *, device: torch.device | str | None = None) -> torch.Tensor:
    """(Tq, Tk) bool: query i, at absolute position k_len - q_len + i, sees keys up to that position."""
    offset = k_len - q_len
    q_pos = torch.arange(q_len, device=device)[:, None] + offset
    k_pos = torch.arange(k_len, device=device)[None, :]
    return k_pos <= q_pos


def self_attention_mask(
    attention_mask: torch.Tensor | None,
    *,
    q_len: int,
    k_len: int,
    causal: bool,
    device: torch.device | str | None = None,
) -> tuple[torch.Tensor | None, bool]:
    """The self-attention mask of a stack and whether SDPA may use ``is_causal`` instead of it.

    ``attention_mask`` is (B, Tk) over every key, cached ones included. Returns ``(mask, is_causal)``:
    ``mask`` is None when nothing needs masking, else (B, 1, Tq, Tk) or (1, 1, Tq, Tk) bool.
    """
    padded = padding_of(attention_mask)
    if not causal:
        return (padding_mask(padded) if padded is not None else None), False
    if padded is None:
        if q_len == k_len:
            return None, True
        if q_len == 1:  # one new token sees every cached key
            return None, False
        return causal_mask(q_len, k_len, device=device)[None, None], False
    mask = causal_mask(q_len, k_len, device=device)[None, None] & padding_mask(padded)  # (B, 1, Tq, Tk)
    return open_empty_rows(mask), False


def cross_attention_mask(encoder_attention_mask: torch.Tensor | None) -> torch.Tensor | None:
    """(B, S) encoder padding -> (B, 1, 1, S) bool, or None when the source has no padding."""
    padded = padding_of(encoder_attention_mask)
    return padding_mask(padded) if padded is not None else None


def keys_seen(attention_mask: torch.Tensor | None) -> torch.Tensor | None:
    """A (B, S) padding mask as it is; a (B, T, S) bool user mask -> (B, S): the keys some query may see
    (what cross-attention over that sequence may read)."""
    if attention_mask is None or attention_mask.dim() == 2:
        return attention_mask
    return attention_mask.any(dim=1)


def open_empty_rows(mask: torch.Tensor) -> torch.Tensor:
    """Let query rows that may attend to nothing attend to everything (finite output instead of NaN)."""
    return mask | ~mask.any(dim=-1, keepdim=True)


def with_bias(
    mask: torch.Tensor | None, bias: torch.Tensor | None, *, dtype: torch.dtype
) -> torch.Tensor | None:
    """Fold a boolean mask into an additive position bias (T5 relative bias, ALiBi), for SDPA's float mask.

    Hidden keys get ``dtype``'s most negative finite value, not -inf and not -1e9: a fully hidden row then
    stays finite, and half precision cannot overflow it. Attention may run in a narrower dtype than this
    one (autocast): it casts with `additive_as`, which keeps the value finite there too.
    """
    if bias is None:
        return mask
    bias = bias.to(dtype)
    if mask is None:
        return bias
    return torch.where(mask, bias, torch.finfo(dtype).min)  # broadcasts (B, 1, 1, S) against (1, H, T, S)


def with_sink_column(
    mask: torch.Tensor | None, sinks: torch.Tensor, *, shape: tuple[int, int, int, int], dtype: torch.dtype
) -> torch.Tensor:
    """SDPA's float mask for attention with sinks (gpt-oss), which SDPA has no input for: the keys' mask
    (bool or additive, broadcastable to ``shape`` (B, H, T, S); None: every key) as an additive bias, and one
    more column holding each head's sink logit ``sinks`` (H,), for an extra zero key (with a zero value)
    that every query sees. -> (B or 1, H, T, S + 1)."""
    _, H, T, S = shape
    if mask is None:
        bias = torch.zeros(1, 1, T, S, device=sinks.device, dtype=dtype)
    elif mask.dtype == torch.bool:
        bias = torch.zeros((), device=mask.device, dtype=dtype).masked_fill(~mask, torch.finfo(dtype).min)
    else:
        bias = additive_as(mask, dtype)
    rows = bias.shape[0] if bias.dim() == 4 else 1
    bias = bias.expand(rows, H, T, S)  # (B|1, H, T, S)
    sink = sinks.to(dtype).view(1, H, 1, 1).expand(rows, H, T, 1)  # (B|1, H, T, 1)
    return torch.cat([bias, sink], dim=-1)


def additive_as(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """An additive float mask in ``dtype``, saturating instead of overflowing.

    float32's ``finfo.min`` (-3.40e38) rounds to -inf in bfloat16 (whose largest finite is 3.39e38) and
    float16; -inf makes a fully hidden row NaN in kernels that do not special-case it.
    """
    if mask.dtype == dtype:
        return mask
    if torch.finfo(dtype).max < torch.finfo(mask.dtype).max:  # narrowing
        mask = mask.clamp(min=torch.finfo(dtype).min)
    return mask.to(dtype)


# -- attention patterns: one rule per pattern, on absolute positions --------------------------------------


def sliding_window_allows(q: torch.Tensor, k: torch.Tensor, *, window: int, causal: bool) -> torch.Tensor:
    """Causal: i - window < j <= i (Mistral's ``sliding_window``); bidirectional: |i - j| < window."""
    if causal:
        return (k <= q) & (k > q - window)
    return (k > q - window) & (k < q + window)  # no (q - k) tensor: bool straight from the comparisons


def prefix_lm_allows(q: torch.Tensor, k: torch.Tensor, *, in_prefix: torch.Tensor) -> torch.Tensor:
    """Causal, except that keys inside the row's prefix (``in_prefix``, shaped like ``k``) are always seen."""
    return (k <= q) | in_prefix


def chunked_allows(
    q: torch.Tensor, k: torch.Tensor, *, chunk_q: torch.Tensor, chunk_k: torch.Tensor
) -> torch.Tensor:
    """Llama 4's chunked attention: causal (j <= i) inside the query's own chunk (``chunk_q``/``chunk_k``:
    each position's chunk, its position within the row or document divided by the chunk size)."""
    return (k <= q) & (chunk_q == chunk_k)


def chunk_table(
    padding: torch.Tensor | None,
    documents: torch.Tensor | None,
    *,
    size: int,
    length: int,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """(B|1, length) the chunk of each absolute slot: the token's position (counted from the row's first real
    token, as transformers' chunked mask counts from the left padding; from each document's start in packed
    rows) divided by ``size``. ``padding`` (B, length) 1 = token; ``documents`` (B, length) document ids."""
    if documents is not None:
        start = torch.ones_like(documents, dtype=torch.bool)
        start[:, 1:] = documents[:, 1:] != documents[:, :-1]
        index = torch.arange(documents.shape[1], device=documents.device).expand_as(documents)
        first = torch.where(start, index, torch.zeros_like(index)).cummax(dim=-1).values  # (B, L)
        positions = index - first
    elif padding is not None:
        positions = (padding.long().cumsum(dim=-1) - 1).clamp(min=0)  # (B, L)
    else:
        positions = torch.arange(length, device=device)[None]  # (1, L)
    return torch.div(positions, size, rounding_mode="floor")


def block_sparse_allows(
    q: torch.Tensor, k: torch.Tensor, *, layout: torch.Tensor, block_size: int
) -> torch.Tensor:
    """BigBird: query block q // size sees key block k // size where ``layout`` (blocks, blocks) says so."""
    return layout[q // block_size, k // block_size]


def block_sparse_layout(pattern: BlockSparsePattern, *, num_blocks: int, layer: int) -> torch.Tensor:
    """(num_blocks, num_blocks) bool on the CPU: which key blocks each query block sees (Zaheer et al. 2020).

    Window blocks around the diagonal, the first and last ``global_blocks`` rows and columns, and
    ``random_blocks`` per row drawn among the blocks the row does not see yet, by a torch.Generator seeded
    with ``seed + layer``: the same for every batch and every call.
    """
    flat = _layout(pattern, num_blocks, layer)
    return torch.tensor(flat, dtype=torch.bool).view(num_blocks, num_blocks)


@functools.lru_cache(maxsize=64)
# A constant of the spec and the length: computed eagerly, once, outside any graph. torch.compiler.disable as
# a decorator imports torch._dynamo (and sympy) at import time, a second or more for every `zoo` command that
# builds a model; torch's own lazy form (what torch.optim uses) imports it on the first call instead.
@torch._disable_dynamo
def _layout(pattern: BlockSparsePattern, num_blocks: int, layer: int) -> tuple[bool, ...]:
    # Real CPU tensors even under FakeTensorMode (no value of the model's inputs is read here).
    with unset_fake_temporarily():
        blocks = torch.arange(num_blocks)
        g, half = pattern.global_blocks, (pattern.window_blocks - 1) // 2
        is_global = (blocks < g) | (blocks >= num_blocks - g)  # (N,)
        visible = (
            ((blocks[:, None] - blocks[None, :]).abs() <= half) | is_global[:, None] | is_global[None, :]
        )
        if pattern.random_blocks:
            generator = torch.Generator().manual_seed(pattern.seed + layer)
            scores = torch.rand(num_blocks, num_blocks, generator=generator).masked_fill(visible, 2.0)
            picked = scores.topk(
                min(pattern.random_blocks, num_blocks), dim=1, largest=False
            ).indices  # (N, r)
            # where a row has fewer unseen blocks than r, topk also returns seen ones: adding them changes nothing
            visible = visible.scatter(1, picked, True)
        return tuple(visible.flatten().tolist())


def same_document(
    b: torch.Tensor, q: torch.Tensor, k: torch.Tensor, *, documents: torch.Tensor
) -> torch.Tensor:
    """Packed sequences: query q of row b sees key k only inside its own document (a block-diagonal mask;
    flex_attention's document mask). ``documents`` (B, L): a document id per absolute position."""
    return documents[b, q] == documents[b, k]


def same_pair(
    b: torch.Tensor, q: torch.Tensor, k: torch.Tensor, *, targets: torch.Tensor, sources: torch.Tensor
) -> torch.Tensor:
    """Packed (source, target) pairs: target query q of row b reads source key k only when both belong to
    the same pair. ``targets`` (B, T), ``sources`` (B, S): a pair id per target and per source token."""
    return targets[b, q] == sources[b, k]


def pair_rule(targets: torch.Tensor, sources: torch.Tensor) -> Rule:
    """Cross-attention's rule for packed pairs (`same_pair`), on target (query) and source (key) indices."""
    return lambda b, q, k: same_pair(b, q, k, targets=targets, sources=sources)


def cross_frame(
    memory_mask: torch.Tensor | None, *, q_len: int, k_len: int, rows: int, device: torch.device
) -> Frame:
    """The frame of a cross-attention call over packed pairs: ``q_len`` target queries, ``k_len`` source
    keys, ``memory_mask`` (B, S) 1 = a real source token (None: no padding)."""
    padded = padding_of(memory_mask)
    keep = padded.bool() if padded is not None else None
    return Frame(torch.arange(q_len, device=device), torch.arange(k_len, device=device), keep, batch=rows)


def within_documents(rule: Rule | None, documents: torch.Tensor) -> Rule:
    """``rule`` (None: every key) restricted to each query's own document (`same_document`)."""
    if rule is None:
        return lambda b, q, k: same_document(b, q, k, documents=documents)
    base = rule
    return lambda b, q, k: base(b, q, k) & same_document(b, q, k, documents=documents)


def pattern_rule(
    pattern: AttentionPattern | None,
    *,
    causal: bool,
    layer: int,
    length: int,
    prefix: torch.Tensor | None = None,
    chunks: torch.Tensor | None = None,
    device: torch.device | str | None = None,
) -> Rule | None:
    """``pattern``'s rule for layer ``layer`` of a stack (``causal`` or not); None for ``full`` (no rule).
    ``pattern=None``: the stack's plain attention, causal or full.

    ``length``: the sequence length the block-sparse layout covers. ``prefix``: (B, L) bool over absolute key
    positions, True inside the row's prefix (`prefix_keys`); without it ``prefix_lm`` is plain causal.
    ``chunks``: (B|1, L) each absolute position's chunk (`chunk_table`), needed by ``chunked``.
    """
    if isinstance(pattern, BlockSparsePattern):
        size = pattern.block_size
        layout = block_sparse_layout(pattern, num_blocks=-(-length // size), layer=layer).to(device)
        return lambda b, q, k: block_sparse_allows(q, k, layout=layout, block_size=size)
    if isinstance(pattern, SlidingWindowPattern):
        window = pattern.window
        return lambda b, q, k: sliding_window_allows(q, k, window=window, causal=causal)
    if isinstance(pattern, ChunkedPattern):
        assert chunks is not None, "a chunked pattern needs its chunk table"
        table = chunks
        return lambda b, q, k: chunked_allows(q, k, chunk_q=table[b, q], chunk_k=table[b, k])
    if isinstance(pattern, PrefixLMPattern) and prefix is not None:
        table = prefix
        return lambda b, q, k: prefix_lm_allows(q, k, in_prefix=table[b, k])
    if isinstance(pattern, FullPattern) or (pattern is None and not causal):
        return None
    return lambda b, q, k: k <= q  # causal, and prefix_lm without prefixes


def prefix_keys(prefix_lengths: torch.Tensor, padding: torch.Tensor | None, *, length: int) -> torch.Tensor:
    """(B,) prefix lengths, counted in real tokens -> (B, length) bool: which positions lie in the prefix.

    ``padding`` (B, length) 1 = token: with left padding the prefix starts at the first real token.
    """
    if padding is None:
        return torch.arange(length, device=prefix_lengths.device)[None] < prefix_lengths[:, None]
    real = padding.bool()
    return real & (real.long().cumsum(dim=-1) <= prefix_lengths[:, None])


@dataclass(frozen=True)
class Frame:
    """Where one forward's queries and keys sit, and which keys are real, for every layer's pattern."""

    q_pos: torch.Tensor  # (Tq,) absolute positions of the queries
    k_pos: torch.Tensor  # (Tk,) absolute positions of the keys, in the order attention receives them
    keep: torch.Tensor | None = None  # (B, Tk) bool: a real token (not padding, not an empty cache slot)
    user: torch.Tensor | None = None  # (B, Tq, Tk) bool: the caller's own mask, True = may attend
    batch: int = 1  # B where the rule itself varies by row (prefix_lm's prefixes)

    @property
    def rows(self) -> int:
        """Rows the mask needs: 1 (broadcast over the batch) unless padding, a user mask or the rule varies
        by row."""
        for tensor in (self.keep, self.user):
            if tensor is not None:
                return tensor.shape[0]
        return self.batch


def make_frame(
    attention_mask: torch.Tensor | None,
    *,
    q_len: int,
    offset: int,
    key_positions: torch.Tensor | None = None,
    device: torch.device | str | None = None,
) -> Frame:
    """The frame of a self-attention call: ``q_len`` queries after ``offset`` cached positions.

    ``attention_mask``: None, the (B, offset + Tq) padding (1 = token) or a (B, Tq, offset + Tq) bool user
    mask, both over absolute positions. ``key_positions`` (Tk,): where each key a rolling KV cache hands over
    sits (-1 = an empty slot); default ``0 .. offset + Tq - 1``.
    """
    q_pos = torch.arange(offset, offset + q_len, device=device)
    if key_positions is None:
        k_pos, valid = torch.arange(offset + q_len, device=device), None
    else:
        k_pos, valid = key_positions.clamp(min=0), key_positions >= 0
    user = padded = None
    if attention_mask is not None and attention_mask.dim() == 3:
        user = attention_mask.bool() if key_positions is None else attention_mask.bool()[:, :, k_pos]
    else:
        padded = padding_of(attention_mask)
    keep = None
    if padded is not None:
        keep = padded.bool() if key_positions is None else padded.bool()[:, k_pos]
    if valid is not None and not (values_readable(valid) and bool(valid.all())):  # empty slots to hide
        keep = valid[None] if keep is None else keep & valid
    return Frame(q_pos, k_pos, keep, user)


def pattern_mask(rule: Rule | None, frame: Frame) -> torch.Tensor | None:
    """The dense mask (B or 1, 1, Tq, Tk) bool of ``rule`` composed with the frame's padding and user mask
    (empty rows opened); None when nothing is masked."""
    mask = None
    if rule is not None:
        rows = torch.arange(frame.rows, device=frame.q_pos.device)[:, None, None]
        mask = rule(rows, frame.q_pos[None, :, None], frame.k_pos[None, None, :])  # (B|1, Tq, Tk)
    if frame.keep is not None:
        keep = frame.keep[:, None, :]  # (B, 1, Tk)
        mask = keep if mask is None else mask & keep
    if frame.user is not None:
        mask = frame.user if mask is None else mask & frame.user
    return None if mask is None else open_empty_rows(mask[:, None])
