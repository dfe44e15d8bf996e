"""Hugging Face interop for DeepSeek-V3 (``deepseek_v3``): multi-head latent attention and its MoE routing.

Each case is a small random transformers model with every parameter drawn or perturbed (routers and their
``e_score_correction_bias`` included, so the group-limited choice differs token to token) and options away
from their defaults: with and without the q bottleneck, attention biases, interleaved rope or not, several
shared experts, dense first layers, group-limited routing, renormalised top-k or not. Batches are
left-padded, as in `test_hf_moe`.
"""

from __future__ import annotations

import json
import math
from typing import Any

import hf_decoder_parity as parity
import pytest
import torch
from hf_decoder_parity import assert_greedy_generate_matches, export_and_reload, liven

import zoo
from zoo.io.hf import HFError

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

V = 128
SIZES = dict(
    num_hidden_layers=3, hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=4,
    vocab_size=V, max_position_embeddings=64, bos_token_id=1, eos_token_id=2, pad_token_id=0,
    moe_intermediate_size=16, qk_nope_head_dim=12, qk_rope_head_dim=8, v_head_dim=10, kv_lora_rank=20,
)  # fmt: skip
CASES: dict[str, dict[str, Any]] = {
    "q-lora-groups": dict(q_lora_rank=24, n_routed_experts=8, num_experts_per_tok=3, n_group=4, topk_group=2,
                          first_k_dense_replace=1, n_shared_experts=2, routed_scaling_factor=2.5),
    "no-q-lora-bias": dict(q_lora_rank=None, attention_bias=True, n_routed_experts=6, num_experts_per_tok=2,
                           n_group=1, topk_group=1, first_k_dense_replace=0, norm_topk_prob=False,
                           routed_scaling_factor=1.5, tie_word_embeddings=True,
                           rms_norm_eps=1e-5),
    # the release's rotary: YaRN with mscale / mscale_all_dim (the softmax scale grows by mscale²) over a
    # short original context, so the 40-token batch goes past it
    "yarn": dict(q_lora_rank=16, n_routed_experts=4, num_experts_per_tok=2, n_group=2, topk_group=1,
                 first_k_dense_replace=1, routed_scaling_factor=2.5,
                 rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                  "original_max_position_embeddings": 16, "beta_fast": 32.0, "beta_slow": 1.0,
                                  "mscale": 1.0, "mscale_all_dim": 1.0}),
}  # fmt: skip


def hf_model(**options: Any) -> torch.nn.Module:
    config = transformers.DeepseekV3Config(**{**SIZES, **options})
    model = liven(transformers.DeepseekV3ForCausalLM(config))
    with torch.no_grad():  # buffers are not parameters: liven leaves the routing bias at zero
        for name, buffer in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buffer.normal_(0.0, 0.3)
    return model


