"""Hugging Face interop for Cohere 2 (Command R7B): one bias-free LayerNorm feeding attention and the MLP side
by side (``norm.residual: parallel_shared``), scaled logits (``lm_head.scale``), Cohere's interleaved rotary
pairs (q/k rows reordered per head), sliding layers that rotate beside full layers that do not
(``position.nope_layers``).

As in `test_hf_neox_phi3`: small random transformers models with every parameter perturbed and options
changed from their defaults, saved with ``save_pretrained``; left-padded batches with the position ids
transformers' ``generate`` makes; greedy generation past the window; the export read back by transformers
with nothing missing; exports that would lose an option refused naming it.

Cohere 2's full-attention layers are layers without rotary (``position.nope_layers``, as SmolLM3's).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch
from hf_decoder_parity import (
    assert_greedy_generate_matches,
    assert_logits_match,
    export_and_reload,
    liven,
)
from safetensors.torch import load_file

import zoo
from zoo.io.hf import HFError

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()


V = 128
SIZES = dict(
    num_hidden_layers=2, hidden_size=64, intermediate_size=96, num_attention_heads=4, vocab_size=V,
    max_position_embeddings=64, bos_token_id=1, eos_token_id=2, pad_token_id=0,
)  # fmt: skip
SLIDING, FULL = "sliding_attention", "full_attention"
# Large eps: a norm built with another eps shows in the logits.
CASES: dict[str, tuple[dict[str, Any], Any]] = {
    "all-sliding": (dict(
        num_key_value_heads=2, sliding_window=8, layer_norm_eps=0.1, logit_scale=0.5, layer_types=[SLIDING] * 2,
        attention_bias=True, tie_word_embeddings=False, rope_theta=500.0), ()),
    "local-global": (dict(
        num_hidden_layers=4, num_key_value_heads=1, sliding_window=8, logit_scale=0.25,
        sliding_window_pattern=2), ()),
    "global-first": (dict(
        num_hidden_layers=3, sliding_window=6, logit_scale=1.0, layer_types=[FULL, SLIDING, SLIDING],
        hidden_act="gelu"), ()),
}  # fmt: skip


def hf_model(**options: Any) -> torch.nn.Module:
    return liven(transformers.Cohere2ForCausalLM(transformers.Cohere2Config(**{**SIZES, **options})))


@pytest.fixture(
    scope="module", params=[pytest.param(name, marks=marks) for name, (_, marks) in CASES.items()]
)
def case(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """(name, the transformers model, its folder, the model zoo imports from it)."""
    hf = hf_model(**CASES[request.param][0])
    path = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(path, safe_serialization=True)
    return request.param, hf, path, zoo.from_hf(path)


def test_from_hf_logits_match_on_a_left_padded_batch(case) -> None:
    _, hf, _, model = case
    assert_logits_match(model, hf)


IMPORTED = {
    "all-sliding": {"norm.residual": "parallel_shared", "norm.kind": "layernorm", "norm.bias": False,
                    "norm.eps": 0.1, "lm_head.scale": 0.5, "lm_head.tied": False, "attention.bias": True,
                    "decoder.pattern": {"kind": "sliding_window", "window": 8}, "position.theta": 500.0},
    "local-global": {"lm_head.scale": 0.25, "attention.num_kv_heads": 1, "position.nope_layers": [1, 3],
                     "decoder.layer_patterns": [{"kind": "sliding_window", "window": 8}, {"kind": "causal"}] * 2},
    "global-first": {"lm_head.scale": None, "position.nope_layers": [0], "ffn.activation": "gelu"},
}  # fmt: skip


def test_import_reads_each_option_into_its_spec_field(case) -> None:
    name, _, _, model = case
    spec = model.spec.model_dump()
    for dotted, expected in IMPORTED[name].items():
        value = spec
        for part in dotted.split("."):
            value = value[part]
        assert value == expected, dotted


def test_greedy_generate_matches_transformers_on_left_padded_prompts(case) -> None:
    _, hf, _, model = case
    assert_greedy_generate_matches(hf, model, [30, 21, 9])  # + 10 new tokens: far past the window


def test_to_hf_loads_in_transformers_with_no_missing_keys_and_same_logits(case, tmp_path) -> None:
    _, hf, path, model = case
    assert_logits_match(model, export_and_reload(model, hf, path, tmp_path))


def test_interleaved_rotary_rows_are_reordered_per_head_and_round_trip_bit_for_bit(tmp_path) -> None:
    hf = hf_model(**CASES["all-sliding"][0])
    hf.save_pretrained(tmp_path / "in", safe_serialization=True)
    model = zoo.from_hf(tmp_path / "in")
    D = 16
    theirs = hf.state_dict()["model.layers.0.self_attn.k_proj.weight"]  # (K * D, C), pairs (2i, 2i + 1)
    ours = model.state_dict()["decoder.layers.0.self_attn.qkv_proj.weight"][4 * D :]  # k rows, then v
    # kv head 1: its even rows first, then its odd rows
    head = theirs[D : 2 * D]
    assert torch.equal(ours[D : 2 * D], torch.cat([head[0::2], head[1::2]]))
    assert torch.equal(
        ours[2 * D : 4 * D], hf.state_dict()["model.layers.0.self_attn.v_proj.weight"]
    )  # v kept
    zoo.to_hf(model, tmp_path / "out")
    saved, original = (
        load_file(tmp_path / "out" / "model.safetensors"),
        load_file(tmp_path / "in" / "model.safetensors"),
    )
    assert set(saved) == set(original)
    for key, tensor in saved.items():
        assert torch.equal(tensor, original[key]), key


# -- refusals ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "model_type", "message"),
    [
        ({"norm.residual": "parallel"}, "cohere2",
         r"cohere2 cannot express norm\.residual='parallel' \(read back as 'parallel_shared'\)"),
        ({"norm.bias": True}, "cohere2", r"cohere2 cannot express norm\.bias=True \(read back as False\)"),
        ({"attention.head_dim": 32}, "cohere2", r"cohere2 cannot express attention\.head_dim=32 \(read back as 16\)"),
        ({"lm_head.softcap": 30.0}, "cohere2", r"cohere2 cannot express lm_head\.softcap=30\.0"),
        ({"decoder": {"pattern": None, "layer_patterns": [{"kind": "sliding_window", "window": 8},
                                                          {"kind": "sliding_window", "window": 16}]}},
         "cohere2", r"cohere2 cannot express decoder\.layer_patterns"),
        ({}, "gpt_neox", r"gpt_neox cannot express"),
        ({}, "llama", r"llama cannot express (norm\.kind='layernorm'|norm\.residual='parallel_shared')"),
    ],
)  # fmt: skip
def test_an_export_that_would_drop_an_option_is_refused_naming_it(
    tmp_path, changes, model_type, message
) -> None:
    model = zoo.build(zoo.preset("cohere2-tiny").override(**changes), device="meta")
    with pytest.raises(HFError, match=message):
        zoo.to_hf(model, tmp_path, model_type=model_type)


def test_a_rotating_causal_layer_is_refused_for_cohere2(tmp_path) -> None:
    """Cohere 2 rotates exactly its sliding layers: a full layer that rotates reads back as one that does not."""
    spec = zoo.preset("cohere2-tiny").override(decoder={"pattern": None, "layer_patterns": [
        {"kind": "sliding_window", "window": 8}, {"kind": "causal"}]})  # fmt: skip
    with pytest.raises(
        HFError, match=r"cohere2 cannot express position\.nope_layers=\[\] \(read back as \[1\]\)"
    ):
        zoo.to_hf(zoo.build(spec, device="meta"), tmp_path, model_type="cohere2")


def test_the_tiny_preset_chooses_cohere2_on_export(tmp_path) -> None:
    zoo.to_hf(zoo.build("cohere2-tiny"), tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "cohere2"
