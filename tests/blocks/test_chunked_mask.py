"""The chunked pattern's one rule (Llama 4's ``attention_chunk_size``): the dense mask equals transformers'
chunked causal mask on a left-padded batch (chunks counted from each row's first real token), and the
flex_attention path gives the dense path's outputs."""

from __future__ import annotations

import pytest
import torch

import zoo
from zoo.blocks.flex import attention_kernel
from zoo.blocks.layer_masks import StackPatterns, self_attention_masks
from zoo.spec import ChunkedPattern


def test_the_dense_chunked_mask_equals_transformers_on_a_left_padded_batch() -> None:
    masking = pytest.importorskip("transformers.masking_utils")
    padding = torch.tensor([[1] * 20, [0] * 5 + [1] * 15, [0] * 11 + [1] * 9])
    (mask, _), *_ = self_attention_masks(
        StackPatterns.of([ChunkedPattern(size=4)]), causal=True, attention_mask=padding, q_len=20,
        device=torch.device("cpu"),
    )  # fmt: skip
    left = (padding == 0).sum(-1)
    rule = masking.and_masks(
        masking.chunked_causal_mask_function(4, left), masking.padding_mask_function(padding.bool())
    )
    b, q, k = torch.arange(3)[:, None, None], torch.arange(20)[None, :, None], torch.arange(20)[None, None, :]
    theirs = rule(b, 0, q, k)  # (B, T, S)
    real = padding.bool()[:, :, None]  # padding queries are opened to every key in zoo: compare real rows
    assert torch.equal(mask[:, 0] & real, theirs & real)


def test_a_sequence_within_one_chunk_takes_the_causal_path() -> None:
    (mask, is_causal), *_ = self_attention_masks(
        StackPatterns.of([ChunkedPattern(size=8)]), causal=True, attention_mask=None, q_len=8, device=torch.device("cpu")
    )  # fmt: skip
    assert mask is None and is_causal


def test_a_chunked_pattern_is_refused_in_a_bidirectional_stack() -> None:
    with pytest.raises(zoo.spec.errors.SpecValidationError, match=r"chunked is a pattern for decoder stacks"):
        zoo.preset("bert-tiny").override(encoder={"pattern": {"kind": "chunked", "size": 4}})


@pytest.mark.slow  # flex_attention compiles on first use
def test_flex_chunked_attention_matches_the_dense_path() -> None:
    torch.manual_seed(0)
    model = zoo.build("llama4-tiny").eval()
    ids = torch.randint(3, 256, (2, 40))
    mask = torch.ones_like(ids)
    mask[1, :7] = 0
    with torch.no_grad():
        dense = model(ids, attention_mask=mask).logits
        with attention_kernel("flex"):
            flexed = model(ids, attention_mask=mask).logits
    real = mask.bool()
    torch.testing.assert_close(flexed[real], dense[real], atol=1e-5, rtol=1e-5)