@pytest.fixture(scope="module", params=list(CASES))
def case(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    hf = hf_model(**CASES[request.param])
    path = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(path, safe_serialization=True)
    return request.param, hf, path, zoo.from_hf(path)


def test_from_hf_logits_match_on_a_left_padded_batch(case) -> None:
    _, hf, _, model = case
    parity.assert_logits_match(model, hf)


def test_import_reads_latent_attention_and_routing_into_the_spec(case) -> None:
    name, _, _, model = case
    dumped = model.spec.model_dump()
    latent, ffn = dumped["attention"]["latent"], dumped["ffn"]
    assert latent == {"q_lora_rank": {"q-lora-groups": 24, "yarn": 16}.get(name), "kv_lora_rank": 20,
                      "rope_head_dim": 8, "v_head_dim": 10, "norm_eps": 1e-6}  # fmt: skip
    assert dumped["attention"]["head_dim"] == 12
    expected = {
        "q-lora-groups": {"num_groups": 4, "top_groups": 2, "shared_d_ff": 32, "dense_layers": [0],
                          "routed_scale": 2.5, "normalize_top_k": True},
        "no-q-lora-bias": {"num_groups": 1, "top_groups": 1, "shared_d_ff": 16, "dense_layers": [],
                           "routed_scale": 1.5, "normalize_top_k": False},
        "yarn": {"num_groups": 2, "top_groups": 1, "dense_layers": [0], "routed_scale": 2.5},
    }[name]  # fmt: skip
    assert {k: ffn[k] for k in expected} == expected
    assert ffn["scoring"] == "sigmoid" and ffn["score_bias"]


def test_greedy_generate_matches_transformers_on_left_padded_prompts(case) -> None:
    _, hf, _, model = case
    assert_greedy_generate_matches(hf, model, [30, 21, 9])


def test_to_hf_loads_in_transformers_with_no_missing_keys_and_same_logits(case, tmp_path) -> None:
    _, hf, path, model = case
    parity.assert_logits_match(model, export_and_reload(model, hf, path, tmp_path))


def test_absorbed_decode_equals_the_plain_path(case) -> None:
    _, _, _, model = case
    ids, mask, _ = parity.left_padded([20, 13])
    with torch.no_grad():
        plain = model(ids, attention_mask=mask).logits
        for layer in model.decoder.layers:
            layer.self_attn.absorb = "always"
        try:
            absorbed = model(ids, attention_mask=mask).logits
        finally:
            for layer in model.decoder.layers:
                layer.self_attn.absorb = "decode"
    real = mask.bool()
    torch.testing.assert_close(absorbed[real], plain[real], atol=1e-4, rtol=1e-4)


# -- refusals ----------------------------------------------------------------------------------------------


def test_yarn_scales_the_softmax_by_mscale_squared(case) -> None:
    name, _, _, model = case
    attention = model.spec.attention
    if name != "yarn":
        assert attention.scale is None
        return
    mscale = 0.1 * math.log(4.0) + 1.0  # mscale(factor 4, mscale_all_dim 1)
    assert attention.scale == pytest.approx((12 + 8) ** -0.5 * mscale**2)
    assert model.spec.position.scaling.type == "yarn"


def test_a_scale_that_disagrees_with_the_yarn_settings_is_refused_on_export(tmp_path) -> None:
    hf = hf_model(**CASES["yarn"])
    hf.save_pretrained(tmp_path / "src", safe_serialization=True)
    spec = zoo.read_hf_spec(tmp_path / "src").override(**{"attention.scale": 0.5})
    with pytest.raises(HFError, match=r"attention\.scale"):
        zoo.to_hf(zoo.build(spec, device="meta", init=False), tmp_path / "out")


def test_rotate_half_rope_rows_are_refused(tmp_path) -> None:
    hf = hf_model(q_lora_rank=None, n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1)
    hf.config.rope_interleave = False
    hf.save_pretrained(tmp_path, safe_serialization=True)
    with pytest.raises(HFError, match=r"rope_interleave=False is not supported"):
        zoo.from_hf(tmp_path)


def test_kv_head_groups_are_refused(tmp_path) -> None:
    hf = hf_model(q_lora_rank=None, n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1)
    hf.config.num_key_value_heads = 2
    hf.save_pretrained(tmp_path, safe_serialization=True)
    with pytest.raises(HFError, match=r"num_key_value_heads=2 with num_attention_heads=4"):
        zoo.from_hf(tmp_path)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"ffn.scoring": "softmax"}, r"deepseek_v3 cannot express ffn\.scoring='softmax'"),
        ({"ffn.score_bias": False}, r"deepseek_v3 cannot express ffn\.score_bias=False"),
        ({"ffn.shared_gate": True}, r"deepseek_v3 cannot express ffn\.shared_gate=True"),
        ({"ffn.shared_d_ff": 24}, r"deepseek_v3 cannot express ffn\.shared_d_ff=24"),
        ({"ffn.dense_layers": [1]}, r"deepseek_v3 cannot express ffn\.dense_layers=\[1\]"),
        (
            {"attention.latent.norm_eps": 1e-5},
            r"deepseek_v3 cannot express attention\.latent\.norm_eps=1e-05",
        ),
        ({"attention.latent": None}, r"deepseek_v3 cannot express attention\.latent=None"),
    ],
)
def test_an_export_that_would_drop_an_option_is_refused(tmp_path, overrides, message) -> None:
    spec = zoo.preset("deepseek-tiny").override(**overrides)
    with pytest.raises(HFError, match=message):
        zoo.to_hf(zoo.build(spec), tmp_path, model_type="deepseek_v3")


@pytest.mark.slow
def test_the_deepseek_v3_preset_counts_what_transformers_builds() -> None:
    """transformers' DeepseekV3Config defaults are deepseek-ai/DeepSeek-V3's config.json (YaRN aside, which
    changes no count); ~20 s to build on meta."""
    with torch.device("meta"):
        hf = transformers.DeepseekV3ForCausalLM(transformers.DeepseekV3Config())
    theirs = sum(p.numel() for p in hf.parameters())
    assert zoo.build("deepseek-v3", device="meta").num_parameters() == theirs == 671_026_404_352


