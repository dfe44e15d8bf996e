"""`zoo.lora.apply` / merge / unmerge / merge_and_unload: which projections get adapters, what trains, and
that merged weights give the adapters' outputs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from lora.lora_support import batch, liven, logits, tiny
from pydantic import ValidationError
from torch import nn

import zoo
from zoo.lora import LoraError, LoraLinear, LoraSpec

FAMILIES = [
    "bert-tiny",
    "gpt2-tiny",
    "llama-tiny",
    "t5-tiny",
    "bart-tiny",
    "gemma-tiny",
    "olmo2-tiny",
    "cohere2-tiny",
]
ALL_TARGETS = ["qkv", "out", "ffn_in", "ffn_out"]


# -- the spec ------------------------------------------------------------------------------------------------


def test_spec_defaults_and_scaling() -> None:
    spec = LoraSpec()
    assert (spec.r, spec.alpha, spec.dropout, spec.targets, spec.dora) == (
        8,
        16.0,
        0.0,
        ["qkv", "out"],
        False,
    )
    assert spec.scaling == 2.0
    assert [str(t) for t in LoraSpec(targets=["decoder.cross.qkv", "encoder.ffn_in"]).parsed_targets()] == [
        "decoder.cross.qkv",
        "encoder.ffn_in",
    ]


@pytest.mark.parametrize(
    ("targets", "message"),
    [
        (
            ["qkv", "out", "decoder.ffn"],
            "targets[2] 'decoder.ffn' is not a target: expected [encoder.|decoder.]",
        ),
        (["cross.ffn_in"], "targets[0] 'cross.ffn_in' is not a target: 'cross.' goes only before qkv or out"),
        (["decoder.encoder.qkv"], "targets[0] 'decoder.encoder.qkv' is not a target"),
        (["qkv", "qkv"], "targets lists 'qkv' more than once"),
        ([], "at least 1 item"),
    ],
)
def test_spec_refuses_a_bad_target_naming_the_entry(targets: list[str], message: str) -> None:
    with pytest.raises(ValidationError) as error:
        LoraSpec(targets=targets)
    assert message in str(error.value)
    assert error.value.errors()[0]["loc"] == ("targets",)


@pytest.mark.parametrize(("field", "value"), [("r", 0), ("alpha", 0.0), ("dropout", 1.0), ("dropout", -0.1)])
def test_spec_refuses_out_of_range_numbers(field: str, value: float) -> None:
    with pytest.raises(ValidationError, match=field):
        LoraSpec(**{field: value})


# -- apply ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dora", [False, True], ids=["lora", "dora"])
@pytest.mark.parametrize("name", FAMILIES)
def test_zero_initialised_adapters_leave_the_outputs_unchanged(name: str, dora: bool) -> None:
    model = tiny(name)
    inputs = batch(model)
    before = logits(model, inputs)
    zoo.lora.apply(model, r=4, targets=ALL_TARGETS, dora=dora)
    assert torch.equal(logits(model, inputs), before)  # B = 0 (and m = ||W||): not one bit changes
    liven(model)
    assert (logits(model, inputs) - before).abs().max() > 1e-2  # and the adapters do act once trained


def test_only_the_adapters_train_and_a_step_changes_only_them() -> None:
    model = tiny("gpt2-tiny")
    base_total = model.num_parameters()
    zoo.lora.apply(model, r=8, alpha=16, targets=["qkv", "out"], dropout=0.1)
    # per layer: qkv A (8, 64) + B (192, 8), out A (8, 64) + B (64, 8); 2 layers
    adapter_elements = 2 * (8 * 64 + 192 * 8 + 8 * 64 + 64 * 8)
    assert zoo.lora.trainable_parameters(model) == (adapter_elements, base_total + adapter_elements)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == {
        f"decoder.layers.{i}.self_attn.{proj}.lora_{ab}"
        for i in (0, 1)
        for proj in ("qkv_proj", "out_proj")
        for ab in "AB"
    }
    liven(model)  # B = 0 would leave A's gradient zero on the first step
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    model.train()
    inputs = batch(model)
    model(**inputs, labels=inputs["input_ids"]).loss.backward()
    optimizer.step()
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert changed == trainable
    assert all(p.grad is None for p in model.parameters() if not p.requires_grad)


def test_targets_resolve_per_stack_and_attention_kind() -> None:
    model = tiny("bart-tiny")

    def resolved(*targets: str) -> set[str]:
        return set(zoo.lora.resolve_targets(model, LoraSpec(targets=list(targets))))

    layers = [f"{stack}.layers.{i}" for stack in ("encoder", "decoder") for i in (0, 1)]
    assert resolved("decoder.cross.qkv") == {
        f"decoder.layers.{i}.cross_attn.{p}" for i in (0, 1) for p in ("q_proj", "kv_proj")
    }
    assert resolved("self.qkv") == {f"{layer}.self_attn.qkv_proj" for layer in layers}
    assert resolved("out") == {f"{layer}.self_attn.out_proj" for layer in layers} | {
        f"decoder.layers.{i}.cross_attn.out_proj" for i in (0, 1)
    }
    assert resolved("encoder.ffn_out", "decoder.ffn_in") == {
        *(f"encoder.layers.{i}.ffn.down_proj" for i in (0, 1)),
        *(f"decoder.layers.{i}.ffn.up_proj" for i in (0, 1)),
    }
    assert len(resolved("qkv")) == 4 + 2 * 2  # self qkv_proj in 4 layers, cross q_proj + kv_proj in 2

    expected = resolved("decoder.cross.qkv")
    zoo.lora.apply(model, targets=["decoder.cross.qkv"])
    assert set(zoo.lora.adapter_modules(model)) == expected


def test_the_fused_qkv_projection_gets_one_adapter() -> None:
    model = tiny("llama-tiny")  # H = 4 query heads, K = 2 key/value heads, D = 16
    zoo.lora.apply(model, r=4, targets=["qkv"])
    qkv = model.decoder.layers[0].self_attn.qkv_proj
    assert isinstance(qkv, LoraLinear)
    assert qkv.lora_A.shape == (4, 64)  # (r, C)
    assert qkv.lora_B.shape == ((4 + 2 * 2) * 16, 4)  # ((H + 2K) D, r)
    # the base tensors keep their names: the state dict is the base's plus the adapters
    assert "decoder.layers.0.self_attn.qkv_proj.weight" in model.state_dict()


@pytest.mark.parametrize(
    ("name", "target", "has"),
    [
        ("gpt2-tiny", "cross.qkv", "decoder (self-attention, ffn)"),
        ("gpt2-tiny", "encoder.out", "decoder (self-attention, ffn)"),
        ("bert-tiny", "decoder.ffn_in", "encoder (self-attention, ffn)"),
    ],
)
def test_a_target_that_matches_nothing_is_refused_and_nothing_changes(
    name: str, target: str, has: str
) -> None:
    model = tiny(name)
    state = {n: t.clone() for n, t in model.state_dict().items()}
    message = rf"lora target '{target}' matches nothing in this \w+Model: it has {re.escape(has)}$"
    with pytest.raises(LoraError, match=message):
        zoo.lora.apply(model, targets=["qkv", target])  # the valid first target is not applied either
    assert not zoo.lora.adapter_modules(model)
    assert all(p.requires_grad for p in model.parameters())
    assert model.state_dict().keys() == state.keys()


def test_a_model_with_adapters_is_refused() -> None:
    model = zoo.lora.apply(tiny("gpt2-tiny"))
    with pytest.raises(LoraError, match="already has LoRA adapters"):
        zoo.lora.apply(model, targets=["ffn_in"])


def test_dropout_acts_on_the_adapter_input_only() -> None:
    model = tiny("gpt2-tiny")
    inputs = batch(model)
    base = logits(model, inputs)
    zoo.lora.apply(model, targets=["qkv"], dropout=0.5).train()
    assert torch.equal(logits(model, inputs), base)  # B = 0: whatever is dropped, the frozen path is whole
    liven(model)
    assert not torch.allclose(logits(model, inputs), logits(model.eval(), inputs))


# -- merge, unmerge, unload ----------------------------------------------------------------------------------


@pytest.mark.parametrize("dora", [False, True], ids=["lora", "dora"])
@pytest.mark.parametrize("name", FAMILIES)
def test_merged_logits_equal_adapter_logits_and_unmerge_restores(name: str, dora: bool) -> None:
    model = zoo.lora.apply(tiny(name), r=4, targets=ALL_TARGETS, dora=dora)
    liven(model)
    inputs = batch(model)
    adapted = logits(model, inputs)
    weights = {n: p.detach().clone() for n, p in model.named_parameters()}
    zoo.lora.merge(model)
    merged = logits(model, inputs)
    # 1e-5 relative to the logits' size: float32 rounding of W + s B A against W x + s B (A x). Measured:
    # <= 9e-7 where logits are ~1; 1.2e-5 on T5 (unscaled attention, logits up to ~4).
    assert (merged - adapted).abs().max() < 1e-5 * max(1.0, adapted.abs().max().item())
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, weights[n])}
    assert changed == {f"{path}.weight" for path in zoo.lora.adapter_modules(model)}  # only the targeted W
    zoo.lora.unmerge(model)
    assert all(torch.equal(p, weights[n]) for n, p in model.named_parameters())  # bit for bit
    assert torch.equal(logits(model, inputs), adapted)


@pytest.mark.parametrize("dora", [False, True], ids=["lora", "dora"])
def test_unmerge_without_a_kept_copy_is_exact_to_rounding(dora: bool) -> None:
    model = zoo.lora.apply(tiny("llama-tiny"), r=4, targets=ALL_TARGETS, dora=dora)
    liven(model)
    weights = {n: p.detach().clone() for n, p in model.named_parameters()}
    zoo.lora.merge(model, keep_original=False)
    zoo.lora.unmerge(model)
    worst = max((p - weights[n]).abs().max().item() for n, p in model.named_parameters())
    assert worst < 1e-6  # weights are ~0.02-0.5: a few float32 ulps


def test_dora_merges_to_the_papers_weight() -> None:
    """W' = m / ||W + s B A||_row * (W + s B A) (Liu et al. 2024, eq. 5), computed here from scratch."""
    model = zoo.lora.apply(tiny("gpt2-tiny"), r=4, alpha=8, targets=["ffn_in"], dora=True)
    liven(model)
    module = model.decoder.layers[1].ffn.up_proj
    assert isinstance(module, LoraLinear)
    W, A, B, m = (
        t.detach().double().clone()
        for t in (module.weight, module.lora_A, module.lora_B, module.lora_magnitude)
    )
    adapted = W + 2.0 * B @ A
    expected = m[:, None] * adapted / adapted.norm(dim=1, keepdim=True)
    zoo.lora.merge(model)
    assert (module.weight.double() - expected).abs().max() < 1e-6


