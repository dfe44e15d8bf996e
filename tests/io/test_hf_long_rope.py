"""Hugging Face interop for YaRN and dynamic-NTK rotary scaling (on Llama, Qwen2, Qwen3) and SmolLM3's
no-rope layers (``position.nope_layers``).

As the other decoder families' parity tests (tests/hf_decoder_parity.py): small random transformers models
with lively weights, saved with ``save_pretrained``; left-padded batches with the position ids transformers'
generate passes. The original context is 16 and the sequences run to 40, so every scaling acts.

Dynamic NTK keeps state in transformers (the rates of the longest call since the last short one), so every
comparison runs on a model freshly loaded from the saved folder, where that state is the build-time one.
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
    left_padded,
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
YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 16}
DYNAMIC = {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 4.0}
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "llama-yarn": ("Llama", dict(rope_parameters=YARN)),
    # DeepSeek's attention factor (mscale over mscale_all_dim), other ramp bounds, untruncated
    "llama-yarn-mscale": ("Llama", dict(rope_parameters={
        **YARN, "mscale": 0.707, "mscale_all_dim": 1.0, "beta_fast": 16.0, "beta_slow": 2.0, "truncate": False})),
    "qwen2-yarn-attention-factor": ("Qwen2", dict(rope_parameters={**YARN, "factor": 3.0, "attention_factor": 1.3})),
    "qwen3-yarn": ("Qwen3", dict(head_dim=24, rope_parameters={**YARN, "factor": 2.0, "rope_theta": 500.0})),
    # dynamic grows its base from max_position_embeddings, so that is the short one here
    "llama-dynamic": ("Llama", dict(max_position_embeddings=16, rope_parameters=DYNAMIC)),
    "qwen3-dynamic": ("Qwen3", dict(max_position_embeddings=16, head_dim=24, rope_parameters={**DYNAMIC, "factor": 3.0})),
    "smollm3-interval": ("SmolLM3", dict(num_hidden_layers=4, no_rope_layer_interval=2)),
    # the listed no-rope layers slide (SmolLM3's default layer_types), beside YaRN on the others
    "smollm3-window-yarn": ("SmolLM3", dict(num_hidden_layers=3, no_rope_layers=[1, 0, 0], use_sliding_window=True,
                                            sliding_window=8, rope_parameters=YARN)),
}  # fmt: skip
IMPORTED = {
    "llama-yarn": {"position.scaling": dict(
        type="yarn", factor=4.0, original_max_positions=16, beta_fast=32.0, beta_slow=1.0, truncate=True,
        attention_factor=None, mscale=None, mscale_all_dim=None), "max_positions": 64},
    "llama-yarn-mscale": {"position.scaling": dict(
        type="yarn", factor=4.0, original_max_positions=16, beta_fast=16.0, beta_slow=2.0, truncate=False,
        attention_factor=None, mscale=0.707, mscale_all_dim=1.0)},
    "qwen2-yarn-attention-factor": {"position.scaling.attention_factor": 1.3, "position.scaling.factor": 3.0},
    "qwen3-yarn": {"position.scaling.factor": 2.0, "position.theta": 500.0},
    "llama-dynamic": {"position.scaling": dict(type="dynamic", factor=4.0, original_max_positions=16),
                      "max_positions": 64},
    "qwen3-dynamic": {"position.scaling": dict(type="dynamic", factor=3.0, original_max_positions=16),
                      "max_positions": 48},
    "smollm3-interval": {"position.nope_layers": [1, 3], "position.theta": 2000000.0, "position.scaling": None,
                         "lm_head.tied": True, "decoder.pattern": None},
    "smollm3-window-yarn": {"position.nope_layers": [1, 2], "position.scaling.type": "yarn",
                            "decoder.layer_patterns": [{"kind": "causal"}, {"kind": "sliding_window", "window": 8},
                                                       {"kind": "sliding_window", "window": 8}]},
}  # fmt: skip


def fresh(path: Path) -> torch.nn.Module:
    """transformers' model from ``path``, its rotary state as built (dynamic NTK keeps the longest call's)."""
    return transformers.AutoModelForCausalLM.from_pretrained(path).eval()


@pytest.fixture(scope="module", params=list(CASES))
def case(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """(name, the folder transformers saved, the model zoo imports from it)."""
    prefix, options = CASES[request.param]
    config = getattr(transformers, f"{prefix}Config")(**{**SIZES, **options})
    path = tmp_path_factory.mktemp(request.param)
    liven(getattr(transformers, f"{prefix}ForCausalLM")(config)).save_pretrained(path)
    return request.param, path, zoo.from_hf(path)


def test_from_hf_logits_match_on_a_left_padded_batch(case) -> None:
    _, path, model = case
    assert_logits_match(model, fresh(path))


def test_import_reads_each_option_into_its_spec_fields(case) -> None:
    name, _, model = case
    spec = model.spec.model_dump()
    for dotted, expected in IMPORTED[name].items():
        value = spec
        for part in dotted.split("."):
            value = value[part]
        assert value == expected, dotted


def test_greedy_generate_matches_transformers_on_left_padded_prompts(case) -> None:
    _, path, model = case
    assert_greedy_generate_matches(fresh(path), model, [30, 21, 9])  # + 10 new tokens, all past 16


def test_to_hf_loads_in_transformers_with_no_missing_keys_and_same_logits(case, tmp_path) -> None:
    name, path, model = case
    reloaded = export_and_reload(model, fresh(path), path, tmp_path)
    assert_logits_match(model, fresh(tmp_path))
    del reloaded
    written, source = (json.loads((p / "config.json").read_text()) for p in (tmp_path, path))
    rope = {k: v for k, v in source["rope_parameters"].items() if k not in ("beta_fast", "beta_slow")}
    assert written["rope_parameters"] | rope == written["rope_parameters"], "rope_parameters round trip"
    assert written["max_position_embeddings"] == source["max_position_embeddings"]
    if name.startswith("smollm3"):
        assert written["no_rope_layers"] == fresh(path).config.no_rope_layers


# -- dynamic NTK and the KV cache ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dynamic(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, zoo.ZooModel]:
    config = transformers.LlamaConfig(**{**SIZES, **CASES["llama-dynamic"][1]})
    path = tmp_path_factory.mktemp("dynamic")
    liven(transformers.LlamaForCausalLM(config)).save_pretrained(path)
    return path, zoo.from_hf(path)


def _generate(model: Any, ids: torch.Tensor, mask: torch.Tensor, **settings: Any) -> torch.Tensor:
    config = dict(max_new_tokens=12, eos_token_id=2, pad_token_id=0, do_sample=False) | settings
    with torch.no_grad():
        return model.generate(ids, attention_mask=mask, **config)


def test_dynamic_ntk_matches_transformers_with_and_without_the_cache(dynamic) -> None:
    """Past the original context transformers' cached keys keep the rates of the step that made them, so its
    cached and uncached generations differ; zoo's equal transformers' in each mode."""
    path, model = dynamic
    ids, mask, _ = left_padded([14, 10, 5])  # + 12 new tokens: every row crosses 16
    cached, uncached = (_generate(model, ids, mask, use_cache=use) for use in (True, False))
    assert torch.equal(cached, _generate(fresh(path), ids, mask, use_cache=True))
    assert torch.equal(uncached, _generate(fresh(path), ids, mask, use_cache=False))
    assert not torch.equal(cached, uncached)  # the nuance is real (docs/hf.md)


def test_dynamic_ntk_cached_equals_uncached_within_the_original_context(dynamic) -> None:
    _, model = dynamic
    ids, mask, _ = left_padded([6, 3])  # + 8 new tokens: positions stay below 16
    settings = dict(max_new_tokens=8)
    assert torch.equal(_generate(model, ids, mask, use_cache=True, **settings),
                       _generate(model, ids, mask, use_cache=False, **settings))  # fmt: skip


def test_dynamic_ntk_rates_follow_the_longest_position_of_the_call(dynamic) -> None:
    """A row's logits depend on the batch's longest row once that passes 16, as in transformers."""
    _, model = dynamic
    ids, mask, _ = left_padded([30, 9])
    with torch.no_grad():
        together = model(ids, attention_mask=mask).logits[1, -9:]
        alone = model(ids[1:, -9:], attention_mask=mask[1:, -9:]).logits[0]
    assert (together - alone).abs().max() > 1e-3


# -- the published shape -----------------------------------------------------------------------------------

# HuggingFaceTB/SmolLM3-3B's config.json (the fields that shape the model)
SMOLLM3_3B = dict(
    model_type="smollm3", architectures=["SmolLM3ForCausalLM"], vocab_size=128256, hidden_size=2048,
    intermediate_size=11008, num_hidden_layers=36, num_attention_heads=16, num_key_value_heads=4,
    max_position_embeddings=65536, rms_norm_eps=1e-6, rope_theta=5000000.0, tie_word_embeddings=True,
    no_rope_layer_interval=4, no_rope_layers=[int((i + 1) % 4 != 0) for i in range(36)], use_sliding_window=False,
    sliding_window=None, attention_bias=False, mlp_bias=False, bos_token_id=None, eos_token_id=128012,
    pad_token_id=128004,
)  # fmt: skip


def test_smollm3_preset_is_its_published_config_and_counts_as_transformers() -> None:
    from zoo.io.hf import family_mappings

    mapping = next(m for m in family_mappings() if "smollm3" in m.model_types)
    imported = mapping.config_to_spec(SMOLLM3_3B, set())
    preset = zoo.preset("smollm3-3b")
    assert preset.override(name=None, source=None, init=imported.init) == imported
    exported = mapping.spec_to_config(preset)
    keys = [k for k in SMOLLM3_3B if k in exported]
    assert {k: exported[k] for k in keys} == {k: SMOLLM3_3B[k] for k in keys}
    fields = {k: v for k, v in SMOLLM3_3B.items() if k not in ("model_type", "architectures")}
    with torch.device("meta"):
        theirs = transformers.SmolLM3ForCausalLM(transformers.SmolLM3Config(**fields))
    expected = sum(p.numel() for p in theirs.parameters())
    assert zoo.build("smollm3-3b", device="meta").num_parameters() == expected == 3_075_098_624


# -- refusals ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "model_type", "message"),
    [
        ({"position.nope_layers": [1]}, "llama", r"llama cannot express position\.nope_layers=\[1\]"),
        ({"position.scaling": {"type": "yarn", "factor": 2.0, "original_max_positions": 16}}, "phi3",
         r"phi3 cannot express position\.scaling\.type='yarn'"),
        # dynamic's max_positions is written as the original length, and read back times the factor
        ({"position.scaling": {"type": "dynamic", "factor": 2.0, "original_max_positions": 16}}, "llama",
         r"llama cannot express max_positions=128 \(read back as 32\)"),
    ],
)  # fmt: skip
def test_an_export_that_would_drop_an_option_is_refused_naming_it(
    tmp_path, change, model_type, message
) -> None:
    model = zoo.build(zoo.preset("llama-tiny").override(**change))
    with pytest.raises(HFError, match=message):
        zoo.to_hf(model, tmp_path, model_type=model_type)


def test_no_rope_layers_choose_smollm3_on_export(tmp_path) -> None:
    model = zoo.build(
        zoo.preset("llama-tiny").override(**{"position.nope_layers": [0], "lm_head.tied": True})
    )
    zoo.to_hf(model, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert (config["model_type"], config["no_rope_layers"]) == ("smollm3", [0, 1])


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"no_rope_layers": [1]},
            r"no_rope_layers must list 1 \(rotary\) or 0 \(none\) for each of the 2 layers",
        ),
        ({"no_rope_layers": [1, 2]}, r"no_rope_layers must list"),
        ({"no_rope_layers": None, "no_rope_layer_interval": 0}, r"no_rope_layer_interval=0"),
        ({"rope_parameters": {**YARN, "truncate": "no"}}, r"truncate='no': true or false"),
        ({"rope_parameters": {**YARN, "factor": -2.0}}, r"factor=-2\.0: a positive number"),
        (
            {"rope_parameters": {"rope_type": "dynamic", "rope_theta": 1e4}},
            r"rope_type='dynamic' needs 'factor'",
        ),
    ],
)
def test_smollm3_settings_zoo_cannot_run_are_refused_naming_them(tmp_path, changes, message) -> None:
    config = transformers.SmolLM3Config(**SIZES)
    transformers.SmolLM3ForCausalLM(config).save_pretrained(tmp_path)
    written = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(written | changes))
    with pytest.raises(HFError, match=message):
        zoo.from_hf(tmp_path)


def test_invalid_rope_options_are_spec_errors_naming_the_field() -> None:
    tiny = zoo.preset("llama-tiny")
    with pytest.raises(SpecError, match=r"position\.nope_layers \[2\]: each a distinct layer of decoder"):
        tiny.override(**{"position.nope_layers": [2]})
    two_dims = {"attention.head_dim": 8, "position.fraction": 0.25}
    dynamic = {"type": "dynamic", "factor": 2.0, "original_max_positions": 16}
    with pytest.raises(SpecError, match=r"dynamic NTK raises its base to the power R / \(R - 2\), R = 2"):
        tiny.override(**two_dims, **{"position.scaling": dynamic})
