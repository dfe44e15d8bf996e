"""Hugging Face interop for Llama 4's text stack (``llama4_text``): chunked attention on the rotary layers,
no-rope layers with temperature tuning, the weightless q/k norm on the rotary layers, the complex-number
rotary (interleaved pairs, read into rotate-half), and the interleaved MoE with a shared expert whose router
weight scales the experts' input.

Each case is a small random transformers model with every parameter drawn or perturbed and options away from
their defaults: a chunk of 8 so the 40-token left-padded rows cross several chunks, a floor_scale of 4 and a
large attn_scale so temperature tuning changes the no-rope layers from the first tokens on, dense layers
between the sparse ones (``interleave_moe_layer_step`` or ``moe_layers``), top-1 and top-2 routing, no q/k norm,
no chunking, Llama 3 rotary scaling.
"""

from __future__ import annotations

import json
from typing import Any

import hf_decoder_parity as parity
import pytest
import torch
from hf_decoder_parity import assert_greedy_generate_matches, export_and_reload

import zoo
from zoo.io.hf import HFError
from zoo.io.hf.common import TypedConfig
from zoo.io.hf.llama4 import MAPPING

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

V = 128
SIZES = dict(
    num_hidden_layers=4, hidden_size=64, intermediate_size=40, intermediate_size_mlp=72, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, vocab_size=V, max_position_embeddings=64, bos_token_id=1,
    eos_token_id=2, pad_token_id=0, num_local_experts=4, num_experts_per_tok=1, attention_chunk_size=8,
    floor_scale=4, attn_scale=0.5, no_rope_layer_interval=2,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
)  # fmt: skip
CASES: dict[str, dict[str, Any]] = {
    # Scout's rotary kind: llama3 with equal low and high factors (no band), past an original context of 16
    "llama4": dict(interleave_moe_layer_step=2,
                   rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 4.0, "low_freq_factor": 1.0,
                                    "high_freq_factor": 1.0, "original_max_position_embeddings": 16}),
    "llama4-top2-moe-layers-tied": dict(num_experts_per_tok=2, moe_layers=[0, 3], no_rope_layers=[1, 0, 0, 1],
                                        head_dim=24, tie_word_embeddings=True, rms_norm_eps=0.25),
    "llama4-no-qk-norm-no-chunks-llama3": dict(
        use_qk_norm=False, attention_chunk_size=None, attn_temperature_tuning=False, attention_bias=True,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 16}),
}  # fmt: skip


def hf_model(**options: Any) -> torch.nn.Module:
    config = transformers.Llama4TextConfig(**{**SIZES, **options})
    return parity.liven(transformers.Llama4ForCausalLM(config))


