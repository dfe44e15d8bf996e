"""Hugging Face interop for the Mixture-of-Experts decoders: ``mixtral``, ``qwen2_moe``, ``qwen3_moe``.

Each case is a small random transformers model with every parameter drawn or perturbed (routers included, so
routing differs token to token) and every MoE option away from its default: top-k renormalised or not,
Qwen2-MoE's gated shared expert, dense layers by ``decoder_sparse_step`` and ``mlp_only_layers``, sliding
windows, q/k/v biases, a GELU activation, tied embeddings, Mixtral's router jitter (training only: read and
written back). Batches are left-padded, as in `test_hf_llama_family`; the load-balancing loss is
compared with transformers' ``aux_loss`` on the same batch.
"""

from __future__ import annotations

import json
from typing import Any

import hf_decoder_parity as parity
import pytest
import torch
from hf_decoder_parity import assert_greedy_generate_matches, export_and_reload, liven

import zoo
from zoo.io.hf import HFError
from zoo.spec import parse_spec

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

V = 128
SIZES = dict(
    num_hidden_layers=3, hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
    vocab_size=V, max_position_embeddings=64, bos_token_id=1, eos_token_id=2, pad_token_id=0,
)  # fmt: skip
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "mixtral": ("Mixtral", dict(num_local_experts=4, num_experts_per_tok=2, intermediate_size=40,
                                sliding_window=8, head_dim=24, router_jitter_noise=0.1, rms_norm_eps=1e-5)),
    "qwen2_moe": ("Qwen2Moe", dict(num_experts=5, num_experts_per_tok=3, moe_intermediate_size=24,
                                   shared_expert_intermediate_size=40, norm_topk_prob=True, mlp_only_layers=[1],
                                   use_sliding_window=True, sliding_window=8,
                                   layer_types=["full_attention", "sliding_attention", "full_attention"])),
    "qwen2_moe-sparse-step": ("Qwen2Moe", dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24,
                                               shared_expert_intermediate_size=32, decoder_sparse_step=2,
                                               qkv_bias=False, hidden_act="gelu")),
    "qwen3_moe": ("Qwen3Moe", dict(num_experts=6, num_experts_per_tok=2, moe_intermediate_size=24,
                                   decoder_sparse_step=2, mlp_only_layers=[2], head_dim=24, attention_bias=True,
                                   rms_norm_eps=0.25, use_sliding_window=True, sliding_window=8,
                                   tie_word_embeddings=True)),
}  # fmt: skip
# Qwen3-MoE's eps is large so that a q/k norm with another eps shows in the logits.


def hf_model(prefix: str, **options: Any) -> torch.nn.Module:
    config = getattr(transformers, f"{prefix}Config")(**{**SIZES, **options})
    return liven(getattr(transformers, f"{prefix}ForCausalLM")(config))


def assert_logits_match(model: zoo.ZooModel, hf: torch.nn.Module) -> None:
    ours, theirs = parity.assert_logits_match(model, hf, output_router_logits=True)
    torch.testing.assert_close(ours.aux_loss, theirs.aux_loss, atol=1e-5, rtol=1e-5)


