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

import torch

Mask = torch.Tensor  # bool, True = may attend, broadcastable to (B, H, Tq, Tk); or an additive float bias


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
