"""`zoo.lora.disabled`: inside the block a model with (trained) adapters computes exactly what its base does,
with no weight copied; outside, the adapters are back."""

from __future__ import annotations

import copy

import pytest
import torch
from lora.lora_support import batch, liven, logits, tiny

import zoo
import zoo.lora
from zoo.lora import LoraError

FAMILIES = ["gpt2-tiny", "llama-tiny", "t5-tiny"]


@pytest.mark.parametrize("dora", [False, True], ids=["lora", "dora"])
@pytest.mark.parametrize("name", FAMILIES)
def test_disabled_adapters_give_the_base_models_logits(name: str, dora: bool) -> None:
    torch.manual_seed(0)
    base = tiny(name)
    model = zoo.lora.apply(copy.deepcopy(base), r=4, targets=["qkv", "out", "ffn_in", "ffn_out"], dora=dora)
    liven(model)
    inputs = batch(base)
    expected, adapted = logits(base, inputs), logits(model, inputs)
    assert not torch.allclose(adapted, expected, atol=1e-4)  # the adapters change the outputs
    weights = {name: p.data_ptr() for name, p in model.named_parameters()}
    with zoo.lora.disabled(model) as same:
        assert same is model
        assert torch.equal(logits(model, inputs), expected)
        assert {name: p.data_ptr() for name, p in model.named_parameters()} == weights  # nothing copied
    assert torch.equal(logits(model, inputs), adapted)  # back on


def test_disabled_experts_read_the_base_weights() -> None:
    spec = zoo.preset("moe-tiny").override(
        **{"ffn.shared_d_ff": 32, "ffn.sparse_step": 2, "ffn.dense_d_ff": 48}
    )
    torch.manual_seed(0)
    base = zoo.build(spec).eval()
    model = zoo.lora.apply(copy.deepcopy(base), r=4, targets=["ffn_in", "ffn_out"])
    liven(model)
    inputs = batch(base)
    with zoo.lora.disabled(model):
        torch.testing.assert_close(logits(model, inputs), logits(base, inputs), rtol=0, atol=0)
    assert not torch.allclose(logits(model, inputs), logits(base, inputs), atol=1e-4)


def test_gradients_flow_into_the_adapters_again_after_the_block() -> None:
    model = zoo.lora.apply(tiny("gpt2-tiny"), r=4)
    liven(model)
    inputs = batch(model)
    with zoo.lora.disabled(model), torch.no_grad():
        model(**inputs)
    model(**inputs).logits.sum().backward()
    grads = [p.grad for name, p in model.named_parameters() if name.endswith("lora_A")]
    assert grads and all(g is not None and g.abs().sum() > 0 for g in grads)


def test_disabled_refuses_a_model_without_adapters_or_with_merged_ones() -> None:
    with (
        pytest.raises(LoraError, match=r"zoo.lora.disabled: the model has no LoRA adapters"),
        zoo.lora.disabled(tiny("gpt2-tiny")),
    ):
        pass
    model = zoo.lora.merge(zoo.lora.apply(tiny("gpt2-tiny"), r=4))
    with (
        pytest.raises(LoraError, match=r"merged into the base weights .*zoo.lora.unmerge them first"),
        zoo.lora.disabled(model),
    ):
        pass
