"""The dual encoder's own invariants (CLIP, SigLIP wiring on the tiny preset): the text tower's right padding
and the batch it sits in do not change a text's vector, the logits are the scaled cosine similarities, the
losses are what their formulas say, and a spec that cannot work is refused in one line naming its field."""

from __future__ import annotations

import math
import re

import pytest
import torch
from torch.nn import functional as F

import zoo
from zoo.losses.image_text import contrastive_image_text_loss, sigmoid_image_text_loss
from zoo.spec import SpecError


@pytest.fixture(scope="module")
def model() -> zoo.ZooModel:
    torch.manual_seed(0)
    return zoo.build("clip-tiny").eval()


@torch.no_grad()
def test_right_padding_and_the_batch_do_not_change_a_texts_vector(model: zoo.ZooModel) -> None:
    alone = model.get_text_features(torch.tensor([[1, 9, 10, 3]]))
    ids = torch.tensor([[1, 9, 10, 3, 0, 0], [1, 11, 12, 13, 14, 3]])
    batched = model.get_text_features(ids, attention_mask=(ids != 0).long())
    torch.testing.assert_close(batched[0], alone[0], atol=1e-6, rtol=0)


@torch.no_grad()
def test_logits_are_scaled_cosine_similarities(model: zoo.ZooModel) -> None:
    ids, pixels = torch.tensor([[1, 9, 3], [1, 10, 3]]), torch.randn(3, 3, 32, 32)
    out = model(input_ids=ids, pixel_values=pixels)
    text = F.normalize(model.get_text_features(ids), dim=-1)
    image = F.normalize(model.get_image_features(pixels), dim=-1)
    expected = text @ image.T * math.exp(model.spec.heads.logit_scale_init)
    torch.testing.assert_close(out.logits_per_text, expected)
    torch.testing.assert_close(out.logits_per_image, expected.T)
    assert out.logits_per_text.shape == (2, 3) and out.loss is None
    with pytest.raises(ValueError, match="return_loss needs as many texts as images"):
        model(input_ids=ids, pixel_values=pixels, return_loss=True)


def test_the_losses_follow_their_formulas() -> None:
    logits = torch.randn(4, 4)
    targets = torch.arange(4)
    both = (F.cross_entropy(logits, targets) + F.cross_entropy(logits.T, targets)) / 2
    torch.testing.assert_close(contrastive_image_text_loss(logits), both)
    signs = torch.where(torch.eye(4, dtype=torch.bool), 1.0, -1.0)
    pairwise = -torch.log(torch.sigmoid(signs * logits)).sum() / 4  # per text, averaged
    torch.testing.assert_close(sigmoid_image_text_loss(logits), pairwise)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"heads.projection": None, "vision.d_model": 128}, "heads.projection is null, so the pooled text width (64"),
        ({"heads.loss": "sigmoid"}, "heads.loss 'sigmoid' needs heads.logit_bias_init"),
        ({"eos_token_id": None}, "heads.text_pooling 'eos_token' needs eos_token_id"),
        ({"vision.embedding": {"kind": "tokens"}, "vision.vocab_size": 8}, "vision.embedding.kind must be 'patches'"),
        ({"heads.image_pooling": {"kind": "attention", "num_heads": 5}}, "must be divisible by heads.image_pooling.num_heads (5)"),
    ],
)  # fmt: skip
def test_a_spec_that_cannot_work_is_refused_naming_its_field(change: dict, message: str) -> None:
    spec = zoo.preset("clip-tiny")
    with pytest.raises(SpecError, match=re.escape(message)):
        spec.override(**change)