def test_merge_and_unload_gives_a_plain_model_that_saves_and_loads(tmp_path: Path) -> None:
    model = tiny("t5-tiny")
    frozen = model.encoder.layers[0].ffn_norm.weight
    frozen.requires_grad_(False)  # a choice made before apply survives the round trip
    zoo.lora.apply(model, r=4, targets=ALL_TARGETS, dora=True)
    liven(model)
    inputs = batch(model)
    adapted = logits(model, inputs)
    with pytest.raises(ValueError, match=r"has LoRA adapters: save them with zoo.lora.save, or fold them in"):
        zoo.save(model, tmp_path / "refused")
    plain = zoo.lora.merge_and_unload(model)
    assert plain is model and not zoo.lora.adapter_modules(model) and not hasattr(model, "lora_spec")
    assert type(model.decoder.layers[0].cross_attn.kv_proj) is nn.Linear
    assert {n for n, p in model.named_parameters() if not p.requires_grad} == {
        "encoder.layers.0.ffn_norm.weight"
    }
    assert (logits(model, inputs) - adapted).abs().max() < 1e-5
    zoo.save(model, tmp_path / "merged")
    reloaded = zoo.load(tmp_path / "merged")
    assert torch.equal(logits(reloaded, inputs), logits(model, inputs))


def test_merge_needs_adapters() -> None:
    with pytest.raises(LoraError, match="has no LoRA adapters"):
        zoo.lora.merge(tiny("gpt2-tiny"))


def test_adapters_take_the_bases_dtype_and_a_bfloat16_model_trains() -> None:
    model = zoo.lora.apply(tiny("llama-tiny").to(torch.bfloat16), r=4, targets=["qkv", "ffn_out"], dora=True)
    module = model.decoder.layers[0].ffn.down_proj
    assert isinstance(module, LoraLinear) and module.lora_magnitude is not None
    assert {module.lora_A.dtype, module.lora_B.dtype, module.lora_magnitude.dtype} == {torch.bfloat16}
    inputs = batch(model)
    model.train()(**inputs, labels=inputs["input_ids"]).loss.backward()
    assert module.lora_B.grad is not None and module.lora_magnitude.grad is not None
    assert module.weight.grad is None
