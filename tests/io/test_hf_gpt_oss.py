"""Hugging Face interop for OpenAI's gpt-oss (``gpt_oss``): attention sinks, alternating sliding/full layers,
the biased router and experts with the clamped SwiGLU, and MXFP4 expert weights read by dequantising.

Each case is a small random transformers model with every parameter drawn or perturbed (the sinks large
enough to matter), options away from their defaults (the SwiGLU's alpha and limit, q/k/v/o biases off, a
head width that is not d_model / heads, all-full layers, tied embeddings); batches are left-padded as in
`test_hf_llama_family`. The rotary is plain (``rope_type: default``) or the published kind, YaRN.
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
from zoo.io.hf.mxfp4 import dequantize_mxfp4

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

V = 128
SIZES = dict(
    num_hidden_layers=3, hidden_size=64, intermediate_size=40, num_attention_heads=4, num_key_value_heads=2,
    vocab_size=V, max_position_embeddings=64, bos_token_id=1, eos_token_id=2, pad_token_id=0,
    num_local_experts=5, num_experts_per_tok=2, sliding_window=8,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
)  # fmt: skip
CASES: dict[str, dict[str, Any]] = {
    "gpt_oss": dict(head_dim=24, swiglu_limit=1.5, swiglu_alpha=1.2),
    "gpt_oss-full-tied": dict(layer_types=["full_attention"] * 3, attention_bias=False, tie_word_embeddings=True,
                              num_experts_per_tok=3, rms_norm_eps=0.25),
    # the published rotary's kind: YaRN over a short original context, so the 40-token batch goes past it
    "gpt_oss-yarn": dict(rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 4.0,
                                          "original_max_position_embeddings": 16, "beta_fast": 32.0,
                                          "beta_slow": 1.0, "truncate": False}),
}  # fmt: skip


def hf_model(**options: Any) -> torch.nn.Module:
    config = transformers.GptOssConfig(**{**SIZES, **options})
    model = parity.liven(transformers.GptOssForCausalLM(config))
    with torch.no_grad():
        for layer in model.model.layers:  # sinks that decide the weights: the comparison must see them
            layer.self_attn.sinks.normal_(0.0, 2.0)
    return model


def assert_logits_match(model: zoo.ZooModel, hf: torch.nn.Module) -> None:
    ours, theirs = parity.assert_logits_match(model, hf, output_router_logits=True)
    torch.testing.assert_close(ours.aux_loss, theirs.aux_loss, atol=1e-5, rtol=1e-5)


@pytest.fixture(scope="module", params=list(CASES))
def case(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    hf = hf_model(**CASES[request.param])
    path = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(path, safe_serialization=True)
    return request.param, hf, path, zoo.from_hf(path)


def test_from_hf_logits_and_aux_loss_match_on_a_left_padded_batch(case) -> None:
    _, hf, _, model = case
    assert_logits_match(model, hf)


def test_import_reads_sinks_windows_and_the_moe_options(case) -> None:
    name, _, _, model = case
    spec = model.spec.model_dump()
    assert spec["attention"]["sinks"] is True
    ffn = spec["ffn"]
    assert ffn["router_bias"] and ffn["expert_bias"] and ffn["normalize_top_k"]
    if name == "gpt_oss":
        assert ffn["clamped_glu"] == {"alpha": 1.2, "limit": 1.5}
        assert [p["kind"] for p in spec["decoder"]["layer_patterns"]] == [
            "sliding_window",
            "causal",
            "sliding_window",
        ]
    elif name == "gpt_oss-full-tied":
        assert spec["decoder"]["layer_patterns"] is None and spec["decoder"]["pattern"] is None
    else:
        assert spec["position"]["scaling"]["type"] == "yarn" and spec["position"]["scaling"]["factor"] == 4.0


def test_the_sinks_change_the_logits(case) -> None:
    """Without its sinks zoo's model no longer matches: the parity above sees them."""
    _, hf, _, model = case
    with torch.no_grad():
        saved = [layer.self_attn.sinks.clone() for layer in model.decoder.layers]
        for layer in model.decoder.layers:
            layer.self_attn.sinks.fill_(-1e4)
        try:
            with pytest.raises(AssertionError):
                assert_logits_match(model, hf)
        finally:
            for layer, sinks in zip(model.decoder.layers, saved):
                layer.self_attn.sinks.copy_(sinks)


def test_greedy_generate_matches_transformers_on_left_padded_prompts(case) -> None:
    _, hf, _, model = case
    assert_greedy_generate_matches(hf, model, [30, 21, 9])


def test_to_hf_loads_in_transformers_with_no_missing_keys_and_same_logits(case, tmp_path) -> None:
    _, hf, path, model = case
    assert_logits_match(model, export_and_reload(model, hf, path, tmp_path))


def test_the_exported_expert_tensors_equal_the_imported_ones(case, tmp_path) -> None:
    """De-interleaving gate/up columns and transposing is undone exactly on export."""
    _, hf, _, model = case
    zoo.to_hf(model, tmp_path)
    from safetensors.torch import load_file

    written = load_file(tmp_path / "model.safetensors")
    for name, tensor in hf.state_dict().items():
        if ".experts." in name:
            assert torch.equal(written[name], tensor), name


# -- MXFP4 -------------------------------------------------------------------------------------------------


