"""LoRA on Mixture-of-Experts FFNs: the ``ffn_in`` / ``ffn_out`` targets reach the stacked expert weights
(one adapter per expert, `zoo.lora.experts`), the shared expert and the dense layers, and the adapted model
computes what a model with the updated weights computes."""

from __future__ import annotations

import pytest
import torch
from lora.lora_support import batch, liven, logits

import zoo
from zoo.blocks.moe import StackedLinear
from zoo.lora import LoraError
from zoo.lora.experts import LoraStackedLinear


def moe_model() -> zoo.ZooModel:
    """moe-tiny with a dense layer 0 and a sparse layer 1 that has a shared expert."""
    spec = zoo.preset("moe-tiny").override(
        **{"ffn.shared_d_ff": 32, "ffn.sparse_step": 2, "ffn.dense_d_ff": 48}
    )
    torch.manual_seed(0)
    return zoo.build(spec).eval()


def test_ffn_targets_reach_the_experts_the_shared_expert_and_the_dense_layers() -> None:
    model = zoo.lora.apply(moe_model(), r=4, alpha=8, targets=["ffn_in", "ffn_out"])
    adapters = zoo.lora.adapter_modules(model)
    assert list(adapters) == [
        "decoder.layers.0.ffn.up_proj", "decoder.layers.0.ffn.down_proj",
        "decoder.layers.1.ffn.experts.up_proj", "decoder.layers.1.ffn.experts.down_proj",
        "decoder.layers.1.ffn.shared.up_proj", "decoder.layers.1.ffn.shared.down_proj",
    ]  # fmt: skip
    experts = adapters["decoder.layers.1.ffn.experts.up_proj"]
    assert isinstance(experts, LoraStackedLinear)
    assert experts.lora_A.shape == (4, 4, 64) and experts.lora_B.shape == (4, 128, 4)  # (E, r, C), (E, 2F, r)
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_" in name for name in trainable)


def test_adapted_experts_equal_a_model_with_the_updated_weights_and_merge_gives_it() -> None:
    model = zoo.lora.apply(moe_model(), r=4, alpha=8, targets=["ffn_in", "ffn_out"])
    inputs = batch(model)
    base = logits(model, inputs)
    liven(model)
    adapted = logits(model, inputs)
    assert (adapted - base).abs().max() > 1e-3  # the expert adapters change the outputs
    reference = moe_model()
    with torch.no_grad():
        for path, adapter in zoo.lora.adapter_modules(model).items():
            reference.get_submodule(path).weight.add_(adapter.delta_weight())
    torch.testing.assert_close(adapted, logits(reference, inputs), atol=1e-5, rtol=1e-5)
    plain = zoo.lora.merge_and_unload(model)
    assert isinstance(plain.get_submodule("decoder.layers.1.ffn.experts.up_proj"), StackedLinear)
    torch.testing.assert_close(logits(plain, inputs), adapted, atol=1e-5, rtol=1e-5)
    assert set(plain.state_dict()) == set(reference.state_dict())


def test_expert_adapters_train_save_and_load(tmp_path) -> None:
    model = zoo.lora.apply(moe_model(), r=2, targets=["ffn_in"])
    inputs = batch(model)
    out = model.train()(**inputs, labels=inputs["input_ids"])
    (out.loss + out.aux_loss).backward()
    experts = zoo.lora.adapter_modules(model)["decoder.layers.1.ffn.experts.up_proj"]
    assert experts.lora_B.grad is not None and experts.lora_B.grad.abs().sum() > 0
    liven(model)
    model.eval()
    path = zoo.lora.save(model, tmp_path / "adapter.safetensors")
    loaded = zoo.lora.load(moe_model(), path)
    torch.testing.assert_close(logits(loaded, inputs), logits(model, inputs), atol=0, rtol=0)


@pytest.mark.parametrize(("option", "field"), [({"dora": True}, "dora"), ({"dropout": 0.1}, "dropout")])
def test_dora_and_dropout_are_refused_on_experts(option, field) -> None:
    with pytest.raises(LoraError, match=rf"lora {field} is not supported on Mixture-of-Experts experts"):
        zoo.lora.apply(moe_model(), targets=["ffn_in"], **option)
    zoo.lora.apply(moe_model(), targets=["qkv"], **option)  # attention-only adapters are fine


def test_peft_export_of_expert_adapters_is_refused(tmp_path) -> None:
    model = zoo.lora.apply(moe_model(), targets=["ffn_out"])
    with pytest.raises(LoraError, match="one adapter per expert"):
        zoo.lora.to_peft(model, tmp_path / "peft")


def gpt_oss_model() -> zoo.ZooModel:
    """gpt-oss-tiny with lively sinks and expert/router biases (they are not adapted: LoRA must keep them)."""
    torch.manual_seed(0)
    model = zoo.build("gpt-oss-tiny").eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("sinks", "bias")):
                param.normal_(0.0, 1.0)
    return model


def test_gpt_oss_experts_and_attention_adapt_with_their_biases_and_sinks_kept() -> None:
    targets = ["qkv", "out", "ffn_in", "ffn_out"]
    model = zoo.lora.apply(gpt_oss_model(), r=4, alpha=8, targets=targets)
    assert isinstance(
        zoo.lora.adapter_modules(model)["decoder.layers.0.ffn.experts.up_proj"], LoraStackedLinear
    )
    inputs = batch(model)
    liven(model)
    adapted = logits(model, inputs)
    reference = gpt_oss_model()
    with torch.no_grad():
        for path, adapter in zoo.lora.adapter_modules(model).items():
            reference.get_submodule(path).weight.add_(adapter.delta_weight())
    torch.testing.assert_close(adapted, logits(reference, inputs), atol=1e-5, rtol=1e-5)
    plain = zoo.lora.merge_and_unload(model)
    torch.testing.assert_close(logits(plain, inputs), adapted, atol=1e-5, rtol=1e-5)
    assert set(plain.state_dict()) == set(reference.state_dict())
