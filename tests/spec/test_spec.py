"""The spec validates: unknown fields, divisibility, activations, sizes, rotary head_dim; messages name the field."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from pydantic import ValidationError

import zoo
from zoo.spec import DecoderSpec, EncoderDecoderSpec, parse_spec


def decoder(**fields):
    return {"family": "decoder", "vocab_size": 100, "d_model": 64, **fields}


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (decoder(bogus=1), "bogus"),
        (decoder(attention={"num_heads": 6}), "d_model (64) must be divisible by attention.num_heads (6)"),
        (
            decoder(decoder={"attention": {"num_heads": 8, "num_kv_heads": 3}}),
            "decoder.attention.num_heads (8) must be divisible by decoder.attention.num_kv_heads (3)",
        ),
        (decoder(ffn={"activation": "tanh"}), "ffn.activation"),
        (decoder(d_model=-4), "d_model"),
        (decoder(num_layers=0), "num_layers"),
        (decoder(ffn={"d_ff": -1}), "ffn.d_ff"),
        (
            decoder(attention={"num_heads": 4, "head_dim": 15}, position={"kind": "rotary"}),
            "rotary positions need an even head_dim",
        ),
        (decoder(position={"kind": "spiral"}), "position"),
        (decoder(pad_token_id=100), "pad_token_id (100) must be smaller than vocab_size (100)"),
        (
            {"family": "encoder-decoder", "vocab_size": 10, "encoder": {"cross_attention": {}}},
            "encoder.cross_attention",
        ),
        ({"family": "mixer", "vocab_size": 10}, "family"),
    ],
)
def test_invalid_spec_names_the_field(data, expected):
    with pytest.raises(ValidationError) as error:
        parse_spec(data)
    assert expected in str(error.value)


def test_stack_fields_default_from_the_model_level():
    spec = parse_spec(
        {
            "family": "encoder-decoder",
            "vocab_size": 100,
            "d_model": 64,
            "num_layers": 3,
            "attention": {"num_heads": 4},
            "decoder": {"num_layers": 2, "ffn": {"d_ff": 32}},
        }
    )
    stacks = spec.stacks()
    assert stacks["encoder"].num_layers == 3 and stacks["decoder"].num_layers == 2
    assert stacks["decoder"].ffn.d_ff == 32 and stacks["encoder"].ffn.d_ff == 2048
    assert stacks["decoder"].cross_attention == stacks["decoder"].attention
    assert stacks["decoder"].causal and not stacks["encoder"].causal


def test_override_validates_and_reaches_sub_specs():
    spec = zoo.preset("gpt2").override(num_layers=4, **{"attention.num_heads": 8})
    assert isinstance(spec, DecoderSpec)
    assert spec.num_layers == 4 and spec.attention.num_heads == 8 and spec.d_model == 768
    with pytest.raises(ValidationError, match="num_heads"):
        zoo.preset("gpt2").override(**{"attention.num_heads": 7})
    assert zoo.preset("gpt2", num_layers=2).num_layers == 2


def test_specs_are_frozen():
    spec = zoo.preset("t5-small")
    with pytest.raises(ValidationError):
        spec.d_model = 3


def test_spec_round_trips_through_json():
    for name in zoo.list_presets():
        spec = zoo.preset(name)
        assert parse_spec(json.loads(spec.to_json())) == spec


def test_json_schema_lists_the_three_families():
    schema = zoo.json_schema()
    text = json.dumps(schema)
    for family in ("EncoderSpec", "DecoderSpec", "EncoderDecoderSpec"):
        assert family in text
    assert schema["title"] == "ModelSpec"


def test_spec_package_imports_no_torch():
    code = "import sys, zoo, zoo.spec; zoo.preset('gpt2'); zoo.json_schema(); print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


def test_encoder_decoder_start_token_falls_back():
    spec = EncoderDecoderSpec(
        vocab_size=10, d_model=8, attention={"num_heads": 2}, bos_token_id=None, pad_token_id=3
    )
    assert spec.start_token_id == 3


def test_override_that_changes_a_kind_starts_the_sub_spec_afresh():
    """learned -> sinusoidal keeps none of the learned variant's fields (its relative_bias, its offset)."""
    spec = zoo.preset("bart-tiny")
    assert spec.position.kind == "learned" and spec.position.offset == 2
    changed = spec.override(position={"kind": "sinusoidal", "layout": "half"})
    assert changed.position.model_dump() == {
        "kind": "sinusoidal", "layout": "half", "offset": 0, "frequencies": "paper"
    }  # fmt: skip
    assert spec.override(position={"offset": 0}).position.kind == "learned"  # same kind: merged


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"norm.unit_offset": True}, r"unit_offset is an RMSNorm option .*kind is 'layernorm'"),
        ({"norm.first_attention_norm": False, "norm.placement": "post"}, r"first_attention_norm: false needs placement 'pre'"),
        ({"norm.first_attention_norm": False, "norm.placement": "pre", "decoder.share_layers": True},
         r"norm\.first_attention_norm: false cannot go with decoder\.share_layers"),
    ],
)  # fmt: skip
def test_gemma_and_modernbert_norm_options_refuse_what_they_cannot_mean(changes, message):
    with pytest.raises(ValueError, match=message):
        zoo.preset("gpt2-tiny").override(**changes)


def test_sandwich_norms_have_a_final_norm_and_twice_the_layer_norms():
    pre = zoo.build(zoo.preset("llama-tiny"), device="meta")
    sandwich = zoo.build(zoo.preset("llama-tiny").override(**{"norm.placement": "sandwich"}), device="meta")
    assert sandwich.decoder.final_norm is not None
    extra = sandwich.num_parameters() - pre.num_parameters()
    assert extra == 2 * 2 * 64  # two more norms of width 64 in each of the two layers