@pytest.fixture(scope="module", params=list(CASES))
def case(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    hf = hf_model(**CASES[request.param])
    path = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(path, safe_serialization=True)
    return request.param, hf, path, zoo.from_hf(path)


def test_from_hf_logits_match_on_a_left_padded_batch(case) -> None:
    _, hf, _, model = case
    parity.assert_logits_match(model, hf)


def test_import_reads_chunks_nope_layers_qk_norm_and_the_moe_options(case) -> None:
    name, _, _, model = case
    spec = model.spec.model_dump()
    ffn, attention = spec["ffn"], spec["attention"]
    assert ffn["scoring"] == "sigmoid" and ffn["weighted_input"] and not ffn["normalize_top_k"]
    assert ffn["shared_d_ff"] == 40 and not ffn["shared_gate"]
    assert ffn["dense_d_ff"] == (None if name.startswith("llama4-no-qk") else 72)  # every layer sparse there
    if name == "llama4":
        assert spec["position"]["nope_layers"] == [1, 3] and ffn["sparse_step"] == 2
        assert [p["kind"] for p in spec["decoder"]["layer_patterns"]] == ["chunked", "causal"] * 2
        assert attention["qk_norm_layers"] == "rotary" and not attention["qk_norm_weight"]
        assert attention["temperature_tuning"] == {"floor_scale": 4, "scale": 0.5, "count": "slot"}
    elif name == "llama4-top2-moe-layers-tied":
        assert spec["position"]["nope_layers"] == [1, 2] and ffn["dense_layers"] == [1, 2]
    else:
        assert not attention["qk_norm"] and attention["temperature_tuning"] is None
        assert spec["decoder"]["layer_patterns"] is None and spec["decoder"]["pattern"] is None


def test_each_option_changes_the_logits(case) -> None:
    """The parity above sees the chunks, the temperature tuning and the q/k norm: without each, zoo's model
    no longer matches."""
    name, hf, _, model = case
    if name != "llama4":
        pytest.skip("one case suffices")
    for change in (
        {"decoder": {"layer_patterns": None}},
        {"attention": {"temperature_tuning": None}},
        {"attention": {"qk_norm_layers": "all"}},
    ):
        other = zoo.build(model.spec.override(**change))
        other.load_state_dict(model.state_dict())
        with pytest.raises(AssertionError):
            parity.assert_logits_match(other.eval(), hf)


def test_greedy_generate_matches_transformers_on_left_padded_prompts(case) -> None:
    _, hf, _, model = case
    assert_greedy_generate_matches(hf, model, [30, 21, 9], new_tokens=12)


def test_to_hf_loads_in_transformers_with_no_missing_keys_and_same_logits(case, tmp_path) -> None:
    _, hf, path, model = case
    parity.assert_logits_match(model, export_and_reload(model, hf, path, tmp_path))


def test_the_exported_tensors_equal_the_imported_ones(case, tmp_path) -> None:
    """The q/k row permutation and the expert transposes are undone exactly on export."""
    _, hf, _, model = case
    zoo.to_hf(model, tmp_path)
    from safetensors.torch import load_file

    written = load_file(tmp_path / "model.safetensors")
    for name, tensor in hf.state_dict().items():
        if name in written:
            assert torch.equal(written[name], tensor), name


# -- the preset ------------------------------------------------------------------------------------------------

SCOUT = dict(
    vocab_size=202048, hidden_size=5120, intermediate_size=8192, intermediate_size_mlp=16384, num_hidden_layers=48,
    num_attention_heads=40, num_key_value_heads=8, head_dim=128, max_position_embeddings=10485760,
    rms_norm_eps=1e-5, num_experts_per_tok=1, num_local_experts=16, interleave_moe_layer_step=1, use_qk_norm=True,
    no_rope_layers=[1, 1, 1, 0] * 12, attention_chunk_size=8192, attn_temperature_tuning=True, floor_scale=8192,
    attn_scale=0.1, attention_bias=False, tie_word_embeddings=False, pad_token_id=200018, bos_token_id=200000,
    eos_token_id=[200001, 200007, 200008],
    rope_parameters={"rope_type": "llama3", "factor": 16.0, "original_max_position_embeddings": 8192,
                     "high_freq_factor": 1.0, "low_freq_factor": 1.0, "rope_theta": 500000.0},
)  # fmt: skip


def test_the_scout_preset_counts_what_transformers_builds_on_meta_and_is_what_its_config_reads_as(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """meta-llama/Llama-4-Scout-17B-16E's text_config: transformers' Llama4ForCausalLM on the meta device has
    the preset's parameter count, and zoo reads the config as the preset (but for the context length, which
    the preset keeps under zoo's default limit)."""
    config = transformers.Llama4TextConfig(**SCOUT)
    with torch.device("meta"):
        expected = sum(p.numel() for p in transformers.Llama4ForCausalLM(config).parameters())
    assert zoo.build("llama-4-scout", device="meta").num_parameters() == expected == 107_769_861_120
    monkeypatch.setenv("ZOO_MAX_POSITIONS", "10485760")
    written = {"model_type": "llama4_text", "architectures": ["Llama4ForCausalLM"], **SCOUT}
    read = MAPPING.config_to_spec(TypedConfig(written), {"lm_head.weight"})
    preset = zoo.preset("llama-4-scout")
    assert read.max_positions == 10485760
    assert read.override(name=None, source=None, max_positions=preset.max_positions) == preset.override(
        name=None, source=None
    )


def test_the_tiny_preset_exports_and_runs_in_transformers(tmp_path) -> None:
    model = zoo.build("llama4-tiny")
    zoo.to_hf(model, tmp_path)
    hf = parity.reload_hf(tmp_path)
    assert type(hf).__name__ == "Llama4ForCausalLM"
    parity.assert_logits_match(model.eval(), hf, signal=0.0)


# -- refusals ----------------------------------------------------------------------------------------------


def test_a_gated_shared_expert_is_refused_naming_the_field(tmp_path) -> None:
    model = zoo.from_hf(_saved(tmp_path / "in"))
    other = zoo.build(model.spec.override(ffn={"shared_gate": True}))
    with pytest.raises(HFError, match=r"shared_gate"):
        zoo.to_hf(other, tmp_path / "out")


def test_a_sliding_window_is_refused_naming_the_field(tmp_path) -> None:
    model = zoo.from_hf(_saved(tmp_path / "in"))
    other = zoo.build(
        model.spec.override(
            decoder={"layer_patterns": None, "pattern": {"kind": "sliding_window", "window": 8}}
        )
    )
    with pytest.raises(HFError, match=r"decoder\.pattern"):
        zoo.to_hf(other, tmp_path / "out")


def test_temperature_tuning_by_position_is_refused_naming_the_field(tmp_path) -> None:
    """transformers counts slots (left padding included): a spec counting positions would export silently
    changed."""
    model = zoo.from_hf(_saved(tmp_path / "in"))
    other = zoo.build(model.spec.override(**{"attention.temperature_tuning.count": "position"}))
    with pytest.raises(HFError, match=r"attention\.temperature_tuning"):
        zoo.to_hf(other, tmp_path / "out")


def test_bad_no_rope_layers_are_refused_by_name(tmp_path) -> None:
    path = _saved(tmp_path)
    config = json.loads((path / "config.json").read_text())
    config["no_rope_layers"] = [1, 2, 0, 1]
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(HFError, match=r"no_rope_layers"):
        zoo.read_hf_spec(path)


def _saved(path):
    hf_model(interleave_moe_layer_step=2).save_pretrained(path)
    return path
