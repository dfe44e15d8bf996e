"""Hugging Face interop for OLMo 2 and StarCoder2: OLMo 2's norms on each sub-layer's output only
(``norm.placement: post_sublayer``) and q/k norms over all heads (``attention.qk_norm_scope: all_heads``);
StarCoder2's biased LayerNorms and projections, plain GELU (tanh) MLP ``c_fc`` / ``c_proj`` and sliding window.

As in `test_hf_neox_phi3`: small random transformers models with every parameter perturbed and options
changed from their defaults, saved with ``save_pretrained``; left-padded batches with the position ids
transformers' ``generate`` makes; greedy generation that runs past the window; the export read back by
transformers with nothing missing; exports that would lose an option refused naming it; the presets are
what their published configs import as, with transformers' parameter counts.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hf_decoder_parity import (
    assert_greedy_generate_matches,
    assert_logits_match,
    export_and_reload,
    liven,
)

import zoo
from zoo.io.hf import HFError, family_mappings

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

V = 128
SIZES = dict(
    num_hidden_layers=2, hidden_size=64, intermediate_size=96, num_attention_heads=4, vocab_size=V,
    max_position_embeddings=64, bos_token_id=1, eos_token_id=2, pad_token_id=0,
)  # fmt: skip
LLAMA3 = {"rope_type": "llama3", "rope_theta": 500.0, "factor": 4.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 32}  # fmt: skip
# Large eps: a norm built with another eps shows in the logits.
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "olmo2-gqa-bias": ("Olmo2", dict(
        num_key_value_heads=2, attention_bias=True, rms_norm_eps=0.1, rope_parameters=LLAMA3,
        tie_word_embeddings=True)),
    "olmo2-mha": ("Olmo2", dict(rope_theta=2000.0, hidden_act="gelu_pytorch_tanh", head_dim=24)),
    "starcoder2-window": ("Starcoder2", dict(num_key_value_heads=2, sliding_window=8, norm_epsilon=0.1)),
    "starcoder2-plain": ("Starcoder2", dict(
        num_key_value_heads=1, use_bias=False, tie_word_embeddings=False, hidden_act="gelu",
        rope_parameters={"rope_type": "linear", "rope_theta": 300.0, "factor": 2.0})),
}  # fmt: skip


def hf_model(prefix: str, **options: Any) -> torch.nn.Module:
    config = getattr(transformers, f"{prefix}Config")(**{**SIZES, **options})
    return liven(getattr(transformers, f"{prefix}ForCausalLM")(config))


@pytest.fixture(scope="module", params=list(CASES))
def case(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """(name, the transformers model, its folder, the model zoo imports from it)."""
    prefix, options = CASES[request.param]
    hf = hf_model(prefix, **options)
    path = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(path, safe_serialization=True)
    return request.param, hf, path, zoo.from_hf(path)


def test_from_hf_logits_match_on_a_left_padded_batch(case) -> None:
    _, hf, _, model = case
    assert_logits_match(model, hf)


# What each case's config.json must become, as dotted spec fields.
IMPORTED = {
    "olmo2-gqa-bias": {"norm.placement": "post_sublayer", "norm.eps": 0.1, "attention.qk_norm": True,
                       "attention.qk_norm_scope": "all_heads", "attention.qk_norm_eps": 0.1,
                       "attention.bias": True, "attention.num_kv_heads": 2, "lm_head.tied": True,
                       "position.scaling": dict(type="llama3", factor=4.0, low_freq_factor=1.0,
                                                high_freq_factor=4.0, original_max_positions=32)},
    "olmo2-mha": {"attention.head_dim": 24, "attention.bias": False, "ffn.activation": "gelu_tanh",
                  "position.theta": 2000.0, "lm_head.tied": False},
    "starcoder2-window": {"norm.kind": "layernorm", "norm.bias": True, "norm.eps": 0.1, "ffn.gated": False,
                          "ffn.bias": True, "attention.bias": True, "ffn.activation": "gelu_tanh",
                          "decoder.pattern": {"kind": "sliding_window", "window": 8}, "lm_head.tied": True},
    "starcoder2-plain": {"attention.bias": False, "ffn.bias": False, "ffn.activation": "gelu",
                         "attention.num_kv_heads": 1, "lm_head.tied": False,
                         "position.scaling": {"type": "linear", "factor": 2.0}, "decoder.pattern": None},
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
    assert_greedy_generate_matches(hf, model, [30, 21, 9])  # + 10 new tokens: far past the window of 8


def test_to_hf_loads_in_transformers_with_no_missing_keys_and_same_logits(case, tmp_path) -> None:
    _, hf, path, model = case
    assert_logits_match(model, export_and_reload(model, hf, path, tmp_path))


def test_olmo2_norm_weights_land_where_transformers_keeps_them(tmp_path) -> None:
    """The post-attention norm is zoo's self_attn_post_norm (not a pre-FFN norm), q/k norms span all heads."""
    hf = hf_model("Olmo2", **CASES["olmo2-gqa-bias"][1])
    hf.save_pretrained(tmp_path)
    ours = zoo.from_hf(tmp_path).state_dict()
    theirs = hf.state_dict()
    layer = "model.layers.1"
    assert torch.equal(
        ours["decoder.layers.1.self_attn_post_norm.weight"],
        theirs[f"{layer}.post_attention_layernorm.weight"],
    )
    assert torch.equal(
        ours["decoder.layers.1.ffn_post_norm.weight"], theirs[f"{layer}.post_feedforward_layernorm.weight"]
    )
    assert ours["decoder.layers.1.self_attn.q_norm.weight"].shape == (4 * 16,)  # H * D
    assert ours["decoder.layers.1.self_attn.k_norm.weight"].shape == (2 * 16,)  # K * D
    assert not any(".self_attn_norm." in name or ".ffn_norm." in name for name in ours)


