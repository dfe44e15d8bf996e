"""`zoo.lora.to_peft`: the base through `zoo.to_hf`, the adapters through `to_peft`, loaded with
``peft.PeftModel.from_pretrained`` on the transformers model, give zoo's adapted logits. Nothing is downloaded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from lora.lora_support import batch, liven, logits, tiny
from safetensors.torch import load_file

import zoo
from zoo.lora import LoraError
from zoo.lora.peft import probe

peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

ALL_TARGETS = ["qkv", "out", "ffn_in", "ffn_out"]
# preset -> the class transformers loads the export with (what config.json's architectures names)
FAMILIES = {
    "gpt2-tiny": "GPT2LMHeadModel",
    "llama-tiny": "LlamaForCausalLM",
    "bert-tiny": "BertForMaskedLM",
    "bart-tiny": "BartForConditionalGeneration",
    "t5-tiny": "T5ForConditionalGeneration",
    "transformer-tiny": "MarianMTModel",  # the 2017 Transformer: Marian, with the residual stream permuted
    "pythia-tiny": "GPTNeoXForCausalLM",  # query_key_value's rows regrouped per head: B's rows follow
    "phi3-tiny": "Phi3ForCausalLM",  # fused qkv_proj and gate_up_proj exported as they are
}


def _export(
    name: str, tmp_path: Path, *, dora: bool, targets: list[str]
) -> tuple[zoo.ZooModel, torch.nn.Module]:
    """(zoo adapted model, PeftModel over the transformers export of its base)."""
    model = tiny(name)
    zoo.to_hf(model, tmp_path / "base")
    zoo.lora.apply(model, r=4, alpha=8, targets=targets, dora=dora)
    liven(model)
    zoo.lora.to_peft(model, tmp_path / "adapter", base_model_name_or_path="base")
    architecture = json.loads((tmp_path / "base" / "config.json").read_text())["architectures"][0]
    assert architecture == FAMILIES[name]
    hf = getattr(transformers, architecture).from_pretrained(tmp_path / "base").eval()
    return model, peft.PeftModel.from_pretrained(hf, tmp_path / "adapter").eval()


@pytest.mark.parametrize("dora", [False, True], ids=["lora", "dora"])
@pytest.mark.parametrize("name", list(FAMILIES))
def test_peft_loads_the_export_with_zoos_logits(name: str, dora: bool, tmp_path: Path) -> None:
    model, peft_model = _export(name, tmp_path, dora=dora, targets=ALL_TARGETS)
    inputs = batch(model)  # right-padded (2, 7) with 7 and 4 real tokens
    ours = logits(model, inputs)
    with torch.no_grad():
        theirs = peft_model(**inputs).logits
        with peft_model.disable_adapter():
            base = peft_model(**inputs).logits
    real = inputs["attention_mask"].bool() if model.spec.family != "encoder-decoder" else slice(None)
    assert (ours[real] - theirs[real]).abs().max() < 1e-4  # measured <= 3.6e-6 (Marian, logits up to ~5)
    assert (base[real] - theirs[real]).abs().max() > 1e-2  # every adapter was loaded and acts


def test_the_config_and_tensors_follow_peft_for_gpt2s_conv1d(tmp_path: Path) -> None:
    model, _ = _export("gpt2-tiny", tmp_path, dora=True, targets=["qkv", "ffn_out"])
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["task_type"] == "CAUSAL_LM"
    assert (config["r"], config["lora_alpha"], config["use_dora"], config["fan_in_fan_out"]) == (
        4,
        8,
        True,
        True,
    )
    assert config["target_modules"] == [
        f"transformer.h.{i}.{m}" for i in (0, 1) for m in ("attn.c_attn", "mlp.c_proj")
    ]
    tensors = load_file(tmp_path / "adapter" / "adapter_model.safetensors")
    key = "base_model.model.transformer.h.0.attn.c_attn"
    qkv = model.decoder.layers[0].self_attn.qkv_proj
    assert torch.equal(tensors[f"{key}.lora_A.weight"], qkv.lora_A) and torch.equal(
        tensors[f"{key}.lora_B.weight"], qkv.lora_B
    )
    assert torch.equal(tensors[f"{key}.lora_magnitude_vector"], qkv.lora_magnitude)


def test_a_fused_qkv_adapter_becomes_q_k_v_adapters_sharing_a(tmp_path: Path) -> None:
    model, _ = _export("llama-tiny", tmp_path, dora=False, targets=["qkv"])
    tensors = load_file(tmp_path / "adapter" / "adapter_model.safetensors")
    qkv = model.decoder.layers[1].self_attn.qkv_proj  # rows [q (64) | k (32) | v (32)]
    key = "base_model.model.model.layers.1.self_attn"
    for proj, rows in (("q_proj", slice(0, 64)), ("k_proj", slice(64, 96)), ("v_proj", slice(96, 128))):
        assert torch.equal(tensors[f"{key}.{proj}.lora_A.weight"], qkv.lora_A)
        assert torch.equal(tensors[f"{key}.{proj}.lora_B.weight"], qkv.lora_B[rows])


def test_a_converter_that_is_not_a_pure_selection_is_refused() -> None:
    spec = zoo.preset("gpt2-tiny")
    targeted = {"decoder.layers.0.self_attn.out_proj": (64, 64)}
    name = "decoder.layers.0.self_attn.out_proj.weight"
    with pytest.raises(
        LoraError, match=r"h\.0\.proj\.weight is not a pure selection .* \(scaled, mixed or padded\)"
    ):
        probe(lambda state: {"h.0.proj.weight": state[name] * 0.5}, spec, targeted)
    with pytest.raises(LoraError, match="is not rows x columns"):
        probe(lambda state: {"h.0.proj.weight": state[name].reshape(32, 128)}, spec, targeted)
    with pytest.raises(
        LoraError, match=r"the Hugging Face export drops decoder\.layers\.0\.self_attn\.out_proj"
    ):
        probe(lambda state: {}, spec, targeted)
    flipped = probe(lambda state: {"h.0.proj.weight": state[name].flip(0).t()}, spec, targeted)["h.0.proj"]
    assert flipped.transposed and flipped.rows.tolist() == list(range(63, -1, -1))
    assert flipped.cols.tolist() == list(range(64))


def test_to_peft_needs_adapters(tmp_path: Path) -> None:
    with pytest.raises(LoraError, match="has no LoRA adapters"):
        zoo.lora.to_peft(tiny("gpt2-tiny"), tmp_path)
