"""``logits_mask``: the head runs only at the selected positions, and loss, logits and gradients equal the
full computation's at those positions."""

from __future__ import annotations

import pytest
import torch
from support import TINY_PRESETS, padded_batch

import zoo
from zoo.losses import shift_labels_left


def _mlm_labels(ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """~30% of the real positions labelled, the rest -100 (at least one labelled per row)."""
    picked = (torch.rand(ids.shape) < 0.3) & mask.bool()
    picked[:, 0] = True
    return ids.masked_fill(~picked, -100)


def _forward(model, ids, mask, labels, dec_mask, **kwargs):
    if model.spec.family == "encoder-decoder":
        return model(ids, attention_mask=mask, labels=labels, decoder_attention_mask=dec_mask, **kwargs)
    return model(ids, attention_mask=mask, labels=labels, **kwargs)


def _scored(model, labels: torch.Tensor) -> torch.Tensor:
    """The positions whose logits the loss reads: decoders score position t against label t + 1."""
    targets = shift_labels_left(labels) if model.spec.family == "decoder" else labels
    return targets != -100


@pytest.mark.parametrize("name", TINY_PRESETS)
def test_head_on_scored_positions_matches_the_full_head(name):
    torch.manual_seed(0)
    model = zoo.build(name).eval()
    ids, mask = padded_batch(model.spec.vocab_size, [9, 6])
    if model.spec.family == "encoder":
        labels = _mlm_labels(ids, mask)
    else:
        labels = ids.masked_fill(mask == 0, -100)
    scored = _scored(model, labels)
    assert 0 < scored.sum() < scored.numel()  # a real selection, not everything

    full = _forward(model, ids, mask, labels, mask)
    full.loss.backward()
    full_grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    sparse = _forward(model, ids, mask, labels, mask, logits_mask=scored)
    sparse.loss.backward()

    assert sparse.logits.shape == (int(scored.sum()), model.spec.vocab_size)
    torch.testing.assert_close(sparse.logits, full.logits[scored], atol=1e-5, rtol=0)
    torch.testing.assert_close(sparse.loss, full.loss, atol=1e-6, rtol=0)
    for n, p in model.named_parameters():
        if n in full_grads:
            torch.testing.assert_close(p.grad, full_grads[n], atol=1e-6, rtol=1e-5, msg=n)


def test_logits_mask_with_a_wrong_shape_or_dtype_names_itself():
    model = zoo.build("gpt2-tiny").eval()
    ids = torch.randint(3, 100, (2, 5))
    with pytest.raises(ValueError, match=r"logits_mask must be a bool tensor of shape \(2, 5\)"):
        model(ids, logits_mask=torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"logits_mask must be a bool tensor.*got torch.int64"):
        model(ids, logits_mask=torch.ones(2, 5, dtype=torch.long))


def test_logits_mask_needs_a_token_level_head():
    model = zoo.build(zoo.preset("bert-tiny").override(**{"heads.mlm": None, "heads.num_labels": 3}))
    with pytest.raises(ValueError, match="logits_mask selects positions for the MLM head"):
        model(torch.randint(3, 100, (2, 5)), logits_mask=torch.ones(2, 5, dtype=torch.bool))
