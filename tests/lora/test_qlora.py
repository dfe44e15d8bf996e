"""QLoRA (``quantize_base="nf4"``): every frozen projection stored NF4 and dequantised per matmul, the
embeddings and norms untouched; merge, merge_and_unload, saving, PEFT export and `load_base` on top."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from lora.lora_support import batch, liven, logits, tiny
from safetensors.torch import load_file
from torch import nn

import zoo
import zoo.lora
from zoo.lora import LoraError, LoraLinear, Nf4Linear
from zoo.lora.nf4 import dense, is_nf4, quantize

pytest.importorskip("torchao")

PROJECTIONS = ("qkv_proj", "out_proj", "up_proj", "down_proj")


def nf4_reference(model: nn.Module) -> nn.Module:
    """A copy of ``model`` whose every attention and FFN projection holds its weight rounded through NF4."""
    with torch.no_grad():
        for name, module in model.named_modules():
            if isinstance(module, nn.Linear) and name.rsplit(".", 1)[-1] in PROJECTIONS:
                module.weight.copy_(dense(quantize(module.weight)))
    return model


def test_every_projection_is_nf4_and_the_rest_keeps_its_dtype() -> None:
    model = zoo.lora.apply(tiny("llama-tiny"), r=4, targets=["qkv"], quantize_base="nf4")
    kinds = {name.rsplit(".", 1)[-1]: type(m) for name, m in model.named_modules() if hasattr(m, "weight")}
    assert kinds["qkv_proj"] is LoraLinear and kinds["out_proj"] is Nf4Linear
    assert kinds["up_proj"] is Nf4Linear and kinds["down_proj"] is Nf4Linear
    nf4_params = [name for name, p in model.named_parameters() if is_nf4(p)]
    assert len(nf4_params) == 4 * model.spec.num_layers
    dense_params = {p.dtype for name, p in model.named_parameters() if not is_nf4(p)}
    assert dense_params == {torch.float32}  # embeddings, norms, adapters
    assert model.lora_spec.quantize_base == "nf4"
    assert zoo.lora.trainable_parameters(model)[0] == 4 * model.spec.num_layers * (64 + 128)


def test_nf4_forward_is_the_dense_forward_on_the_rounded_weights() -> None:
    torch.manual_seed(0)
    model = tiny("llama-tiny")
    reference = nf4_reference(tiny("llama-tiny"))
    reference.load_state_dict(model.state_dict())
    nf4_reference(reference)
    inputs = batch(model)
    base = logits(model, inputs)
    zoo.lora.apply(model, r=4, targets=["qkv", "out"], quantize_base="nf4")
    torch.testing.assert_close(logits(model, inputs), logits(reference, inputs), atol=1e-5, rtol=1e-5)
    assert not torch.allclose(logits(model, inputs), base, atol=1e-3)  # NF4 does round


def test_only_the_adapters_get_gradients_and_training_lowers_the_loss() -> None:
    torch.manual_seed(0)
    model = zoo.lora.apply(tiny("llama-tiny"), r=4, targets=["qkv", "out", "ffn_in"], quantize_base="nf4")
    inputs = batch(model)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    losses = []
    model.train()
    for _ in range(8):
        loss = model(**inputs, labels=inputs["input_ids"]).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    with_grad = {name for name, p in model.named_parameters() if p.grad is not None}
    assert with_grad and all(".lora_" in name for name in with_grad)
    assert losses[-1] < losses[0] - 0.1


def test_merge_and_unload_gives_plain_linears_in_the_compute_dtype() -> None:
    model = zoo.lora.apply(tiny("llama-tiny"), r=4, targets=["qkv", "ffn_out"], quantize_base="nf4")
    liven(model)
    inputs = batch(model)
    adapted = logits(model, inputs)
    qkv = model.decoder.layers[0].self_attn.qkv_proj
    stored = qkv.weight
    zoo.lora.merge(model)
    assert not is_nf4(qkv.weight) and qkv.weight.dtype == torch.float32
    torch.testing.assert_close(logits(model, inputs), adapted, atol=1e-5, rtol=1e-5)
    zoo.lora.unmerge(model)
    assert qkv.weight is stored  # the very NF4 weight back
    plain = zoo.lora.merge_and_unload(model)
    assert not zoo.lora.adapter_modules(plain) and not zoo.lora.nf4_modules(plain)
    assert all(not is_nf4(p) and p.dtype == torch.float32 for p in plain.parameters())
    assert all(p.requires_grad for p in plain.parameters())  # as before apply
    torch.testing.assert_close(logits(plain, inputs), adapted, atol=1e-5, rtol=1e-5)


def test_dora_on_an_nf4_base_merges_to_its_own_outputs() -> None:
    model = zoo.lora.apply(tiny("llama-tiny"), r=4, dora=True, quantize_base="nf4")
    liven(model)
    inputs = batch(model)
    adapted = logits(model, inputs)
    torch.testing.assert_close(
        logits(zoo.lora.merge_and_unload(model), inputs), adapted, atol=1e-5, rtol=1e-5
    )


def test_the_adapter_file_fits_the_dense_base_it_was_trained_from(tmp_path: Path) -> None:
    torch.manual_seed(0)
    dense_base = tiny("llama-tiny")
    model = tiny("llama-tiny")
    model.load_state_dict(dense_base.state_dict())
    zoo.lora.apply(model, r=4, quantize_base="nf4")
    liven(model)
    zoo.lora.save(model, tmp_path / "adapter.safetensors")
    info = zoo.lora.read_adapter(tmp_path / "adapter.safetensors")
    assert info.spec.quantize_base is None  # how the base was held is not the adapters'
    assert "quantize_base" not in load_file_metadata(tmp_path / "adapter.safetensors")
    assert info.fingerprint == zoo.lora.base_fingerprint(
        {f"{p}": m.weight for p, m in zoo.lora.resolve_targets(dense_base, info.spec).items()}
    )
    reloaded = zoo.lora.load(dense_base, tmp_path / "adapter.safetensors")  # the fingerprint check passes
    for name, tensor in zoo.lora.adapter_state(model).items():
        assert torch.equal(zoo.lora.adapter_state(reloaded)[name], tensor)
    quantized = zoo.lora.load(
        tiny("llama-tiny"), tmp_path / "adapter.safetensors", check_base=False, quantize_base="nf4"
    )
    assert zoo.lora.nf4_modules(quantized)


def load_file_metadata(path: Path) -> str:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as handle:
        return json.dumps(handle.metadata())


def test_the_peft_export_is_the_adapters_as_on_a_dense_base(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = zoo.lora.apply(tiny("llama-tiny"), r=4, quantize_base="nf4")
    liven(model)
    twin = zoo.lora.apply(tiny("llama-tiny"), r=4)
    with torch.no_grad():
        for name, tensor in zoo.lora.adapter_state(model).items():
            zoo.lora.adapter_state(twin)[name].copy_(tensor)
    zoo.lora.to_peft(model, tmp_path / "q")
    zoo.lora.to_peft(twin, tmp_path / "d")
    got, expected = (
        load_file(tmp_path / "q/adapter_model.safetensors"),
        load_file(tmp_path / "d/adapter_model.safetensors"),
    )
    assert got.keys() == expected.keys() and all(torch.equal(got[k], expected[k]) for k in got)
    assert (tmp_path / "q/adapter_config.json").read_text() == (
        tmp_path / "d/adapter_config.json"
    ).read_text()


def test_load_base_reads_the_same_nf4_base_as_quantising_after_loading(tmp_path: Path) -> None:
    torch.manual_seed(0)
    zoo.save(tiny("llama-tiny"), tmp_path / "base")
    streamed = zoo.lora.apply(zoo.lora.load_base(tmp_path / "base"), r=4, quantize_base="nf4")
    after = zoo.lora.apply(zoo.load(tmp_path / "base"), r=4, quantize_base="nf4")
    for (name, a), (_, b) in zip(streamed.state_dict().items(), after.state_dict().items(), strict=True):
        if is_nf4(a):
            assert torch.equal(a.quantized_data, b.quantized_data) and torch.equal(
                a.quantized_scalers, b.quantized_scalers
            ), name
        elif ".lora_A" not in name:  # A is random: seeded differently
            assert torch.equal(a, b), name
    fingerprint = zoo.lora.base_fingerprint(zoo.lora.base_weights(zoo.lora.adapter_modules(streamed)))
    assert fingerprint == zoo.lora.base_fingerprint(zoo.lora.base_weights(zoo.lora.adapter_modules(after)))
    gpt2 = tiny("gpt2-tiny")  # tied head, biases, LayerNorm
    zoo.save(gpt2, tmp_path / "gpt2")
    tied = zoo.lora.load_base(tmp_path / "gpt2")
    assert not tied.training and {type(tied.decoder.layers[0].ffn.up_proj)} == {Nf4Linear}
    inputs = batch(gpt2)
    torch.testing.assert_close(
        logits(tied, inputs), logits(nf4_reference(gpt2), inputs), atol=1e-5, rtol=1e-5
    )


def test_settings_nf4_cannot_serve_are_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(LoraError, match=r"quantize_base must be 'nf4' or None .*got 'nf8'"):
        zoo.lora.apply(tiny("llama-tiny"), quantize_base="nf8")
    moe = tiny("moe-tiny") if "moe-tiny" in zoo.list_presets() else None
    if moe is not None:
        with pytest.raises(LoraError, match="does not reach Mixture-of-Experts experts"):
            zoo.lora.apply(moe, targets=["qkv"], quantize_base="nf4")
    zoo.save(tiny("llama-tiny"), tmp_path / "base")
    with pytest.raises(LoraError, match=r"the base is stored NF4 .*pass quantize_base='nf4'"):
        zoo.lora.apply(zoo.lora.load_base(tmp_path / "base"), r=4)
    odd = tiny(
        "llama-tiny", d_model=40, ffn={"d_ff": 102, "activation": "silu", "gated": True, "bias": False}
    )
    with pytest.raises(LoraError, match=r"cannot be stored NF4: its element count is not a multiple of 64"):
        zoo.lora.apply(odd, quantize_base="nf4")
    assert not zoo.lora.nf4_modules(odd)  # refused before anything was replaced


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_qlora_runs_on_cuda() -> None:
    model = tiny("llama-tiny").to("cuda")
    zoo.lora.apply(model, r=4, quantize_base="nf4")
    inputs = {k: v.to("cuda") for k, v in batch(model).items()}
    loss = model(**inputs, labels=inputs["input_ids"]).loss
    loss.backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_a_weight_past_two_to_the_24_elements_can_be_fingerprinted() -> None:
    # float32 sample positions used to round the last one past the end (Llama 3.2 1B's FFN: 16384 x 2048).
    weight = torch.zeros(16384, 2048, dtype=torch.bfloat16)
    assert len(zoo.lora.base_fingerprint({"w": weight})) == 64


def test_the_chunked_dequantisation_is_torchaos_bit_for_bit() -> None:
    torch.manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16):
        weight = quantize(torch.randn(3000, 704, dtype=dtype))  # > one 2**20-code chunk, a partial last one
        assert torch.equal(dense(weight), weight.to(dtype))
    x = torch.randn(5, 704, dtype=torch.bfloat16, requires_grad=True)
    from torchao.quantization.quantize_.workflows.nf4.nf4_tensor import linear_nf4

    from zoo.lora.nf4 import linear

    ours = linear(x, weight, None)
    (grad,) = torch.autograd.grad(ours.sum(), x)
    theirs = linear_nf4(x, weight)
    (their_grad,) = torch.autograd.grad(theirs.sum(), x)
    assert torch.equal(ours, theirs) and torch.equal(grad, their_grad)
