"""The mask contract: padding, causal (offset by the cache), cross, and no NaN on empty rows."""

from __future__ import annotations

import pytest
import torch

from zoo.blocks import Attention, masks
from zoo.spec import AttentionSpec


def test_padding_mask_hides_padding_keys():
    mask = masks.padding_mask(torch.tensor([[1, 1, 0]]))
    assert mask.shape == (1, 1, 1, 3) and mask.dtype == torch.bool
    assert mask[0, 0, 0].tolist() == [True, True, False]


def test_causal_mask_is_offset_by_the_cache_length():
    assert masks.causal_mask(3, 3).tolist() == [[True, False, False], [True, True, False], [True, True, True]]
    # two cached keys, two new queries at absolute positions 2 and 3
    assert masks.causal_mask(2, 4).tolist() == [[True, True, True, False], [True, True, True, True]]


def test_no_padding_uses_is_causal_and_builds_nothing():
    assert masks.self_attention_mask(torch.ones(2, 5), q_len=5, k_len=5, causal=True) == (None, True)
    assert masks.self_attention_mask(None, q_len=1, k_len=9, causal=True) == (None, False)
    assert masks.self_attention_mask(None, q_len=5, k_len=5, causal=False) == (None, False)
    assert masks.cross_attention_mask(torch.ones(2, 4)) is None


def test_decoder_mask_is_causal_and_padding():
    mask, is_causal = masks.self_attention_mask(torch.tensor([[1, 1, 1, 0]]), q_len=4, k_len=4, causal=True)
    assert not is_causal and mask.shape == (1, 1, 4, 4)
    assert mask[0, 0, :3].tolist() == [
        [True, False, False, False],
        [True, True, False, False],
        [True, True, True, False],
    ]


def test_left_padded_rows_do_not_produce_nan():
    attention_mask = torch.tensor([[0, 0, 1, 1]])  # the first two queries can see nothing real
    mask, is_causal = masks.self_attention_mask(attention_mask, q_len=4, k_len=4, causal=True)
    attention = Attention(AttentionSpec(num_heads=2), d_model=16).eval()
    x = torch.randn(1, 4, 16)
    for output_attentions in (False, True):
        out, _ = attention(x, mask=mask, is_causal=is_causal, output_attentions=output_attentions)
        assert torch.isfinite(out).all()


def test_bias_folds_into_an_additive_mask_without_overflow():
    bias = torch.zeros(1, 2, 1, 3)
    folded = masks.with_bias(masks.padding_mask(torch.tensor([[1, 1, 0]])), bias, dtype=torch.float16)
    assert folded.dtype == torch.float16 and torch.isfinite(folded).all()
    assert folded[0, 0, 0, 2] == torch.finfo(torch.float16).min


def test_a_mask_whose_values_cost_a_sync_to_read_is_applied_as_given():
    # On the meta device (as on an accelerator, or under tracing) "does it pad?" is never asked: no host sync.
    ones = torch.ones(2, 5, device="meta")
    mask, is_causal = masks.self_attention_mask(ones, q_len=5, k_len=5, causal=True, device="meta")
    assert mask is not None and mask.shape == (2, 1, 5, 5) and not is_causal
    assert masks.cross_attention_mask(torch.ones(2, 4, device="meta")) is not None
    assert masks.self_attention_mask(None, q_len=5, k_len=5, causal=True, device="meta") == (None, True)


def test_a_row_of_padding_only_is_opened_to_every_key():
    mask = masks.padding_mask(torch.tensor([[1, 1, 0], [0, 0, 0]]))
    assert mask[0, 0, 0].tolist() == [True, True, False]
    assert mask[1, 0, 0].tolist() == [True, True, True]  # finite garbage in a row nobody reads, not NaN


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_an_additive_mask_saturates_in_a_narrower_dtype(dtype):
    folded = masks.with_bias(
        masks.padding_mask(torch.tensor([[1, 0]])), torch.zeros(1, 1, 1, 2), dtype=torch.float32
    )
    assert torch.isinf(folded.to(dtype)).any()  # why: float32's finfo.min is -inf in bfloat16 and float16
    cast = masks.additive_as(folded, dtype)
    assert cast.dtype == dtype and torch.isfinite(cast).all()
    assert cast[0, 0, 0].tolist() == [0.0, torch.finfo(dtype).min]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("output_attentions", [False, True], ids=["sdpa", "eager"])
@pytest.mark.parametrize("kind", ["causal", "keys", "bias"])
def test_hidden_rows_give_finite_outputs_and_gradients(dtype, output_attentions, kind):
    """Row 0 is left-padded (its first queries see no real key), row 1 is padding only (no real key at all)."""
    attention_mask = torch.tensor([[0, 0, 1, 1], [0, 0, 0, 0]])
    mask, is_causal = masks.self_attention_mask(attention_mask, q_len=4, k_len=4, causal=kind == "causal")
    if kind == "bias":  # a T5 / ALiBi bias folded in: an additive mask
        mask = masks.with_bias(mask, torch.randn(1, 2, 4, 4), dtype=dtype)
    torch.manual_seed(0)
    attention = Attention(AttentionSpec(num_heads=2), d_model=16).to(dtype)
    x = torch.randn(2, 4, 16, dtype=dtype, requires_grad=True)
    out, _ = attention(x, mask=mask, is_causal=is_causal, output_attentions=output_attentions)
    out.float().square().sum().backward()
    assert torch.isfinite(out).all()
    assert x.grad is not None and torch.isfinite(x.grad).all()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in attention.parameters())
