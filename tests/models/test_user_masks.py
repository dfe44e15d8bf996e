"""3-D user masks: ``attention_mask`` (B, T, S) bool, True = may attend, ANDed with the stack's patterns,
in every family's forward; bad shapes and dtypes name what was expected."""

from __future__ import annotations

import pytest
import torch

import zoo
from zoo.generation import KVCache


def _model(name: str, **overrides) -> zoo.ZooModel:
    torch.manual_seed(0)
    return zoo.build(zoo.preset(name).override(dropout=0.0, **overrides)).eval()


def _right_padding(lengths: list[int], T: int) -> torch.Tensor:
    return torch.tensor([[1] * n + [0] * (T - n) for n in lengths])


def test_a_3d_padding_mask_equals_the_2d_one():
    """(B, T) padding written as (B, T, T): the same outputs at every real position, in every family."""
    padding = _right_padding([6, 4], 6)
    square = padding.bool()[:, None, :].expand(2, 6, 6).contiguous()  # (B, T, S): the keys that are tokens
    ids = torch.randint(3, 500, (2, 6)) * padding
    real = padding.bool()
    with torch.no_grad():
        for name in ("bert-tiny", "llama-tiny"):
            model = _model(name)
            expected = model(ids, attention_mask=padding).last_hidden_state
            got = model(ids, attention_mask=square).last_hidden_state
            torch.testing.assert_close(got[real], expected[real], atol=1e-5, rtol=1e-5)
        t5 = _model("t5-tiny")
        target = torch.randint(3, 500, (2, 5))
        expected = t5(ids, attention_mask=padding, decoder_input_ids=target).logits
        causal = torch.ones(5, 5, dtype=torch.bool).tril().expand(2, 5, 5)
        got = t5(ids, attention_mask=square, decoder_input_ids=target, decoder_attention_mask=causal).logits
        torch.testing.assert_close(
            got, expected, atol=1e-5, rtol=1e-5
        )  # cross-attention skips the padding too


def test_a_hidden_key_changes_nothing_it_is_hidden_from():
    """Block-diagonal masks (two packed sequences): one segment's tokens never reach the other's outputs."""
    segments = torch.tensor([0, 0, 0, 1, 1, 1, 1])
    packed = (segments[:, None] == segments[None, :])[None]  # (1, T, T)
    model = _model("bert-tiny")
    ids = torch.randint(3, 500, (1, 7))
    other = ids.clone()
    other[0, 4:] = (ids[0, 4:] + 7) % 500  # change the second segment only
    with torch.no_grad():
        first = model(ids, attention_mask=packed).last_hidden_state
        second = model(other, attention_mask=packed).last_hidden_state
    torch.testing.assert_close(first[0, :3], second[0, :3])
    assert not torch.allclose(first[0, 3:], second[0, 3:])


def test_a_user_mask_is_anded_with_the_stacks_causality():
    """An all-True (B, T, T) mask on a decoder is no mask at all: the stack stays causal."""
    model = _model("gpt2-tiny")
    ids = torch.randint(3, 500, (2, 5))
    with torch.no_grad():
        free = model(ids, attention_mask=torch.ones(2, 5, 5, dtype=torch.bool)).logits
        torch.testing.assert_close(free, model(ids).logits, atol=1e-5, rtol=1e-5)


def test_a_user_mask_covers_cached_keys():
    """With a KV cache the mask is (B, T, cached + T): the step's query row over every key so far."""
    model = _model("llama-tiny")
    ids = torch.randint(3, 500, (1, 6))
    hide = torch.ones(1, 6, 6, dtype=torch.bool).tril()
    hide[:, :, 1] = False  # nobody sees token 1 (but itself, opened where nothing else is left: not here)
    hide[:, 1, 1] = True
    cache = KVCache.for_stack(model.decoder, batch_size=1, max_length=6)
    with torch.no_grad():
        full = model(ids, attention_mask=hide).logits
        prefill = model(ids[:, :4], attention_mask=hide[:, :4, :4], cache=cache).logits
        step = model(ids[:, 4:5], attention_mask=hide[:, 4:5, :5], cache=cache).logits
    torch.testing.assert_close(torch.cat([prefill, step], dim=1), full[:, :5], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(
    ("mask", "message"),
    [
        (torch.ones(2, 5, 4, dtype=torch.bool),
         r"attention_mask: expected \(batch, length\) = \(2, 5\) with 1 = token, or a bool \(batch, length, keys\) = \(2, 5, 5\) mask, True = may attend; got torch.bool of shape \(2, 5, 4\)"),
        (torch.ones(2, 5, 5, dtype=torch.long), r"= \(2, 5, 5\) mask, True = may attend; got torch.int64 of shape \(2, 5, 5\)"),
        (torch.ones(2, 3, dtype=torch.long),
         r"attention_mask must have shape \(batch, length\) = \(2, 5\), like input_ids; got \(2, 3\) \(or a bool \(batch, length, keys\) = \(2, 5, 5\) mask"),
    ],
)  # fmt: skip
def test_bad_masks_name_the_shapes_expected(mask, message):
    model = _model("gpt2-tiny")
    with pytest.raises(ValueError, match=message):
        model(torch.randint(3, 500, (2, 5)), attention_mask=mask)


def test_generation_takes_padding_masks_only():
    model = _model("gpt2-tiny")
    with pytest.raises(ValueError, match="attention_mask"):
        model.generate(torch.randint(3, 500, (1, 4)), attention_mask=torch.ones(1, 4, 4, dtype=torch.bool))
