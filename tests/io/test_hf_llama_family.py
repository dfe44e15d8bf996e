"""Hugging Face interop for the Llama family beyond plain Llama: Llama 3 rotary scaling (llama3, linear),
Mistral's sliding window, Qwen2's q/k/v biases and Qwen's per-layer windows, Qwen3's q/k norms.

Each case is a small random transformers model with lively weights (every parameter drawn or perturbed, so
a swapped or dropped bias or norm shows in the logits), saved with ``save_pretrained``. Batches are
left-padded and transformers gets the position ids its ``generate`` makes (``cumsum(mask) - 1``), so real
tokens sit at the same positions in both libraries. Sequences run past the window and past the rotary
schedule's original context. Nothing is downloaded.
"""

from __future__ import annotations

import json
from pathlib import Path
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
from zoo.io.hf import HFError
from zoo.spec import SpecError

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

V = 128
SIZES = dict(
    num_hidden_layers=2, hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
    vocab_size=V, max_position_embeddings=64, bos_token_id=1, eos_token_id=2, pad_token_id=0,
)  # fmt: skip
# head_dim 16, theta 1e4: rotary wavelengths 6.3, 19.9, 62.8, ... so with original context 32 the llama3
# schedule keeps one frequency (< 32/4), blends one (between 8 and 32) and slows the rest (> 32).
LLAMA3 = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 4.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 32}  # fmt: skip
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "llama-llama3": ("Llama", dict(rope_parameters=LLAMA3)),
    "llama-linear": ("Llama", dict(rope_parameters={"rope_type": "linear", "rope_theta": 500.0, "factor": 2.0},
                                   tie_word_embeddings=True)),
    "mistral-window": ("Mistral", dict(sliding_window=8)),
    "qwen2-biases": ("Qwen2", dict(rms_norm_eps=1e-5)),
    "qwen2-window-per-layer": ("Qwen2", dict(use_sliding_window=True, sliding_window=8, max_window_layers=1)),
    "qwen3-qk-norm": ("Qwen3", dict(head_dim=24, rms_norm_eps=0.25, attention_bias=True, tie_word_embeddings=True)),
}  # fmt: skip
# Qwen3's eps is large so that a q/k norm built with another eps (zoo's 1e-6 default) shows in the logits.


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
    "llama-llama3": {"position.scaling": dict(type="llama3", factor=4.0, low_freq_factor=1.0,
                                              high_freq_factor=4.0, original_max_positions=32)},
    "llama-linear": {"position.scaling": {"type": "linear", "factor": 2.0}, "position.theta": 500.0,
                     "lm_head.tied": True},
    "mistral-window": {"decoder.pattern": {"kind": "sliding_window", "window": 8}, "attention.bias": False},
    "qwen2-biases": {"attention.bias": True, "attention.out_bias": False, "decoder.pattern": None},
    "qwen2-window-per-layer": {"decoder.pattern": None, "decoder.layer_patterns": [
        {"kind": "causal"}, {"kind": "sliding_window", "window": 8}]},
    "qwen3-qk-norm": {"attention.qk_norm": True, "attention.qk_norm_eps": 0.25, "attention.head_dim": 24,
                      "attention.bias": True, "attention.out_bias": None, "lm_head.tied": True},
}  # fmt: skip


def test_import_reads_each_variant_into_its_spec_fields(case) -> None:
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
    name, hf, path, model = case
    assert_logits_match(model, export_and_reload(model, hf, path, tmp_path))
    config = json.loads((tmp_path / "config.json").read_text())
    if name == "llama-llama3":  # both the 4.x field and the 5.x one
        assert config["rope_scaling"]["rope_type"] == config["rope_parameters"]["rope_type"] == "llama3"
    if name == "qwen2-window-per-layer":
        assert config["layer_types"] == ["full_attention", "sliding_attention"]
        assert (config["use_sliding_window"], config["sliding_window"], config["max_window_layers"]) == (
            True,
            8,
            1,
        )


# -- the published shapes ----------------------------------------------------------------------------------