# -- the published shapes ----------------------------------------------------------------------------------

# config.json of each published checkpoint (the fields that shape the model), as on its model card.
PUBLISHED = {
    "olmo-2-1b": dict(
        model_type="olmo2", architectures=["Olmo2ForCausalLM"], vocab_size=100352, hidden_size=2048,
        intermediate_size=8192, num_hidden_layers=16, num_attention_heads=16, num_key_value_heads=16,
        hidden_act="silu", max_position_embeddings=4096, rms_norm_eps=1e-6, rope_theta=500000,
        rope_scaling=None, attention_bias=False, tie_word_embeddings=False, pad_token_id=100277,
        eos_token_id=100257,
    ),
    "olmo-2-7b": dict(
        model_type="olmo2", architectures=["Olmo2ForCausalLM"], vocab_size=100352, hidden_size=4096,
        intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32,
        hidden_act="silu", max_position_embeddings=4096, rms_norm_eps=1e-6, rope_theta=500000,
        rope_scaling=None, attention_bias=False, tie_word_embeddings=False, pad_token_id=100277,
        eos_token_id=100257,
    ),
    "starcoder2-3b": dict(
        model_type="starcoder2", architectures=["Starcoder2ForCausalLM"], vocab_size=49152, hidden_size=3072,
        intermediate_size=12288, num_hidden_layers=30, num_attention_heads=24, num_key_value_heads=2,
        hidden_act="gelu_pytorch_tanh", max_position_embeddings=16384, norm_epsilon=1e-5,
        rope_theta=999999.4420358813, sliding_window=4096, use_bias=True, attention_dropout=0.1,
        residual_dropout=0.1, embedding_dropout=0.1, initializer_range=0.018042, bos_token_id=0, eos_token_id=0,
    ),
}  # fmt: skip
CLASSES = {"olmo2": "Olmo2", "starcoder2": "Starcoder2"}


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_preset_is_the_spec_its_published_config_imports_as(name) -> None:
    """The preset says what `zoo.from_hf` would make of the published checkpoint, and exports back to it."""
    config = PUBLISHED[name]
    mapping = next(m for m in family_mappings() if config["model_type"] in m.model_types)
    imported = mapping.config_to_spec(config, set())
    preset = zoo.preset(name)
    assert preset.override(name=None, source=None, init=imported.init) == imported
    exported = mapping.spec_to_config(preset)
    keys = [k for k in config if k in exported and k not in ("rope_scaling", "initializer_range")]
    assert {k: exported[k] for k in keys} == {k: config[k] for k in keys}


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_preset_counts_what_transformers_builds_on_meta_from_the_published_config(name) -> None:
    config = {k: v for k, v in PUBLISHED[name].items() if k not in ("model_type", "architectures")}
    prefix = CLASSES[PUBLISHED[name]["model_type"]]
    with torch.device("meta"):
        theirs = getattr(transformers, f"{prefix}ForCausalLM")(
            getattr(transformers, f"{prefix}Config")(**config)
        )
    assert zoo.build(name, device="meta").num_parameters() == sum(p.numel() for p in theirs.parameters())


