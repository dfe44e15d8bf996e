"""Hugging Face interop for the decoder families (GPT-2, Llama): parity with transformers both ways.

Reference models are built from small configs with random weights (no downloads). Every parameter is
perturbed before saving, so biases and norm weights are not their zero/one defaults and a mapping that
swaps or drops one shows up in the logits.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from support import padded_batch

import zoo

transformers = pytest.importorskip("transformers")

VOCAB = 256
LENGTHS = [7, 4, 2]  # a right-padded batch
GPT2 = dict(n_layer=2, n_embd=64, n_head=4, vocab_size=VOCAB, n_positions=64, bos_token_id=1, eos_token_id=2)
LLAMA = dict(
    num_hidden_layers=2, hidden_size=64, intermediate_size=96, num_attention_heads=4,
    vocab_size=VOCAB, max_position_embeddings=64, bos_token_id=1, eos_token_id=2,
)  # fmt: skip


def randomized(model: torch.nn.Module) -> torch.nn.Module:
    """Perturb every parameter (biases off zero, norm weights off one) and switch to eval mode."""
    torch.manual_seed(1)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.05)
    return model.eval()


def save_hf(model: torch.nn.Module, path: Path) -> Path:
    model.save_pretrained(path, safe_serialization=True)
    return path


def assert_same_at_real_positions(ours: torch.Tensor, theirs: torch.Tensor, mask: torch.Tensor) -> None:
    real = mask.bool()
    assert ours.shape == theirs.shape
    assert theirs[real].abs().max() > 1e-2  # a real signal, not two zero tensors
    torch.testing.assert_close(ours[real], theirs[real], atol=1e-4, rtol=1e-4)


@torch.no_grad()
def assert_logits_match(model: zoo.ZooModel, hf: torch.nn.Module) -> None:
    ids, mask = padded_batch(VOCAB, LENGTHS)
    ours = model(ids, attention_mask=mask)
    theirs = hf(input_ids=ids, attention_mask=mask)
    if ours.logits is None:
        assert_same_at_real_positions(ours.last_hidden_state, theirs.last_hidden_state, mask)
    else:
        assert_same_at_real_positions(ours.logits, theirs.logits, mask)


def reload_hf(cls: type, path: Path) -> torch.nn.Module:
    """transformers' from_pretrained on ``path``, asserting it found exactly the tensors it needed."""
    model, info = cls.from_pretrained(path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    return model.eval()


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory: pytest.TempPathFactory) -> tuple[torch.nn.Module, Path]:
    hf = randomized(transformers.GPT2LMHeadModel(transformers.GPT2Config(**GPT2)))
    return hf, save_hf(hf, tmp_path_factory.mktemp("gpt2"))


def test_gpt2_logits_match_transformers_on_a_right_padded_batch(gpt2) -> None:
    hf, path = gpt2
    model = zoo.from_hf(path)
    assert model.spec.lm_head is not None and model.spec.lm_head.tied
    assert model.spec.ffn.activation == "gelu_tanh"
    assert_logits_match(model, hf)


def test_gpt2_export_loads_in_transformers_with_no_missing_keys_and_same_logits(gpt2, tmp_path) -> None:
    _, path = gpt2
    model = zoo.from_hf(path)
    zoo.to_hf(model, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == "gpt2" and config["architectures"] == ["GPT2LMHeadModel"]
    assert config["torch_dtype"] == "float32"
    assert_logits_match(model, reload_hf(transformers.GPT2LMHeadModel, tmp_path))


def test_zoo_built_gpt2_preset_exports_to_transformers_with_same_logits(tmp_path) -> None:
    model = zoo.build("gpt2-tiny").eval()
    zoo.to_hf(model, tmp_path)
    assert_logits_match(model, reload_hf(transformers.AutoModelForCausalLM, tmp_path))


def test_headless_gpt2_model_imports_as_a_body_and_exports_as_gpt2model(tmp_path) -> None:
    hf = randomized(transformers.GPT2Model(transformers.GPT2Config(**GPT2)))
    model = zoo.from_hf(save_hf(hf, tmp_path / "hf"))
    assert model.spec.lm_head is None
    assert_logits_match(model, hf)
    zoo.to_hf(model, tmp_path / "out")
    assert json.loads((tmp_path / "out" / "config.json").read_text())["architectures"] == ["GPT2Model"]
    assert_logits_match(model, reload_hf(transformers.GPT2Model, tmp_path / "out"))


def test_openai_style_gpt2_file_without_prefix_and_with_mask_buffers_loads(gpt2, tmp_path) -> None:
    """OpenAI's gpt2 files name the body without ``transformer.`` and carry causal-mask buffers."""
    hf, path = gpt2
    tensors = {k.removeprefix("transformer."): v for k, v in load_file(path / "model.safetensors").items()}
    for i in range(GPT2["n_layer"]):
        tensors[f"h.{i}.attn.bias"] = torch.tril(torch.ones(1, 1, 64, 64))
        tensors[f"h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    (tmp_path / "config.json").write_text((path / "config.json").read_text())
    model = zoo.from_hf(tmp_path)
    assert model.spec.lm_head is not None
    assert_logits_match(model, hf)


@pytest.mark.parametrize(
    ("kv_heads", "tied", "bias"),
    [(2, False, False), (1, True, True), (4, False, False)],
    ids=["gqa-untied", "mqa-tied-biases", "mha"],
)
def test_llama_logits_match_transformers_and_survive_export(tmp_path, kv_heads, tied, bias) -> None:
    config = transformers.LlamaConfig(
        **LLAMA, num_key_value_heads=kv_heads, tie_word_embeddings=tied, attention_bias=bias, mlp_bias=bias
    )
    hf = randomized(transformers.LlamaForCausalLM(config))
    model = zoo.from_hf(save_hf(hf, tmp_path / "hf"))
    spec = model.spec
    assert spec.attention.kv_heads == kv_heads and spec.lm_head.tied == tied and spec.attention.bias == bias
    assert_logits_match(model, hf)
    zoo.to_hf(model, tmp_path / "out")
    assert_logits_match(model, reload_hf(transformers.LlamaForCausalLM, tmp_path / "out"))


def test_zoo_built_llama_preset_exports_to_transformers_with_same_logits(tmp_path) -> None:
    model = zoo.build("llama-tiny").eval()
    zoo.to_hf(model, tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["num_key_value_heads"] == 2
    assert_logits_match(model, reload_hf(transformers.AutoModelForCausalLM, tmp_path))


def test_llama_rope_theta_from_transformers4_config_is_used(tmp_path) -> None:
    hf = randomized(transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA, num_key_value_heads=2)))
    save_hf(hf, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config.pop("rope_parameters")
    (tmp_path / "config.json").write_text(json.dumps({**config, "rope_theta": 500.0, "rope_scaling": None}))
    assert zoo.from_hf(tmp_path).spec.position.theta == 500.0


def test_llama_unsupported_rope_scaling_is_refused_naming_the_rope_type(tmp_path) -> None:
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA))
    save_hf(hf, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["rope_parameters"] = {"rope_type": "proportional", "rope_theta": 500000.0, "factor": 32.0}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="rope_type='proportional'"):
        zoo.from_hf(tmp_path)
