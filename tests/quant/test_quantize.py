"""`zoo.quant.quantize`: which matrices it replaces, how close the logits stay, and what it refuses."""

from __future__ import annotations

import copy
import sys

import pytest
import torch
from quant.quant_support import lively

import zoo
from zoo.quant import (
    INSTALL_HINT,
    QuantizationError,
    TorchaoMissingError,
    is_quantized_tensor,
    quantization_of,
    quantization_targets,
    quantize,
)

pytest.importorskip("torchao")


def _relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want.float()).norm() / want.float().norm())


def _logits(model: zoo.ZooModel, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        if model.spec.family == "encoder-decoder":
            return model(ids, decoder_input_ids=ids).logits
        return model(ids).logits


def test_the_stacks_matrices_and_an_untied_head_are_quantised_and_nothing_else() -> None:
    model = zoo.build("llama-tiny").eval()  # untied LM head
    embedding = model.state_dict()["embed.tokens.weight"].clone()
    quantize(model)
    quantized = {name for name, p in model.named_parameters() if is_quantized_tensor(p)}
    per_layer = ["self_attn.qkv_proj", "self_attn.out_proj", "ffn.up_proj", "ffn.down_proj"]
    expected = {f"decoder.layers.{i}.{m}.weight" for i in range(2) for m in per_layer} | {"lm_head.weight"}
    assert quantized == expected
    assert set(quantization_of(model).tensors) == expected  # type: ignore[union-attr]
    assert torch.equal(model.state_dict()["embed.tokens.weight"], embedding)  # lookups stay float
    assert not any(p.requires_grad for name, p in model.named_parameters() if name in expected)


def test_a_tied_head_stays_tied_to_its_float_embedding() -> None:
    model = quantize(zoo.build("gpt2-tiny").eval())
    assert "lm_head" not in quantization_targets(zoo.build("gpt2-tiny"))
    assert model.lm_head.output_weight is model.embed.tokens.weight
    assert not is_quantized_tensor(model.embed.tokens.weight)


@pytest.mark.parametrize(
    ("name", "weights", "dtype", "bound"),
    [
        ("gpt2-tiny", "int8", torch.float32, 0.015),  # measured 0.003
        ("t5-tiny", "int8", torch.float32, 0.015),  # 0.006
        ("transformer-tiny", "int8", torch.bfloat16, 0.02),  # 0.006
        ("llama-tiny", "int4", torch.bfloat16, 0.12),  # 0.08
    ],
)
def test_quantised_logits_stay_close_to_the_float_models(
    name: str, weights: str, dtype: torch.dtype, bound: float
) -> None:
    spec = zoo.preset(name).override(vocab_size=512) if name == "transformer-tiny" else zoo.preset(name)
    model = lively(zoo.build(spec).eval()).to(dtype)
    ids = torch.randint(3, 512, (2, 9))
    want = _logits(model, ids)
    got = _logits(quantize(copy.deepcopy(model), weights), ids)  # type: ignore[arg-type]
    error = _relative_error(got, want)
    # int8 per row: rounding of 1/254 of each row's range; int4 in groups of 32: 1/15 of each group's
    assert 0 < error < bound, error
    assert got.dtype == dtype


def test_quantised_greedy_decoding_runs_and_mostly_agrees() -> None:
    model = lively(zoo.build("gpt2-tiny").eval())
    prompt = torch.randint(3, 512, (2, 5))
    want = model.generate(prompt, max_new_tokens=12)
    got = quantize(copy.deepcopy(model)).generate(prompt, max_new_tokens=12)
    assert got.shape == want.shape
    assert (got[:, 5:] == want[:, 5:]).float().mean() >= 0.9


def test_quantising_twice_is_refused() -> None:
    model = quantize(zoo.build("gpt2-tiny").eval())
    with pytest.raises(QuantizationError, match=r"already quantised .*int8 weight-only"):
        quantize(model)


def test_a_model_quantised_by_torchao_directly_is_refused() -> None:
    from zoo.quant.library import import_torchao

    model = zoo.build("gpt2-tiny").eval()
    torchao = import_torchao()
    torchao.quantize_(model, torchao.Int8WeightOnlyConfig(set_inductor_config=False))
    with pytest.raises(
        QuantizationError, match=r"decoder\.layers\.0\.self_attn\.qkv_proj\.weight is already"
    ):
        quantize(model)


@pytest.mark.parametrize(
    ("overrides", "weights", "group_size", "message"),
    [
        ({}, "int2", None, "weights must be one of int8, int4, got 'int2'"),
        ({}, "int8", 32, "group_size 32: int8 weights have one scale per output row"),
        ({}, "int4", 48, "group_size 48: int4 takes 32, 64, 128"),
        (
            {"ffn.d_ff": 96},
            "int4",
            64,
            r"decoder.layers.0.ffn.down_proj.weight \[64, 96\]: int4 with group_size 64 needs the input "
            r"features \(96\) to be a multiple of 64",
        ),
        (
            {"ffn.d_ff": 72},
            "int4",
            32,
            r"decoder.layers.0.ffn.up_proj.weight \[72, 64\]: int4's CPU kernel needs the output features "
            r"\(72\) to be a multiple of 16",
        ),
    ],
)
def test_settings_and_shapes_the_kernel_cannot_take_are_refused_by_name(
    overrides: dict, weights: str, group_size: int | None, message: str
) -> None:
    model = zoo.build(zoo.preset("gpt2-tiny").override(**overrides)).eval()
    before = {name: t.clone() for name, t in model.state_dict().items()}
    with pytest.raises(QuantizationError, match=message):
        quantize(model, weights, group_size=group_size)  # type: ignore[arg-type]
    assert quantization_of(model) is None  # refused before anything changed
    assert all(torch.equal(t, before[name]) for name, t in model.state_dict().items())


def test_a_meta_model_is_refused() -> None:
    with pytest.raises(QuantizationError, match="on the meta device: load or initialise the model first"):
        quantize(zoo.build("gpt2-tiny", device="meta"))


def test_without_torchao_quantize_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [name for name in sys.modules if name == "torchao" or name.startswith("torchao.")]:
        monkeypatch.setitem(sys.modules, name, None)  # `import torchao` now fails as if not installed
    monkeypatch.setitem(sys.modules, "torchao", None)
    model = zoo.build("gpt2-tiny").eval()
    with pytest.raises(TorchaoMissingError) as caught:
        quantize(model)
    assert str(caught.value) == INSTALL_HINT and isinstance(caught.value, ImportError)
    assert "pip install -e '.[quant]' in zoo's clone (or: pip install torchao)" in INSTALL_HINT
    assert quantization_of(model) is None


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_int8_runs_on_cuda_as_on_the_cpu() -> None:
    model = lively(zoo.build("llama-tiny").eval())
    ids = torch.randint(3, 512, (2, 9))
    cpu = _logits(quantize(copy.deepcopy(model)), ids)
    cuda = _logits(quantize(copy.deepcopy(model).cuda()), ids.cuda())
    assert quantization_of(model) is None
    torch.testing.assert_close(cuda.cpu(), cpu, atol=1e-3, rtol=1e-3)
    with pytest.raises(QuantizationError, match="int4 runs on torch's CPU kernel"):
        quantize(copy.deepcopy(model).cuda(), "int4")
