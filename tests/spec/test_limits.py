"""Size limits: a spec field that asks for more than a sane, overridable bound is refused when it validates,
naming the field, its value, the limit and the environment variable that raises it; the whole model's size,
counted on its meta-device build, is refused when it is built (before any allocation)."""

from __future__ import annotations

import time

import pytest
from pydantic import ValidationError

import zoo
from zoo.spec import SpecError, buffer_count, parameter_count, parse_spec

SMALL = {"family": "decoder", "vocab_size": 100, "d_model": 64, "attention": {"num_heads": 4}}


def spec_with(**changes) -> dict:
    return {**SMALL, **changes}


@pytest.mark.parametrize("name", zoo.list_presets())
def test_parameter_count_of_every_preset_equals_the_built_model(name):
    spec = zoo.preset(name)  # every preset passes the default limits
    model = zoo.build(spec, device="meta")
    assert parameter_count(spec) == model.num_parameters()
    assert buffer_count(spec) == sum(buffer.numel() for buffer in model.buffers())


@pytest.mark.parametrize(
    "changes",
    [
        {"ffn": {"d_ff": 96, "gated": True, "bias": False}, "attention": {"num_heads": 4, "qk_norm": True}},
        {"attention": {"num_heads": 4, "num_kv_heads": 2, "head_dim": 8, "bias": False}},
        {"norm": {"kind": "rmsnorm", "placement": "pre"}, "position": {"kind": "rotary"}},
        {"norm": {"bias": False, "final": True}, "position": {"kind": "alibi"}},
        {"position": {"kind": "learned", "offset": 2}, "embedding": {"norm": True, "scale": True}},
        {"embedding": {"factorized_dim": 16, "segment_vocab_size": 3}, "family": "encoder"},
        {"family": "encoder", "heads": {"pooler": True, "num_labels": 3}},
        {"family": "encoder", "heads": {"mlm": {"tied": False}}, "encoder": {"share_layers": True}},
        {"lm_head": {"tied": False, "logits_bias": True}},
        {"family": "encoder-decoder", "source_vocab_size": 70, "decoder": {"num_layers": 2}},
        {"family": "encoder-decoder", "position": {"kind": "relative_bias"}, "decoder": {"cross_attention": {"num_heads": 2}}},
        {"family": "encoder-decoder", "position": {"kind": "relative_bias", "per_layer": True}, "decoder": {"num_layers": 3}},
        {"ffn": {"kind": "moe", "num_experts": 3, "top_k": 2, "d_ff": 24, "shared_d_ff": 16, "sparse_step": 2,
                 "dense_layers": [3], "dense_d_ff": 40}},
        {"family": "encoder", "ffn": {"kind": "moe", "num_experts": 2, "top_k": 1, "d_ff": 8, "shared_d_ff": 8,
                                      "shared_gate": False}},
    ],
)  # fmt: skip
def test_parameter_count_equals_the_built_model_for_every_kind_of_block(changes):
    spec = parse_spec(spec_with(**changes))
    model = zoo.build(spec, device="meta")
    assert parameter_count(spec) == model.num_parameters()
    assert buffer_count(spec) == sum(buffer.numel() for buffer in model.buffers())


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"num_layers": 10**9}, r"num_layers \(1,000,000,000\) is over the limit of 10,000 layers per stack"),
        ({"decoder": {"num_layers": 20_000}}, r"decoder\.num_layers \(20,000\) is over the limit of 10,000"),
        (
            {"max_positions": 10**9},
            r"max_positions \(1,000,000,000\) is over the limit of 1,048,576 positions",
        ),
        ({"d_model": 2**21}, r"d_model \(2,097,152\) is over the limit of 1,048,576"),
        ({"ffn": {"d_ff": 10**8}}, r"ffn\.d_ff \(100,000,000\) is over the limit"),
        ({"attention": {"num_heads": 4, "head_dim": 2**21}}, r"attention\.head_dim \(2,097,152\)"),
        ({"decoder": {"attention": {"num_heads": 2**21}}}, r"decoder\.attention\.num_heads \(2,097,152\)"),
        ({"vocab_size": 10**9}, r"vocab_size \(1,000,000,000\) is over the limit of 16,777,216"),
        ({"position": {"kind": "learned", "offset": 10**8}}, r"position\.offset \(100,000,000\)"),
        ({"num_layers": 10**5000}, r"num_layers \(a 5001-digit number\) is over the limit"),
    ],
)
def test_an_oversized_field_is_refused_with_its_name_value_limit_and_variable(changes, message):
    with pytest.raises(ValidationError, match=message) as error:
        parse_spec(spec_with(**changes))
    assert "set the environment variable ZOO_MAX_" in str(error.value) or "digit" in str(error.value)


def test_the_whole_model_is_bounded_by_its_parameter_count(monkeypatch):
    # Counted on the model, so checked when it is built (not when the spec validates): on the CPU that
    # refusal comes before any allocation (2.2e12 float32 parameters would fail in the allocator).
    huge = parse_spec(spec_with(vocab_size=2**24, d_model=2**17))  # each field within its limit, 2.2e12
    for device in ("cpu", "meta"):
        with pytest.raises(SpecError, match=r"parameters .* over the limit of 1,000,000,000,000") as error:
            zoo.build(huge, device=device)
        assert "ZOO_MAX_PARAMETERS" in str(error.value) and "\n" not in str(error.value)
    monkeypatch.setenv("ZOO_MAX_PARAMETERS", "1e13")
    assert zoo.build(huge, device="meta").num_parameters() == parameter_count(huge) > 10**12


def test_limits_are_raised_with_environment_variables(monkeypatch):
    with pytest.raises(ValidationError, match="ZOO_MAX_LAYERS"):
        parse_spec(spec_with(num_layers=20_000))
    monkeypatch.setenv("ZOO_MAX_LAYERS", "20_000")
    assert parse_spec(spec_with(num_layers=20_000)).num_layers == 20_000
    monkeypatch.setenv("ZOO_MAX_LAYERS", "lots")
    with pytest.raises(ValidationError, match="ZOO_MAX_LAYERS must be a positive integer, got 'lots'"):
        parse_spec(spec_with(num_layers=2))


def test_zoo_show_refuses_a_billion_layers_within_two_seconds(tmp_path, capsys):
    from zoo.cli import main

    path = tmp_path / "big.yaml"
    path.write_text("family: decoder\nvocab_size: 100\nd_model: 64\nnum_layers: 1000000000\n")
    start = time.perf_counter()
    status = main(["show", str(path)])
    elapsed = time.perf_counter() - start
    assert status == 2 and elapsed < 2.0
    err = capsys.readouterr().err
    assert "num_layers" in err and "1,000,000,000" in err and "10,000" in err and "ZOO_MAX_LAYERS" in err


def test_a_huge_position_table_is_refused_before_any_allocation():
    with pytest.raises(SpecError, match="max_positions"):
        zoo.build(spec_with(max_positions=2**40, d_model=2**20, attention={"num_heads": 4}))
