"""The mask contract: padding, causal (offset by the cache), cross, and no NaN on empty rows."""

from __future__ import annotations

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