def test_the_preset_exports_the_published_config_fields(tmp_path) -> None:
    """The preset's config.json as deepseek_v3 (read back whole by the export guard) has the release's fields."""
    from zoo.io.hf.deepseek import MAPPING

    config = MAPPING.spec_to_config(zoo.preset("deepseek-v3"))
    published = transformers.DeepseekV3Config().to_dict()
    keys = ["hidden_size", "intermediate_size", "moe_intermediate_size", "num_hidden_layers", "num_attention_heads",
            "q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim", "n_routed_experts",
            "n_shared_experts", "num_experts_per_tok", "n_group", "topk_group", "first_k_dense_replace",
            "routed_scaling_factor", "norm_topk_prob", "vocab_size", "rms_norm_eps"]  # fmt: skip
    assert {k: config[k] for k in keys} == {k: published[k] for k in keys}
    # the release's YaRN (transformers' config class defaults leave it out)
    assert config["max_position_embeddings"] == 163840
    assert config["rope_parameters"] == {"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096,
                                         "mscale": 1.0, "mscale_all_dim": 1.0, "rope_theta": 10000.0}  # fmt: skip


# -- GLM-4 MoE: Llama-style attention over DeepSeek-V3's routed experts -------------------------------------

GLM_SIZES = dict(
    num_hidden_layers=3, hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
    vocab_size=V, max_position_embeddings=64, bos_token_id=1, eos_token_id=2, pad_token_id=0,
    moe_intermediate_size=16, head_dim=24, n_routed_experts=8, num_experts_per_tok=2,
)  # fmt: skip
GLM_CASES: dict[str, dict[str, Any]] = {
    "glm-groups-qk-norm": dict(n_group=4, topk_group=2, first_k_dense_replace=1, use_qk_norm=True,
                               attention_bias=True, routed_scaling_factor=2.5, rms_norm_eps=0.25),
    "glm-plain": dict(first_k_dense_replace=0, norm_topk_prob=False, n_shared_experts=2,
                      tie_word_embeddings=True),
}  # fmt: skip
# GLM's partial_rotary_factor (0.5) is its config class's default; a large eps shows a q/k norm's eps


@pytest.fixture(scope="module", params=list(GLM_CASES))
def glm(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    config = transformers.Glm4MoeConfig(**{**GLM_SIZES, **GLM_CASES[request.param]})
    hf = liven(transformers.Glm4MoeForCausalLM(config))
    with torch.no_grad():
        for name, buffer in hf.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buffer.normal_(0.0, 0.3)
    path = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(path, safe_serialization=True)
    return hf, path, zoo.from_hf(path)


def test_glm4_moe_logits_greedy_tokens_and_export_match(glm, tmp_path) -> None:
    hf, path, model = glm
    assert model.spec.position.fraction == 0.5 and model.spec.attention.out_bias is False
    parity.assert_logits_match(model, hf)
    assert_greedy_generate_matches(hf, model, [30, 21, 9])
    parity.assert_logits_match(model, export_and_reload(model, hf, path, tmp_path))


# -- DeepSeek-V2: the same latent attention, softmax routing (greedy or by each group's best score) --------

V2_CASES: dict[str, dict[str, Any]] = {
    # DeepSeek-V2's own routing: 8 groups of 2, a token's experts within its 3 groups whose best is highest
    "v2-groups-q-lora": dict(q_lora_rank=24, n_routed_experts=16, num_experts_per_tok=4, n_group=8, topk_group=3,
                             topk_method="group_limited_greedy", first_k_dense_replace=1, n_shared_experts=2,
                             routed_scaling_factor=16.0),
    # DeepSeek-V2-Lite's: no q bottleneck, greedy top-k (its n_group / topk_group unused), one shared expert
    "v2-lite-greedy": dict(q_lora_rank=None, attention_bias=True, n_routed_experts=6, num_experts_per_tok=2,
                           n_group=1, topk_group=1, topk_method="greedy", first_k_dense_replace=0,
                           n_shared_experts=1, routed_scaling_factor=1.5, tie_word_embeddings=True,
                           rms_norm_eps=1e-5),
    # the release's YaRN (mscale = mscale_all_dim = 0.707) over a short original context; groups of one
    "v2-yarn-singletons": dict(q_lora_rank=16, n_routed_experts=4, num_experts_per_tok=2, n_group=4,
                               topk_group=2, topk_method="group_limited_greedy", first_k_dense_replace=2,
                               rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                                "original_max_position_embeddings": 16, "beta_fast": 32.0,
                                                "beta_slow": 1.0, "mscale": 0.707, "mscale_all_dim": 0.707}),
}  # fmt: skip