@pytest.fixture(scope="module", params=list(CASES))
def case(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    prefix, options = CASES[request.param]
    hf = hf_model(prefix, **options)
    path = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(path, safe_serialization=True)
    return request.param, hf, path, zoo.from_hf(path)


def test_from_hf_logits_and_aux_loss_match_on_a_left_padded_batch(case) -> None:
    _, hf, _, model = case
    assert_logits_match(model, hf)


IMPORTED = {
    "mixtral": {"kind": "moe", "num_experts": 4, "top_k": 2, "d_ff": 40, "normalize_top_k": True,
                "jitter": 0.1, "shared_d_ff": None, "sparse_step": 1, "dense_layers": [], "dense_d_ff": None},
    "qwen2_moe": {"num_experts": 5, "top_k": 3, "d_ff": 24, "normalize_top_k": True, "shared_d_ff": 40,
                  "shared_gate": True, "dense_layers": [1], "dense_d_ff": 96},
    "qwen2_moe-sparse-step": {"sparse_step": 2, "dense_layers": [], "dense_d_ff": 96, "normalize_top_k": False,
                              "activation": "gelu"},
    "qwen3_moe": {"num_experts": 6, "d_ff": 24, "sparse_step": 2, "dense_layers": [2], "dense_d_ff": 96,
                  "shared_d_ff": None, "normalize_top_k": False},
}  # fmt: skip


def test_import_reads_every_moe_option_into_the_ffn_spec(case) -> None:
    name, _, _, model = case
    ffn = model.spec.model_dump()["ffn"]
    assert {k: ffn[k] for k in IMPORTED[name]} == IMPORTED[name]
    sparse = [layer.ffn.__class__.__name__ for layer in model.decoder.layers]
    expected = {"mixtral": ["MoEFeedForward"] * 3, "qwen2_moe": ["MoEFeedForward", "FeedForward", "MoEFeedForward"],
                "qwen2_moe-sparse-step": ["FeedForward", "MoEFeedForward", "FeedForward"],
                "qwen3_moe": ["FeedForward", "MoEFeedForward", "FeedForward"]}[name]  # fmt: skip
    assert sparse == expected


def test_greedy_generate_matches_transformers_on_left_padded_prompts(case) -> None:
    _, hf, _, model = case
    assert_greedy_generate_matches(hf, model, [30, 21, 9])


def test_to_hf_loads_in_transformers_with_no_missing_keys_and_same_logits(case, tmp_path) -> None:
    _, hf, path, model = case
    assert_logits_match(model, export_and_reload(model, hf, path, tmp_path))


# -- refusals ----------------------------------------------------------------------------------------------


def _moe_spec(**ffn: Any) -> Any:
    base = zoo.preset("moe-tiny").model_dump()
    return parse_spec({**base, "ffn": {**base["ffn"], **ffn}})


@pytest.mark.parametrize(
    ("ffn", "model_type", "message"),
    [
        ({"normalize_top_k": False}, "mixtral", r"mixtral cannot express ffn\.normalize_top_k=False"),
        ({"shared_d_ff": 16}, "mixtral", r"mixtral cannot express ffn\.shared_d_ff=16"),
        ({"sparse_step": 2, "dense_d_ff": 32}, "mixtral", r"mixtral cannot express ffn\.sparse_step=2"),
        ({}, "qwen2_moe", r"qwen2_moe cannot express ffn\.shared_d_ff=None: .* always has a shared expert"),
        (
            {"shared_d_ff": 16, "shared_gate": False},
            "qwen2_moe",
            r"qwen2_moe cannot express ffn\.shared_gate=False",
        ),
        ({"shared_d_ff": 16}, "qwen3_moe", r"qwen3_moe cannot express ffn\.shared_d_ff=16"),
        ({}, "llama", r"llama cannot express ffn\.kind='moe'"),
    ],
)
def test_an_export_that_would_drop_an_moe_option_is_refused(tmp_path, ffn, model_type, message) -> None:
    spec = _moe_spec(**ffn)
    if model_type == "qwen3_moe":  # everything else as Qwen3-MoE needs it: the FFN option is the only miss
        spec = spec.override(**{"attention.qk_norm": True, "attention.qk_norm_eps": spec.norm.eps})
    if model_type == "qwen2_moe":
        spec = spec.override(**{"attention.bias": True, "attention.out_bias": False})
    model = zoo.build(spec)
    with pytest.raises(HFError, match=message):
        zoo.to_hf(model, tmp_path, model_type=model_type)


def test_router_jitter_is_training_noise_that_a_family_without_the_field_drops(tmp_path) -> None:
    # the export guard's IGNORED: jitter changes no logits, so qwen3_moe (no router_jitter_noise) writes the
    # router as it is, and mixtral keeps the rate
    spec = _moe_spec(jitter=0.1).override(**{"attention.qk_norm": True, "attention.qk_norm_eps": 1e-5})
    zoo.to_hf(zoo.build(spec), tmp_path / "qwen3_moe", model_type="qwen3_moe")
    assert zoo.from_hf(tmp_path / "qwen3_moe").spec.stacks()["decoder"].ffn.jitter == 0.0
    zoo.to_hf(zoo.build(_moe_spec(jitter=0.1)), tmp_path / "mixtral", model_type="mixtral")
    assert json.loads((tmp_path / "mixtral" / "config.json").read_text())["router_jitter_noise"] == 0.1


def test_a_dense_spec_is_refused_by_the_moe_families(tmp_path) -> None:
    with pytest.raises(HFError, match=r"qwen3_moe cannot express ffn\.kind='dense'"):
        zoo.to_hf(zoo.build("llama-tiny"), tmp_path, model_type="qwen3_moe")


def test_export_without_a_model_type_picks_the_family_that_keeps_every_option(tmp_path) -> None:
    for ffn, expected in [
        ({}, "mixtral"),
        ({"normalize_top_k": False}, "qwen3_moe"),
        ({"shared_d_ff": 16}, "qwen2_moe"),
    ]:
        spec = _moe_spec(**ffn)
        if expected == "qwen2_moe":  # Qwen2-MoE's q/k/v biases and bias-free output
            spec = spec.override(**{"attention.bias": True, "attention.out_bias": False})
        if expected == "qwen3_moe":
            spec = spec.override(**{"attention.qk_norm": True, "attention.qk_norm_eps": spec.norm.eps})
        out = tmp_path / expected
        zoo.to_hf(zoo.build(spec), out)
        assert json.loads((out / "config.json").read_text())["model_type"] == expected


# -- the published shapes ----------------------------------------------------------------------------------

# config.json of each published checkpoint (the fields that shape the model), as on its model card.
PUBLISHED = {
    "mixtral-8x7b": dict(
        model_type="mixtral", architectures=["MixtralForCausalLM"], vocab_size=32000, hidden_size=4096,
        intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
        max_position_embeddings=32768, rms_norm_eps=1e-5, rope_theta=1e6, sliding_window=None,
        num_local_experts=8, num_experts_per_tok=2, router_aux_loss_coef=0.02, tie_word_embeddings=False,
        bos_token_id=1, eos_token_id=2,
    ),
    "qwen3-30b-a3b": dict(
        model_type="qwen3_moe", architectures=["Qwen3MoeForCausalLM"], vocab_size=151936, hidden_size=2048,
        intermediate_size=6144, num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4,
        head_dim=128, max_position_embeddings=40960, rms_norm_eps=1e-6, rope_theta=1000000.0,
        rope_scaling=None, attention_bias=False, use_sliding_window=False, sliding_window=None,
        max_window_layers=48, decoder_sparse_step=1, mlp_only_layers=[], moe_intermediate_size=768,
        num_experts=128, num_experts_per_tok=8, norm_topk_prob=True, tie_word_embeddings=False,
        bos_token_id=151643, eos_token_id=151645,
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_preset_is_the_spec_its_published_config_imports_as(name) -> None:
    from zoo.io.hf import family_mappings

    config = PUBLISHED[name]
    mapping = next(m for m in family_mappings() if config["model_type"] in m.model_types)
    imported = mapping.config_to_spec(config, set())
    preset = zoo.preset(name)
    assert preset.override(name=None, source=None, init=imported.init) == imported
    exported = mapping.spec_to_config(preset)
    # not written back: the training coefficient (a TrainConfig field in zoo), a switched-off window's
    # size, and an intermediate_size no dense layer reads (all 48 layers are sparse)
    unread = {"rope_scaling", "router_aux_loss_coef", "max_window_layers", "intermediate_size"}
    keys = [k for k in config if k in exported and k not in unread]
    assert {k: exported[k] for k in keys} == {k: config[k] for k in keys}


def test_qwen2_moe_without_layer_types_slides_on_its_even_layers_below_max_window_layers(tmp_path) -> None:
    """Qwen2MoeConfig's own rule (not Qwen2's "from max_window_layers on") for configs that predate layer_types."""
    options = dict(
        CASES["qwen2_moe-sparse-step"][1], use_sliding_window=True, sliding_window=8, max_window_layers=2
    )
    hf = hf_model("Qwen2Moe", **options)
    assert hf.config.layer_types == ["sliding_attention", "full_attention", "full_attention"]
    hf.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    del config["layer_types"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    model = zoo.from_hf(tmp_path)
    assert [p.kind for p in model.spec.decoder.layer_patterns] == ["sliding_window", "causal", "causal"]
    assert_logits_match(model, hf)