# -- refusals ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("preset", "changes", "model_type", "message"),
    [
        ("olmo2-tiny", {"norm.placement": "pre"}, "olmo2",
         r"olmo2 cannot express norm\.placement='pre' \(read back as 'post_sublayer'\)"),
        ("olmo2-tiny", {"attention.qk_norm_scope": "head"}, "olmo2",
         r"olmo2 cannot express attention\.qk_norm_scope='head' \(read back as 'all_heads'\)"),
        ("olmo2-tiny", {}, "llama", r"llama cannot express norm\.placement='post_sublayer'"),
        ("olmo2-tiny", {"decoder": {"pattern": {"kind": "sliding_window", "window": 8}}}, "olmo2",
         r"olmo2 cannot express decoder\.pattern=\{'kind': 'sliding_window'"),
        ("olmo2-tiny", {"lm_head.scale": 0.5}, "olmo2", r"olmo2 cannot express lm_head\.scale=0\.5"),
        ("llama-tiny", {"attention.qk_norm": True, "attention.qk_norm_eps": 1e-5, "attention.qk_norm_scope": "all_heads"},
         "qwen3",
         r"qwen3 cannot express attention\.qk_norm_scope='all_heads' \(read back as 'head'\)"),
        ("starcoder2-tiny", {"ffn.gated": True}, "starcoder2",
         r"starcoder2 cannot express ffn\.gated=True \(read back as False\)"),
        ("starcoder2-tiny", {"ffn.bias": False}, "starcoder2",
         r"starcoder2 cannot express ffn\.bias=False \(read back as True\)"),
        ("starcoder2-tiny", {"norm.bias": False}, "starcoder2", r"starcoder2 cannot express norm\.bias=False"),
        ("starcoder2-tiny", {"decoder": {"layer_patterns": [{"kind": "causal"},
                                                            {"kind": "sliding_window", "window": 8}]}},
         "starcoder2", r"starcoder2 cannot express decoder\.layer_patterns"),
        ("starcoder2-tiny", {}, "gpt_neox", r"gpt_neox cannot express attention\.num_kv_heads=2"),
    ],
)  # fmt: skip
def test_an_export_that_would_drop_an_option_is_refused_naming_it(
    tmp_path, preset, changes, model_type, message
) -> None:
    model = zoo.build(zoo.preset(preset).override(**changes), device="meta")
    with pytest.raises(HFError, match=message):
        zoo.to_hf(model, tmp_path, model_type=model_type)


@pytest.mark.parametrize(
    ("preset", "model_type"), [("olmo2-tiny", "olmo2"), ("starcoder2-tiny", "starcoder2")]
)
def test_each_tiny_preset_chooses_its_family_on_export(tmp_path, preset, model_type) -> None:
    import json

    zoo.to_hf(zoo.build(preset), tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == model_type