def v2_model(**options: Any) -> torch.nn.Module:
    config = transformers.DeepseekV2Config(**{**SIZES, **options})
    return liven(transformers.DeepseekV2ForCausalLM(config))


@pytest.fixture(scope="module", params=list(V2_CASES))
def v2(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    hf = v2_model(**V2_CASES[request.param])
    path = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(path, safe_serialization=True)
    return request.param, hf, path, zoo.from_hf(path)


def test_deepseek_v2_reads_softmax_routing_into_the_spec(v2) -> None:
    name, _, _, model = v2
    ffn = model.spec.ffn.model_dump()
    expected = {
        "v2-groups-q-lora": {"num_groups": 8, "top_groups": 3, "group_score": "max", "shared_d_ff": 32,
                             "dense_layers": [0], "routed_scale": 16.0},
        "v2-lite-greedy": {"num_groups": 1, "top_groups": None, "shared_d_ff": 16, "dense_layers": [],
                           "routed_scale": 1.5},
        "v2-yarn-singletons": {"num_groups": 4, "top_groups": 2, "group_score": "max", "dense_layers": [0, 1]},
    }[name]  # fmt: skip
    assert {k: ffn[k] for k in expected} == expected
    assert ffn["scoring"] == "softmax" and not ffn["score_bias"] and not ffn["normalize_top_k"]
    q_lora = {"v2-groups-q-lora": 24, "v2-yarn-singletons": 16}.get(name)
    assert model.spec.attention.latent.q_lora_rank == q_lora


def test_deepseek_v2_logits_greedy_tokens_and_export_match(v2, tmp_path) -> None:
    _, hf, path, model = v2
    parity.assert_logits_match(model, hf)
    assert_greedy_generate_matches(hf, model, [30, 21, 9])
    parity.assert_logits_match(model, export_and_reload(model, hf, path, tmp_path))


def test_deepseek_v2_group_score_is_the_groups_best_not_its_two_best_summed(v2) -> None:
    """The same checkpoint routed by V3's group score (two best summed) gives other logits: the option is read."""
    name, _, _, model = v2
    if name != "v2-groups-q-lora":
        pytest.skip("the case with groups of two")
    other = zoo.build(model.spec.override(**{"ffn.group_score": "top2_sum"}), init=False)
    other.load_state_dict(model.state_dict())
    ids, mask, _ = parity.left_padded([30, 21, 9])
    with torch.no_grad():
        ours, theirs = model(ids, attention_mask=mask).logits, other(ids, attention_mask=mask).logits
    assert not torch.allclose(ours, theirs, atol=1e-3)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"ffn.scoring": "sigmoid"}, r"deepseek_v2 cannot express ffn\.scoring='sigmoid'"),
        ({"ffn.score_bias": True}, r"deepseek_v2 cannot express ffn\.score_bias=True"),
        ({"ffn.group_score": "top2_sum"}, r"deepseek_v2 cannot express ffn\.group_score='top2_sum'"),
        ({"ffn.normalize_top_k": True}, r"deepseek_v2 cannot express ffn\.normalize_top_k=True"),
        ({"ffn.shared_gate": True}, r"deepseek_v2 cannot express ffn\.shared_gate=True"),
        ({"attention.latent": None}, r"deepseek_v2 cannot express attention\.latent=None"),
    ],
)
def test_a_deepseek_v2_export_that_would_drop_an_option_is_refused(tmp_path, overrides, message) -> None:
    hf = v2_model(**V2_CASES["v2-groups-q-lora"])
    hf.save_pretrained(tmp_path / "src", safe_serialization=True)
    spec = zoo.read_hf_spec(tmp_path / "src").override(**overrides)
    with pytest.raises(HFError, match=message):
        zoo.to_hf(zoo.build(spec, device="meta", init=False), tmp_path / "out", model_type="deepseek_v2")


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("topk_method", "noaux_tc", r"topk_method='noaux_tc' is not supported"),
        ("norm_topk_prob", True, r"norm_topk_prob=True is not supported"),
        ("moe_layer_freq", 2, r"moe_layer_freq=2 is not supported"),
        ("mlp_bias", True, r"mlp_bias=True is not supported"),
        ("num_key_value_heads", 2, r"num_key_value_heads=2 with num_attention_heads=4"),
    ],
)
def test_deepseek_v2_configs_zoo_cannot_run_as_transformers_does_are_refused(tmp_path, field, value, message):
    hf = v2_model(**V2_CASES["v2-lite-greedy"])
    hf.save_pretrained(tmp_path, safe_serialization=True)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, field: value}))
    with pytest.raises(HFError, match=message):
        zoo.from_hf(tmp_path)


