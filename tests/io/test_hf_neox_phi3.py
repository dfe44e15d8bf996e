"""Hugging Face interop for GPT-NeoX / Pythia and Phi-3: partial rotary, the parallel residual, NeoX's
per-head interleaved ``query_key_value``, Phi-3's fused ``qkv_proj`` / ``gate_up_proj``, its sliding window
and LongRoPE.

As in `test_hf_llama_family`: small random transformers models with every parameter perturbed, saved with
``save_pretrained``; left-padded batches with the position ids transformers' ``generate`` makes. The
LongRoPE case runs batches on both sides of its original context (32), and generation crosses it, so the
per-call switch from short to long factors happens in the middle of decoding with a KV cache.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
import torch
from hf_decoder_parity import (
    assert_greedy_generate_matches,
    assert_logits_match,
    export_and_reload,
    liven,
)
from safetensors.torch import load_file, save_file

import zoo
from zoo.io.hf import HFError, family_mappings
from zoo.spec import SpecError

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

V = 128
SIZES = dict(
    num_hidden_layers=2, hidden_size=64, intermediate_size=96, num_attention_heads=4, vocab_size=V,
    max_position_embeddings=64, bos_token_id=1, eos_token_id=2, pad_token_id=0,
)  # fmt: skip
# head_dim 16; LongRoPE on half of it: 8 rotary dims, 4 frequencies
LONGROPE = {"rope_type": "longrope", "rope_theta": 500.0, "partial_rotary_factor": 0.5,
            "short_factor": [1.0, 1.2, 1.7, 2.3], "long_factor": [1.1, 2.0, 3.5, 6.0]}  # fmt: skip
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "neox-parallel": ("GPTNeoX", dict(
        rope_parameters={"rope_type": "llama3", "rope_theta": 500.0, "partial_rotary_factor": 0.5, "factor": 4.0,
                         "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 32},
        use_parallel_residual=True, attention_bias=True, layer_norm_eps=0.1)),
    "neox-sequential": ("GPTNeoX", dict(
        rotary_pct=0.25, rotary_emb_base=2000, use_parallel_residual=False, attention_bias=False,
        hidden_act="gelu_new", tie_word_embeddings=True)),
    "phi3-window-partial": ("Phi3", dict(
        num_key_value_heads=2, head_dim=24, sliding_window=8, partial_rotary_factor=0.75, rms_norm_eps=0.1)),
    "phi3-longrope": ("Phi3", dict(
        num_key_value_heads=1, rope_parameters=LONGROPE, original_max_position_embeddings=32,
        tie_word_embeddings=True)),
}  # fmt: skip
# Large eps: a norm built with another eps shows in the logits.
SHORT = [20, 13, 5]  # all within LongRoPE's original context: the short factors


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
    name, hf, _, model = case
    assert_logits_match(model, hf)
    if name == "phi3-longrope":  # the other factor set: every position within the original context
        assert_logits_match(model, hf, SHORT)


# What each case's config.json must become, as dotted spec fields.
IMPORTED = {
    "neox-parallel": {"norm.residual": "parallel", "position.fraction": 0.5, "position.theta": 500.0,
                      "position.scaling": dict(type="llama3", factor=4.0, low_freq_factor=1.0,
                                               high_freq_factor=4.0, original_max_positions=32),
                      "attention.bias": True, "norm.eps": 0.1, "lm_head.tied": False, "ffn.activation": "gelu"},
    "neox-sequential": {"norm.residual": "sequential", "position.fraction": 0.25, "position.theta": 2000.0,
                        "attention.bias": False, "ffn.activation": "gelu_tanh", "lm_head.tied": True},
    "phi3-window-partial": {"decoder.pattern": {"kind": "sliding_window", "window": 8},
                            "position.fraction": 0.75, "attention.num_kv_heads": 2, "attention.head_dim": 24,
                            "norm.residual": "sequential"},
    "phi3-longrope": {"position.scaling": {"type": "longrope", "short_factor": LONGROPE["short_factor"],
                                           "long_factor": LONGROPE["long_factor"], "original_max_positions": 32,
                                           "attention_factor": None},
                      "position.fraction": 0.5, "attention.num_kv_heads": 1, "lm_head.tied": True},
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
    assert_greedy_generate_matches(hf, model, [30, 21, 9])  # + 10 new tokens: past 32, far past the window


def test_to_hf_loads_in_transformers_with_no_missing_keys_and_same_logits(case, tmp_path) -> None:
    _, hf, path, model = case
    assert_logits_match(model, export_and_reload(model, hf, path, tmp_path))


def test_neox_query_key_value_interleaves_heads_and_round_trips_bit_for_bit(tmp_path) -> None:
    hf = hf_model("GPTNeoX", **CASES["neox-parallel"][1])
    hf.save_pretrained(tmp_path / "in", safe_serialization=True)
    model = zoo.from_hf(tmp_path / "in")
    D = 16
    theirs = hf.state_dict()["gpt_neox.layers.0.attention.query_key_value.weight"]  # (H * 3 * D, C)
    ours = model.state_dict()["decoder.layers.0.self_attn.qkv_proj.weight"]  # (3 * H * D, C)
    # head 1's key rows: HF block (head 1, part k) = rows 3D + D.., zoo block (part k, head 1) = rows 4D + D..
    assert torch.equal(ours[4 * D + D : 4 * D + 2 * D], theirs[3 * D + D : 3 * D + 2 * D])
    zoo.to_hf(model, tmp_path / "out")
    saved = load_file(tmp_path / "out" / "model.safetensors")
    original = load_file(tmp_path / "in" / "model.safetensors")
    assert "embed_out.weight" in saved  # the published name (transformers 5 saves it too)
    assert set(saved) == set(original)
    for key, tensor in saved.items():
        assert torch.equal(tensor, original[key]), key


def test_neox_head_saved_as_lm_head_is_read_too(tmp_path) -> None:
    hf = hf_model("GPTNeoX", **CASES["neox-parallel"][1])
    hf.save_pretrained(tmp_path, safe_serialization=True)
    tensors = load_file(tmp_path / "model.safetensors")
    tensors["lm_head.weight"] = tensors.pop("embed_out.weight")  # transformers 5's module name
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    assert_logits_match(zoo.from_hf(tmp_path), hf)


# -- the published shapes ----------------------------------------------------------------------------------

# config.json of each published checkpoint (the fields that shape the model), as on its model card.
PUBLISHED = {
    "pythia-160m": dict(
        model_type="gpt_neox", architectures=["GPTNeoXForCausalLM"], vocab_size=50304, hidden_size=768,
        num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072, hidden_act="gelu",
        max_position_embeddings=2048, rotary_pct=0.25, rotary_emb_base=10000, use_parallel_residual=True,
        layer_norm_eps=1e-5, initializer_range=0.02, tie_word_embeddings=False, bos_token_id=0, eos_token_id=0,
    ),
    "phi-3-mini-4k": dict(
        model_type="phi3", architectures=["Phi3ForCausalLM"], vocab_size=32064, hidden_size=3072,
        intermediate_size=8192, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32,
        hidden_act="silu", max_position_embeddings=4096, original_max_position_embeddings=4096,
        rms_norm_eps=1e-5, rope_scaling=None, rope_theta=10000.0, sliding_window=2047, initializer_range=0.02,
        tie_word_embeddings=False, bos_token_id=1, eos_token_id=32000, pad_token_id=32000,
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_preset_is_the_spec_its_published_config_imports_as(name) -> None:
    """The preset says what `zoo.from_hf` would make of the published checkpoint, and exports back to it."""
    config = PUBLISHED[name]
    mapping = next(m for m in family_mappings() if config["model_type"] in m.model_types)
    imported = mapping.config_to_spec(config, set())
    preset = zoo.preset(name)
    assert preset.override(name=None, source=None) == imported
    exported = mapping.spec_to_config(preset)
    keys = [k for k in config if k in exported and k != "rope_scaling"]
    assert {k: exported[k] for k in keys} == {k: config[k] for k in keys}


# -- refusals ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("preset", "changes", "model_type", "message"),
    [
        ("llama-tiny", {"position": {"kind": "rotary", "fraction": 0.5}}, "llama",
         r"llama cannot express position\.fraction=0\.5 \(read back as 1\.0\)"),
        ("llama-tiny", {"norm": {"kind": "rmsnorm", "placement": "pre", "residual": "parallel"}}, "llama",
         r"llama cannot express norm\.residual='parallel' \(read back as 'sequential'\)"),
        ("phi3-tiny", {"norm": {"kind": "rmsnorm", "placement": "pre", "residual": "parallel"}}, "phi3",
         r"phi3 cannot express norm\.residual='parallel'"),
        ("llama-tiny", {"position": {"kind": "rotary", "scaling": {"type": "linear", "factor": 2.0}}}, "phi3",
         r"phi3 cannot express position\.scaling\.type='linear' \(read back as None\)"),
        ("phi3-tiny", {"position": {"fraction": 1.0, "scaling": {"short_factor": [1.0] * 8,
                                                                 "long_factor": [2.0] * 8}}}, "llama",
         r"llama cannot express position\.scaling\.type='longrope'"),
        ("phi3-tiny", {"decoder": {"layer_patterns": [{"kind": "causal"},
                                                      {"kind": "sliding_window", "window": 8}]}}, "phi3",
         r"phi3 cannot express decoder\.layer_patterns .*one sliding_window to every layer"),
        ("pythia-tiny", {"attention": {"num_heads": 4, "num_kv_heads": 2}}, "gpt_neox",
         r"gpt_neox cannot express attention\.num_kv_heads=2"),
        ("pythia-tiny", {"decoder": {"pattern": {"kind": "sliding_window", "window": 8}}}, "gpt_neox",
         r"gpt_neox cannot express decoder\.pattern=\{'kind': 'sliding_window'"),
        ("pythia-tiny", {}, "gpt2", r"gpt2 cannot express position\.kind='rotary'"),
    ],
)  # fmt: skip
def test_an_export_that_would_drop_an_option_is_refused_naming_it(
    tmp_path, preset, changes, model_type, message
) -> None:
    model = zoo.build(zoo.preset(preset).override(**changes), device="meta")
    with pytest.raises(HFError, match=message):
        zoo.to_hf(model, tmp_path, model_type=model_type)


def test_partial_rotary_and_parallel_residual_choose_their_family_on_export(tmp_path) -> None:
    for preset, model_type in [("pythia-tiny", "gpt_neox"), ("phi3-tiny", "phi3")]:
        zoo.to_hf(zoo.build(preset), tmp_path / preset)
        assert json.loads((tmp_path / preset / "config.json").read_text())["model_type"] == model_type


def test_phi3_su_scaling_and_an_explicit_factor_read_as_longrope() -> None:
    mapping = next(m for m in family_mappings() if "phi3" in m.model_types)
    rope = {"type": "su", "short_factor": [1.0] * 8, "long_factor": [2.0] * 8, "factor": 4.0}
    spec = mapping.config_to_spec(
        {**SIZES, "rope_scaling": rope, "original_max_position_embeddings": 16}, set()
    )
    scaling = spec.position.scaling
    assert scaling.type == "longrope" and scaling.original_max_positions == 16
    assert scaling.attention_factor == pytest.approx(math.sqrt(1 + math.log(4.0) / math.log(16)))


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"rope_scaling": {"type": "longrope", "short_factor": [1.0] * 8}}, r"needs 'long_factor'"),
        ({"rope_scaling": {"type": "longrope", "short_factor": [1.0] * 3, "long_factor": [1.0] * 3}},
         r"longrope needs one factor per rotary frequency \(8 = rotary dims / 2\), got 3"),
        ({"rope_scaling": {"type": "yarn", "factor": 2.0}}, r"rope_type='yarn' is not supported.*default, longrope"),
        ({"rope_scaling": {"type": "linear", "factor": 2.0}}, r"rope_type='linear' is not supported"),
        ({"partial_rotary_factor": 0.1}, r"fraction \(0\.1\) rotates int\(16 \* 0\.1\) = 1 dims"),
    ],
)  # fmt: skip
def test_phi3_rotary_settings_zoo_cannot_run_are_refused_naming_them(tmp_path, config, message) -> None:
    hf_model("Phi3").save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    saved.pop("rope_parameters", None)
    (tmp_path / "config.json").write_text(json.dumps(saved | config))
    with pytest.raises((HFError, SpecError), match=message):
        zoo.from_hf(tmp_path)


def test_parallel_residual_needs_pre_norm() -> None:
    with pytest.raises(SpecError, match=r"residual 'parallel' needs placement 'pre'"):
        zoo.preset("bert-tiny").override(norm={"residual": "parallel"})


def test_longrope_is_refused_where_transformers_generation_keeps_the_stale_cache(tmp_path) -> None:
    transformers.LlamaForCausalLM(transformers.LlamaConfig(**SIZES)).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    rope = {"rope_type": "longrope", "rope_theta": 1e4, "short_factor": [1.0] * 8, "long_factor": [2.0] * 8}
    (tmp_path / "config.json").write_text(
        json.dumps(config | {"rope_parameters": rope, "rope_scaling": None})
    )
    with pytest.raises(
        HFError, match=r"rope_type='longrope' is not supported \(this family's transformers generation"
    ):
        zoo.from_hf(tmp_path)
