"""An encoder's output head is one interface chosen at build time (`zoo.models.encoder_heads`): it holds a
reference to the model's own head module, never a second copy of its weights, and follows the model through
a copy or a move."""

from __future__ import annotations

import copy

import pytest
import torch

import zoo
from zoo.models.encoder_heads import NoScores, ReplacedTokenScores, SequenceScores, TokenScores

HEADS = {
    "mlm": ({"mlm": {}}, TokenScores, "mlm_head"),
    "token": ({"classifier": {"task": "token", "num_labels": 3}}, TokenScores, "classifier"),
    "sequence": ({"pooler": True, "num_labels": 3}, SequenceScores, "classifier"),
    "replaced": ({"replaced_token": {}}, ReplacedTokenScores, "replaced_token_head"),
    "none": ({}, NoScores, None),
}


def encoder(heads: dict) -> zoo.EncoderModel:
    torch.manual_seed(0)
    spec = {
        "family": "encoder",
        "vocab_size": 50,
        "d_model": 16,
        "num_layers": 1,
        "attention": {"num_heads": 2},
    }
    model = zoo.build({**spec, "heads": heads})
    assert isinstance(model, zoo.EncoderModel)
    return model.eval()


@pytest.mark.parametrize("kind", HEADS)
def test_the_output_head_is_the_models_own_module_and_not_in_the_state_dict(kind: str) -> None:
    heads, interface, attribute = HEADS[kind]
    model = encoder(heads)
    assert type(model.output_head) is interface
    assert not any(name.startswith("output_head") for name in model.state_dict())
    copied = copy.deepcopy(model).to(torch.float64)
    if attribute is not None:
        assert model.output_head.module is getattr(model, attribute)  # type: ignore[union-attr]
        assert copied.output_head.module is getattr(copied, attribute)  # type: ignore[union-attr]
    ids = torch.randint(0, 50, (2, 5))
    out, again = model(ids), copied(ids)
    if out.logits is None:
        assert again.logits is None
    else:
        torch.testing.assert_close(again.logits.float(), out.logits, rtol=1e-5, atol=1e-5)