# deepseek-ai/DeepSeek-V2-Lite's config.json (the fields transformers reads; auto_map, aux_loss_alpha, seq_aux,
# ep_size and torch_dtype left out)
V2_LITE = {
    "architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2", "attention_bias": False,
    "attention_dropout": 0.0, "bos_token_id": 100000, "eos_token_id": 100001, "first_k_dense_replace": 1,
    "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 10944,
    "kv_lora_rank": 512, "max_position_embeddings": 163840, "moe_intermediate_size": 1408, "moe_layer_freq": 1,
    "n_group": 1, "n_routed_experts": 64, "n_shared_experts": 2, "norm_topk_prob": False, "num_attention_heads": 16,
    "num_experts_per_tok": 6, "num_hidden_layers": 27, "num_key_value_heads": 16, "q_lora_rank": None,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 0.707, "mscale_all_dim": 0.707,
                     "original_max_position_embeddings": 4096, "type": "yarn"},
    "rope_theta": 10000, "routed_scaling_factor": 1.0, "scoring_func": "softmax", "tie_word_embeddings": False,
    "topk_group": 1, "topk_method": "greedy", "v_head_dim": 128, "vocab_size": 102400,
}  # fmt: skip


def test_the_deepseek_v2_lite_preset_is_the_published_config_and_counts_what_transformers_builds() -> None:
    from zoo.io.hf.deepseek import V2_MAPPING

    read = V2_MAPPING.config_to_spec(V2_LITE, {"lm_head.weight"})
    preset = zoo.preset("deepseek-v2-lite")
    assert read.model_dump(exclude={"source"}) == preset.model_dump(exclude={"source"})
    config = transformers.DeepseekV2Config(**{k: v for k, v in V2_LITE.items() if k != "architectures"})
    with torch.device("meta"):
        hf = transformers.DeepseekV2ForCausalLM(config)
    theirs = sum(p.numel() for p in hf.parameters())
    assert zoo.build(preset, device="meta").num_parameters() == theirs == 15_706_484_224


# zai-org/GLM-4.5-Air's config.json
GLM_45_AIR = dict(
    architectures=["Glm4MoeForCausalLM"], attention_bias=True, attention_dropout=0.0, pad_token_id=151329,
    eos_token_id=[151329, 151336, 151338], head_dim=128, hidden_act="silu", hidden_size=4096, partial_rotary_factor=0.5,
    initializer_range=0.02, intermediate_size=10944, max_position_embeddings=131072, model_type="glm4_moe",
    moe_intermediate_size=1408, norm_topk_prob=True, num_attention_heads=96, n_group=1, topk_group=1,
    n_routed_experts=128, n_shared_experts=1, routed_scaling_factor=1.0, num_experts_per_tok=8, first_k_dense_replace=1,
    num_hidden_layers=46, num_key_value_heads=8, rms_norm_eps=1e-05, rope_scaling=None, rope_theta=1000000,
    num_nextn_predict_layers=1, tie_word_embeddings=False, use_cache=True, use_qk_norm=False, vocab_size=151552,
)  # fmt: skip


@pytest.mark.slow  # ~11 s: transformers builds the 106B model on meta
def test_the_glm_45_air_preset_is_the_published_config_and_counts_what_transformers_builds(tmp_path) -> None:
    from zoo.io.hf.deepseek import GLM4_MOE

    (tmp_path / "config.json").write_text(json.dumps(GLM_45_AIR))
    with torch.device("meta"):
        hf = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.from_pretrained(tmp_path))
    imported = GLM4_MOE.config_to_spec(dict(GLM_45_AIR), set(hf.state_dict()))
    assert imported.model_dump(exclude={"source"}) == zoo.preset("glm-4.5-air").model_dump(exclude={"source"})
    assert zoo.parameter_count("glm-4.5-air") == sum(p.numel() for p in hf.parameters()) == 106_852_245_504
