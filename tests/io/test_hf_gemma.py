"""Hugging Face interop for Gemma 1, 2 and 3 (text): (1 + weight) RMSNorms, scaled embeddings, GeGLU, free
head_dim, Gemma 2's logit scale, attention and final soft-capping, sandwich norms and local/global layers,
Gemma 3's q/k norms and per-layer-type rotary bases.

Each case is a small random transformers model with lively weights (every parameter drawn or perturbed, so
a swapped or dropped norm shows in the logits), every option away from its default, saved with
``save_pretrained``. Batches are left-padded and transformers gets the position ids its ``generate`` makes,
so real tokens sit at the same positions in both libraries. Rows run past the window of 8.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import hf_decoder_parity as parity
import pytest
import torch
from hf_decoder_parity import assert_greedy_generate_matches, export_and_reload, liven, reload_hf

import zoo
from zoo.io.hf import HFError

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

V = 128
SIZES = dict(
    num_hidden_layers=3, hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
    head_dim=24, vocab_size=V, max_position_embeddings=64, bos_token_id=1, eos_token_id=2, pad_token_id=0,
)  # fmt: skip
LAYER_TYPES = ["sliding_attention", "full_attention", "sliding_attention"]
# Small caps so that soft-capping bites (logits reach ~10); eps 0.25 so a norm built with another eps shows.
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "gemma": ("Gemma", dict(rms_norm_eps=0.25, attention_bias=True, hidden_act="silu", tie_word_embeddings=False,
                            rope_parameters={"rope_type": "default", "rope_theta": 500.0})),
    "gemma2": ("Gemma2", dict(query_pre_attn_scalar=40, attn_logit_softcapping=3.0, final_logit_softcapping=5.0,
                              sliding_window=8, rms_norm_eps=0.25, attention_bias=True,
                              rope_parameters={"rope_type": "linear", "rope_theta": 500.0, "factor": 2.0})),
    "gemma3": ("Gemma3", dict(query_pre_attn_scalar=40, final_logit_softcapping=5.0, sliding_window=8,
                              rms_norm_eps=0.25, attention_bias=True, tie_word_embeddings=False,
                              layer_types=LAYER_TYPES,
                              rope_parameters={"full_attention": {"rope_type": "linear", "factor": 2.0,
                                                                  "rope_theta": 5000.0},
                                               "sliding_attention": {"rope_type": "default", "rope_theta": 300.0}})),
}  # fmt: skip


def hf_model(prefix: str, **options: Any) -> torch.nn.Module:
    config_class = "Gemma3TextConfig" if prefix == "Gemma3" else f"{prefix}Config"
    config = getattr(transformers, config_class)(**{**SIZES, **options})
    return liven(getattr(transformers, f"{prefix}ForCausalLM")(config))


def assert_logits_match(model: zoo.ZooModel, hf: torch.nn.Module) -> None:
    parity.assert_logits_match(model, hf, signal=1.0)


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


_SLIDING_CAUSAL = [
    {"kind": "sliding_window", "window": 8},
    {"kind": "causal"},
    {"kind": "sliding_window", "window": 8},
]
# What each case's config.json must become, as dotted spec fields.
IMPORTED = {
    "gemma": {"norm.unit_offset": True, "norm.placement": "pre", "embedding.scale": True, "attention.head_dim": 24,
              "attention.scale": None, "attention.softcap": None, "attention.bias": True, "ffn.activation": "silu",
              "position.theta": 500.0, "decoder.layer_patterns": None, "lm_head.tied": False},
    "gemma2": {"norm.placement": "sandwich", "norm.eps": 0.25, "attention.scale": 40**-0.5, "attention.softcap": 3.0,
               "lm_head.softcap": 5.0, "ffn.activation": "gelu_tanh", "decoder.layer_patterns": _SLIDING_CAUSAL,
               "position.scaling": {"type": "linear", "factor": 2.0}, "position.local_theta": None},
    "gemma3": {"norm.placement": "sandwich", "attention.qk_norm": True, "attention.qk_norm_eps": 0.25,
               "attention.softcap": None, "lm_head.softcap": 5.0, "position.theta": 5000.0,
               "position.scaling": {"type": "linear", "factor": 2.0}, "position.local_theta": 300.0,
               "decoder.layer_patterns": _SLIDING_CAUSAL},
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
    assert_greedy_generate_matches(hf, model, [30, 21, 9])  # + 10 new tokens: far past the window of 8


def test_to_hf_loads_in_transformers_with_no_missing_keys_and_same_logits(case, tmp_path) -> None:
    _, hf, path, model = case
    assert_logits_match(model, export_and_reload(model, hf, path, tmp_path))


# -- the published shapes ----------------------------------------------------------------------------------

# config.json of each published checkpoint (the fields that shape the model), as on its model card.
PUBLISHED = {
    "gemma-2b": dict(
        model_type="gemma", architectures=["GemmaForCausalLM"], vocab_size=256000, hidden_size=2048,
        intermediate_size=16384, num_hidden_layers=18, num_attention_heads=8, num_key_value_heads=1, head_dim=256,
        hidden_act="gelu_pytorch_tanh", max_position_embeddings=8192, rms_norm_eps=1e-6, rope_theta=10000.0,
        attention_bias=False, bos_token_id=2, eos_token_id=1, pad_token_id=0,
    ),
    "gemma-2-2b": dict(
        model_type="gemma2", architectures=["Gemma2ForCausalLM"], vocab_size=256000, hidden_size=2304,
        intermediate_size=9216, num_hidden_layers=26, num_attention_heads=8, num_key_value_heads=4, head_dim=256,
        hidden_activation="gelu_pytorch_tanh", max_position_embeddings=8192, rms_norm_eps=1e-6,
        rope_theta=10000.0, query_pre_attn_scalar=256, sliding_window=4096, attn_logit_softcapping=50.0,
        final_logit_softcapping=30.0, attention_bias=False, bos_token_id=2, eos_token_id=1, pad_token_id=0,
    ),
    "gemma-3-1b": dict(
        model_type="gemma3_text", architectures=["Gemma3ForCausalLM"], vocab_size=262144, hidden_size=1152,
        intermediate_size=6912, num_hidden_layers=26, num_attention_heads=4, num_key_value_heads=1, head_dim=256,
        hidden_activation="gelu_pytorch_tanh", max_position_embeddings=32768, rms_norm_eps=1e-6,
        rope_theta=1000000, rope_local_base_freq=10000, rope_scaling=None, query_pre_attn_scalar=256,
        sliding_window=512, sliding_window_pattern=6, attn_logit_softcapping=None, final_logit_softcapping=None,
        attention_bias=False, bos_token_id=2, eos_token_id=1, pad_token_id=0,
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
    keys = [k for k in config if k in exported and k not in ("rope_scaling", "architectures")]
    assert {k: exported[k] for k in keys} == {k: config[k] for k in keys}


def test_gemma_reads_the_released_configs_gelu_as_the_tanh_form_as_transformers_does() -> None:
    from zoo.io.hf import family_mappings

    mapping = next(m for m in family_mappings() if "gemma" in m.model_types)
    spec = mapping.config_to_spec({**SIZES, "model_type": "gemma", "hidden_act": "gelu"}, set())
    assert spec.ffn.activation == "gelu_tanh"


def test_a_4x_gemma3_config_reads_its_rope_bases_and_window_pattern(tmp_path) -> None:
    """Gemma 3 configs on the Hub keep rope_local_base_freq / rope_theta / sliding_window_pattern at the top."""
    from zoo.io.hf import family_mappings

    mapping = next(m for m in family_mappings() if "gemma3_text" in m.model_types)
    config = {**SIZES, "model_type": "gemma3_text", "num_hidden_layers": 4, "rope_theta": 7000.0,
              "rope_local_base_freq": 70.0, "sliding_window_pattern": 2, "sliding_window": 8}  # fmt: skip
    spec = mapping.config_to_spec(config, set())
    assert (spec.position.theta, spec.position.local_theta) == (7000.0, 70.0)
    assert [p.kind for p in spec.decoder.layer_patterns] == ["sliding_window", "causal"] * 2


# -- refusals ----------------------------------------------------------------------------------------------


def _saved(path: Path, prefix: str, **config_changes: Any) -> Path:
    hf_model(prefix, **dict(CASES[prefix.lower()][1])).save_pretrained(path)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps(config | config_changes))
    return path


@pytest.mark.parametrize(
    ("prefix", "changes", "message"),
    [
        ("Gemma2", {"use_bidirectional_attention": True}, r"use_bidirectional_attention=True is not supported"),
        ("Gemma3", {"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e4},
                                        "sliding_attention": {"rope_type": "linear", "factor": 2.0}}},
         r"rope_parameters\.sliding_attention=.*plain rotary"),
        ("Gemma2", {"sliding_window": None}, r"sliding_window=None: layer_types has 'sliding_attention' layers"),
        ("Gemma3", {"model_type": "gemma3"}, r"model_type 'gemma3' is Gemma 3's multimodal model.*gemma3_text"),
    ],
)  # fmt: skip
def test_configs_zoo_cannot_run_exactly_are_refused_naming_the_key(
    tmp_path, prefix, changes, message
) -> None:
    with pytest.raises(HFError, match=message):
        zoo.from_hf(_saved(tmp_path, prefix, **changes))


def test_exports_that_would_drop_a_gemma_option_are_refused_naming_the_field(tmp_path) -> None:
    both = zoo.preset("gemma-tiny").override(
        **{"attention.qk_norm": True}
    )  # no Gemma has softcap and q/k norms
    tiny = zoo.build(both)
    with pytest.raises(HFError, match=r"gemma2 cannot express attention\.qk_norm=True"):
        zoo.to_hf(tiny, tmp_path, model_type="gemma2")
    with pytest.raises(HFError, match=r"gemma3_text cannot express attention\.softcap=20\.0"):
        zoo.to_hf(tiny, tmp_path, model_type="gemma3_text")
    with pytest.raises(HFError, match=r"llama cannot express norm\.placement='sandwich'"):
        zoo.to_hf(tiny, tmp_path, model_type="llama")
    capped_llama = zoo.build(zoo.preset("llama-tiny").override(**{"attention.softcap": 10.0}))
    with pytest.raises(HFError, match=r"llama cannot express attention\.softcap=10\.0"):
        zoo.to_hf(capped_llama, tmp_path, model_type="llama")
    local = zoo.build(zoo.preset("gemma-2-2b", num_layers=2, vocab_size=64, d_model=32, **{
        "attention.num_heads": 2, "attention.num_kv_heads": 1, "attention.head_dim": 8, "ffn.d_ff": 16, "position.local_theta": 100.0,
        "decoder.layer_patterns": [{"kind": "sliding_window", "window": 8}, {"kind": "causal"}]}))  # fmt: skip
    with pytest.raises(HFError, match=r"gemma2 cannot express position\.local_theta=100\.0"):
        zoo.to_hf(local, tmp_path, model_type="gemma2")
    unscaled = zoo.build(zoo.preset("gemma-tiny").override(**{"norm.unit_offset": False}))
    with pytest.raises(HFError, match=r"cannot express norm\.unit_offset=False"):
        zoo.to_hf(unscaled, tmp_path, model_type="gemma2")
    assert not any(tmp_path.iterdir())  # refused before a file is written


def test_the_tiny_preset_exports_as_gemma2_and_loads_in_transformers(tmp_path) -> None:
    torch.manual_seed(0)
    model = zoo.build("gemma-tiny").eval()
    zoo.to_hf(model, tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "gemma2"
    reloaded = reload_hf(tmp_path)
    ids = torch.randint(3, 512, (2, 20))
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, reloaded(input_ids=ids).logits, atol=1e-4, rtol=1e-4)


def test_gemma3_without_a_local_base_exports_its_scaling_for_the_local_layers_too(tmp_path) -> None:
    """position.local_theta null: every layer rotates alike, scaling included; gemma3_text says so per type."""
    spec = zoo.preset("gemma-3-1b").override(
        vocab_size=V, d_model=64, num_layers=2, max_positions=64, pad_token_id=0, bos_token_id=1, eos_token_id=2,
        attention={"num_heads": 4, "num_kv_heads": 2, "head_dim": 24, "qk_norm_eps": 1e-6},
        ffn={"d_ff": 96}, position={"kind": "rotary", "theta": 700.0, "scaling": {"type": "linear", "factor": 3.0},
                                    "local_theta": None},
        decoder={"layer_patterns": [{"kind": "sliding_window", "window": 8}, {"kind": "causal"}]},
    )  # fmt: skip
    torch.manual_seed(0)
    model = zoo.build(spec).eval()
    with torch.no_grad():  # lively weights, every norm perturbed
        for name, param in model.named_parameters():
            if param.dim() >= 2:
                param.normal_(0.0, 0.3 if "embed" in name else 0.25)
            else:
                param.add_(torch.randn_like(param) * 0.1)
    zoo.to_hf(model, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["rope_parameters"]["sliding_attention"] == config["rope_parameters"]["full_attention"]
    assert_logits_match(model, reload_hf(tmp_path))
    assert zoo.from_hf(tmp_path).spec.position == spec.position