def test_mxfp4_dequantisation_equals_transformers() -> None:
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    g = torch.Generator().manual_seed(0)
    blocks = torch.randint(0, 256, (3, 10, 4, 16), dtype=torch.uint8, generator=g)
    scales = torch.randint(100, 140, (3, 10, 4), dtype=torch.uint8, generator=g)
    for dtype in (torch.float32, torch.bfloat16):
        ours = dequantize_mxfp4(blocks, scales, dtype=dtype)  # (E, R, G * 32)
        theirs = convert_moe_packed_tensors(blocks, scales, dtype=dtype)  # transposed: (E, G * 32, R)
        assert torch.equal(ours.transpose(1, 2), theirs)


def _quantize(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(E, I, O) HF weight -> MXFP4 blocks (E, O, I/32, 16) and scales (E, O, I/32), round-to-nearest."""
    from zoo.io.hf.mxfp4 import E2M1

    rows = weight.transpose(1, 2).float()  # (E, O, I)
    blocks = rows.reshape(*rows.shape[:-1], -1, 32)  # (E, O, G, 32)
    exponent = torch.floor(torch.log2(blocks.abs().amax(-1).clamp(min=1e-30))) - 2  # max code 6 = 1.5 * 4
    scaled = blocks / torch.exp2(exponent).unsqueeze(-1)
    table = torch.tensor(E2M1)
    codes = (scaled.unsqueeze(-1) - table).abs().argmin(-1).to(torch.uint8)  # (E, O, G, 32)
    packed = codes[..., 0::2] | (codes[..., 1::2] << 4)  # (E, O, G, 16)
    return packed, (exponent + 127).to(torch.uint8)


def test_an_mxfp4_checkpoint_imports_as_transformers_dequantises_it(tmp_path) -> None:
    """A tiny checkpoint written as the published ones are (expert weights as _blocks/_scales, a
    quantization_config): zoo's logits equal transformers' model holding the weights transformers' own
    dequantisation gives."""
    from safetensors.torch import load_file, save_file
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    hf = hf_model(hidden_size=64, intermediate_size=64, head_dim=16)
    hf.save_pretrained(tmp_path / "plain")
    tensors = load_file(tmp_path / "plain" / "model.safetensors")
    state = hf.state_dict()
    for name in [n for n in tensors if n.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
        blocks, scales = _quantize(tensors.pop(name))
        tensors[f"{name}_blocks"], tensors[f"{name}_scales"] = blocks, scales
        state[name] = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)  # transformers' reading
    (tmp_path / "mx").mkdir()
    save_file(tensors, tmp_path / "mx" / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((tmp_path / "plain" / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": ["router", "lm_head"]}
    (tmp_path / "mx" / "config.json").write_text(json.dumps(config))
    hf.load_state_dict(state)
    model = zoo.from_hf(tmp_path / "mx")
    assert_logits_match(model, hf)


def test_another_quantization_method_is_refused_by_name(tmp_path) -> None:
    hf_model().save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "bitsandbytes"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(HFError, match=r"quantization_config\.quant_method='bitsandbytes' is not supported"):
        zoo.from_hf(tmp_path)


# -- refusals ----------------------------------------------------------------------------------------------


def test_the_published_config_without_rope_parameters_reads_as_yarn(tmp_path) -> None:
    hf_model().save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    del config["rope_parameters"]  # GptOssConfig's default: YaRN, factor 32 over 4096, theta 150000
    (tmp_path / "config.json").write_text(json.dumps(config))
    scaling = zoo.read_hf_spec(tmp_path).position.scaling
    assert scaling is not None and scaling.type == "yarn" and scaling.factor == 32.0
    assert scaling.original_max_positions == 4096 and scaling.truncate is False


def _oss_spec(tmp_path) -> Any:
    hf_model(**CASES["gpt_oss"]).save_pretrained(tmp_path / "src")
    return zoo.read_hf_spec(tmp_path / "src")


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"attention.sinks": False}, r"gpt_oss cannot express attention\.sinks=False"),
        ({"ffn.router_bias": False}, r"gpt_oss cannot express ffn\.router_bias=False"),
        ({"ffn.expert_bias": False}, r"gpt_oss cannot express ffn\.expert_bias=False"),
        ({"ffn.clamped_glu": None}, r"gpt_oss cannot express ffn\.clamped_glu=None"),
        ({"ffn.normalize_top_k": False}, r"gpt_oss cannot express ffn\.normalize_top_k=False"),
        ({"ffn.shared_d_ff": 16}, r"gpt_oss cannot express ffn\.shared_d_ff=16"),
        ({"attention.qk_norm": True}, r"gpt_oss cannot express attention\.qk_norm=True"),
    ],
)
def test_an_export_that_would_drop_an_option_is_refused(tmp_path, override, message) -> None:
    spec = _oss_spec(tmp_path).override(**override)
    with pytest.raises(HFError, match=message):
        zoo.to_hf(zoo.build(spec), tmp_path / "out", model_type="gpt_oss")


@pytest.mark.parametrize("model_type", ["mixtral", "qwen3_moe"])
def test_other_moe_families_refuse_the_gpt_oss_options(tmp_path, model_type) -> None:
    spec = _oss_spec(tmp_path)
    with pytest.raises(HFError, match=rf"{model_type} cannot express"):
        zoo.to_hf(zoo.build(spec), tmp_path / "out", model_type=model_type)


def test_export_without_a_model_type_picks_gpt_oss_for_a_gpt_oss_spec(tmp_path) -> None:
    zoo.to_hf(zoo.build(_oss_spec(tmp_path)), tmp_path / "out")
    assert json.loads((tmp_path / "out" / "config.json").read_text())["model_type"] == "gpt_oss"