# config.json of each published checkpoint (the fields that shape the model), as on its model card.
PUBLISHED = {
    "llama-3.2-1b": dict(
        model_type="llama", architectures=["LlamaForCausalLM"], vocab_size=128256, hidden_size=2048,
        intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8, head_dim=64,
        max_position_embeddings=131072, rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=True,
        rope_scaling={"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                      "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        attention_bias=False, mlp_bias=False, bos_token_id=128000, eos_token_id=128001,
    ),
    "mistral-7b": dict(
        model_type="mistral", architectures=["MistralForCausalLM"], vocab_size=32000, hidden_size=4096,
        intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
        max_position_embeddings=32768, rms_norm_eps=1e-5, rope_theta=10000.0, sliding_window=4096,
        tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
    ),
    "qwen2-0.5b": dict(
        model_type="qwen2", architectures=["Qwen2ForCausalLM"], vocab_size=151936, hidden_size=896,
        intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
        max_position_embeddings=131072, rms_norm_eps=1e-6, rope_theta=1000000.0, use_sliding_window=False,
        sliding_window=131072, max_window_layers=24, tie_word_embeddings=True, bos_token_id=151643,
        eos_token_id=151643,
    ),
    "qwen3-0.6b": dict(
        model_type="qwen3", architectures=["Qwen3ForCausalLM"], vocab_size=151936, hidden_size=1024,
        intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
        max_position_embeddings=40960, rms_norm_eps=1e-6, rope_theta=1000000, rope_scaling=None,
        attention_bias=False, use_sliding_window=False, sliding_window=None, max_window_layers=28,
        tie_word_embeddings=True, bos_token_id=151643, eos_token_id=151645,
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_preset_is_the_spec_its_published_config_imports_as(name) -> None:
    """The preset says what `zoo.from_hf` would make of the published checkpoint (initialisation aside)."""
    from zoo.io.hf import family_mappings

    config = PUBLISHED[name]
    mapping = next(m for m in family_mappings() if config["model_type"] in m.model_types)
    imported = mapping.config_to_spec(config, set())
    preset = zoo.preset(name)
    assert preset.override(name=None, source=None, init=imported.init) == imported
    exported = mapping.spec_to_config(preset)
    # rope_scaling: written as rope_parameters too; a switched-off window's size says nothing
    unread = {"rope_scaling"} | (
        {"sliding_window", "max_window_layers"} if not config.get("use_sliding_window", True) else set()
    )
    keys = [k for k in config if k in exported and k not in unread]
    assert {k: exported[k] for k in keys} == {k: config[k] for k in keys}
    if "rope_scaling" in exported:
        assert exported["rope_scaling"] == config.get("rope_scaling")


# -- refusals ----------------------------------------------------------------------------------------------


def _saved_llama(path: Path, **config_changes: Any) -> Path:
    transformers.LlamaForCausalLM(transformers.LlamaConfig(**SIZES)).save_pretrained(path)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps(config | config_changes))
    return path


@pytest.mark.parametrize(
    ("rope", "message"),
    [
        (
            {"rope_type": "longrope", "short_factor": [1.0] * 8, "long_factor": [2.0] * 8},
            r"rope_type='longrope' is not supported.*llama3, linear, yarn, dynamic",
        ),
        (
            {"rope_type": "ntk-by-parts", "factor": 4.0},
            r"rope_type='ntk-by-parts' is not supported.*no field",
        ),
        ({"rope_type": "llama3", "factor": 8.0}, r"rope_type='llama3' needs 'low_freq_factor'"),
        ({"rope_type": "default", "partial_rotary_factor": 0.5}, r"partial_rotary_factor=0.5"),
    ],
)
def test_rotary_settings_zoo_cannot_run_are_refused_naming_them(tmp_path, rope, message) -> None:
    path = _saved_llama(tmp_path, rope_parameters={"rope_theta": 10000.0, **rope}, rope_scaling=None)
    with pytest.raises(HFError, match=message):
        zoo.from_hf(path)


def test_qwen_sliding_layers_without_a_window_are_refused(tmp_path) -> None:
    transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**SIZES)).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["layer_types"] = ["full_attention", "sliding_attention"]  # use_sliding_window stays false
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(HFError, match="'sliding_attention' layers but no window"):
        zoo.from_hf(tmp_path)


def test_export_picks_the_family_that_can_express_the_spec_and_others_refuse_naming_the_field(
    tmp_path,
) -> None:
    qkv_only = zoo.preset("llama-tiny").override(**{"attention.bias": True, "attention.out_bias": False})
    model = zoo.build(qkv_only)
    with pytest.raises(HFError, match=r"llama cannot express attention\.out_bias=False"):
        zoo.to_hf(model, tmp_path, model_type="llama")
    with pytest.raises(HFError, match=r"mistral cannot express attention\.bias=True"):
        zoo.to_hf(model, tmp_path, model_type="mistral")
    zoo.to_hf(model, tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "qwen2"
    gpt2 = zoo.build(zoo.preset("gpt2-tiny").override(**{"attention.out_bias": False}))
    with pytest.raises(HFError, match=r"gpt2 cannot express attention\.out_bias=False"):
        zoo.to_hf(gpt2, tmp_path, model_type="gpt2")
    qk_eps = zoo.build(zoo.preset("llama-tiny").override(**{"attention.qk_norm": True}))  # eps 1e-6 != 1e-5
    with pytest.raises(HFError, match=r"qwen3 cannot express attention\.qk_norm_eps=1e-06"):
        zoo.to_hf(qk_eps, tmp_path, model_type="qwen3")


def test_llama3_scaling_with_an_inverted_band_is_an_invalid_spec() -> None:
    """An empty band (equal factors, Llama 4 Scout's 1.0 and 1.0) is valid: tests/io/test_hf_llama4.py."""
    scaling = {"type": "llama3", "low_freq_factor": 4.0, "high_freq_factor": 2.0}
    with pytest.raises(
        SpecError, match=r"position\.rotary\.scaling\.llama3: .*high_freq_factor \(2\.0\) must be"
    ):
        zoo.preset("llama-tiny").override(position={"kind": "rotary", "scaling": scaling})
