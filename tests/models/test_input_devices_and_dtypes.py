"""Inputs on the wrong device or of a dtype the model cannot index with are refused by name, before compute:
a meta tensor given to a CPU model used to return uninitialised logits that changed on every call."""

from __future__ import annotations

import pytest
import torch

import zoo

IDS = torch.tensor([[5, 6, 7]])


@pytest.fixture(scope="module")
def models() -> dict[str, zoo.ZooModel]:
    return {name: zoo.build(name).eval() for name in ("gpt2-tiny", "bert-tiny", "t5-tiny")}


def call(model: zoo.ZooModel, **changes: torch.Tensor) -> object:
    """The model's forward on IDS, with the given arguments replaced."""
    if model.spec.family == "encoder-decoder":
        return model(**{"input_ids": IDS, "decoder_input_ids": IDS, **changes})
    return model(**{"input_ids": IDS, **changes})


@pytest.mark.parametrize("name", ["gpt2-tiny", "bert-tiny", "t5-tiny"])
def test_meta_input_ids_on_a_cpu_model_are_refused_by_name(models, name: str) -> None:
    with pytest.raises(
        ValueError, match=r"forward: input_ids is on meta \(a meta tensor holds no values\) but"
    ):
        call(models[name], input_ids=IDS.to("meta"))


@pytest.mark.parametrize(
    ("name", "argument"),
    [("gpt2-tiny", "attention_mask"), ("bert-tiny", "token_type_ids"), ("t5-tiny", "decoder_input_ids")],
)
def test_every_tensor_argument_must_be_on_the_models_device(models, name: str, argument: str) -> None:
    value = torch.ones_like(IDS) if argument != "decoder_input_ids" else IDS
    with pytest.raises(ValueError, match=rf"{argument} is on meta .* but the model is on cpu"):
        call(models[name], **{argument: value.to("meta")})


def test_decode_refuses_memory_on_another_device(models) -> None:
    model = models["t5-tiny"]
    memory = torch.zeros(1, 3, model.spec.d_model, device="meta")
    with pytest.raises(ValueError, match=r"EncoderDecoderModel\.decode: memory is on meta"):
        model.decode(IDS, memory=memory)


def test_generate_refuses_meta_ids_and_a_meta_model(models) -> None:
    with pytest.raises(ValueError, match="generate: input_ids is on the meta device"):
        models["gpt2-tiny"].generate(IDS.to("meta"), max_new_tokens=2)
    with pytest.raises(ValueError, match="generate: the model is on the meta device"):
        zoo.build("gpt2-tiny", device="meta").generate(IDS, max_new_tokens=2)


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8, torch.int16, torch.uint16, torch.uint64])
def test_ids_of_a_dtype_an_embedding_cannot_index_with_are_refused(models, dtype: torch.dtype) -> None:
    with pytest.raises(
        ValueError, match=rf"input_ids must hold integer token ids, got dtype {dtype}; accepted"
    ):
        call(models["gpt2-tiny"], input_ids=IDS.to(dtype))


def test_int32_ids_are_accepted_and_give_the_int64_logits(models) -> None:
    model = models["gpt2-tiny"]
    assert torch.equal(model(IDS.int()).logits, model(IDS).logits)


def test_labels_must_be_int64(models) -> None:
    with pytest.raises(ValueError, match=r"labels must hold integer class ids, got dtype torch.int32"):
        call(models["gpt2-tiny"], labels=IDS.int())


@pytest.mark.parametrize("dtype", [torch.uint16, torch.uint32, torch.uint64])
def test_masks_of_unsigned_wide_dtypes_are_refused_by_name(models, dtype: torch.dtype) -> None:
    with pytest.raises(ValueError, match=rf"attention_mask must hold integer values.*got dtype {dtype}"):
        call(models["gpt2-tiny"], attention_mask=torch.ones_like(IDS).to(dtype))


@pytest.mark.parametrize("dtype", [torch.uint64, torch.float32])
def test_generate_names_ids_of_a_dtype_it_cannot_read(models, dtype: torch.dtype) -> None:
    with pytest.raises(
        ValueError, match=rf"generate: input_ids must hold integer token ids, got dtype {dtype}"
    ):
        models["gpt2-tiny"].generate(IDS.to(dtype), max_new_tokens=2)


def test_decode_names_out_of_range_position_ids(models) -> None:
    model = models["t5-tiny"]
    memory = torch.zeros(1, 3, model.spec.d_model)
    top = model.spec.max_positions
    with pytest.raises(ValueError, match=rf"decode: position_ids contains {top}, outside \[0, {top}\)"):
        model.decode(IDS, memory=memory, position_ids=torch.tensor([[0, 1, top]]))
    with pytest.raises(ValueError, match=r"decode: position_ids contains -1"):
        model.decode(IDS, memory=memory, position_ids=torch.tensor([[0, 1, -1]]))
