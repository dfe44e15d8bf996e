"""`to_hf` reads every export back and refuses one that would drop an option (`zoo.io.hf.faithful`).

Each case is an option some family can hold and others cannot; a family that does not know the option
must refuse it by name instead of writing a config that computes something else.
"""

from __future__ import annotations

import json

import pytest

import zoo
from zoo.io.hf import HFError

SLIDING = {"kind": "sliding_window", "window": 4}


@pytest.mark.parametrize(
    ("preset", "model_type", "changes", "field"),
    [
        ("gpt2-tiny", "gpt2", {"lm_head.bias": True}, "lm_head.bias"),
        ("gpt2-tiny", "gpt2", {"decoder.pattern": SLIDING}, "decoder.pattern"),
        ("gpt2-tiny", "gpt2", {"embedding.projection_dim": 32}, "embedding.projection_dim"),
        ("llama-tiny", "llama", {"lm_head.bias": True}, "lm_head.bias"),
        ("llama-tiny", "llama", {"decoder.pattern": SLIDING}, "decoder.pattern"),
        ("bert-tiny", "bert", {"encoder.pattern": SLIDING}, "encoder.pattern"),
        ("t5-tiny", "t5", {"decoder.pattern": SLIDING}, "decoder.pattern"),
        ("bart-tiny", "bart", {"lm_head.bias": True}, "lm_head.bias"),
    ],
)
def test_an_option_the_family_cannot_hold_is_refused_by_name(preset, model_type, changes, field, tmp_path):
    model = zoo.build(zoo.preset(preset).override(**changes))
    with pytest.raises(HFError, match=field.replace(".", r"\.")):
        zoo.to_hf(model, tmp_path, model_type=model_type)
    assert not any(tmp_path.iterdir())  # refused before anything is written


def test_without_a_model_type_the_first_family_that_keeps_every_option_is_chosen(tmp_path):
    spec = zoo.preset("llama-tiny").override(**{"decoder.pattern": SLIDING})
    zoo.to_hf(zoo.build(spec), tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == "mistral" and config["sliding_window"] == 4


def test_an_option_no_family_holds_lists_every_family_with_its_reason(tmp_path):
    spec = zoo.preset("llama-tiny").override(**{"lm_head.bias": True})
    with pytest.raises(HFError, match="no Hugging Face family") as caught:
        zoo.to_hf(zoo.build(spec), tmp_path)
    assert "llama: " in str(caught.value) and "lm_head.bias" in str(caught.value)
