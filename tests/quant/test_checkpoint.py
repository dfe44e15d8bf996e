"""Quantised checkpoints: `zoo.save` writes the int8/int4 parts and the record, `zoo.load` gives the same
tensors back bit for bit, and a file that does not fit its record is refused by name."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from quant.quant_support import lively
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import zoo
from zoo.io.checkpoint import CheckpointError
from zoo.quant import is_quantized_tensor, quantization_of, quantize

pytest.importorskip("torchao")


def _quantised(
    name: str = "llama-tiny", weights: str = "int8", dtype: torch.dtype = torch.float32
) -> zoo.ZooModel:
    return quantize(lively(zoo.build(name).eval()).to(dtype), weights)  # type: ignore[arg-type]


def _metadata(path: Path) -> dict[str, str]:
    with safe_open(str(path), framework="pt") as f:
        return f.metadata()


def _assert_same_weights(loaded: zoo.ZooModel, saved: zoo.ZooModel) -> None:
    theirs = dict(loaded.named_parameters())
    for name, tensor in saved.named_parameters():
        other = theirs[name]
        assert type(other) is type(tensor) and other.dtype == tensor.dtype, name
        if is_quantized_tensor(tensor):
            for part in ("qdata", "scale", "scale_and_zero"):
                if hasattr(tensor, part):
                    assert torch.equal(getattr(other, part), getattr(tensor, part)), f"{name}.{part}"
            assert not other.requires_grad
        else:
            assert torch.equal(other, tensor), name


@pytest.mark.parametrize(
    ("name", "weights", "dtype"),
    [
        ("llama-tiny", "int8", torch.float32),
        ("gpt2-tiny", "int8", torch.bfloat16),
        ("llama-tiny", "int4", torch.bfloat16),
    ],
)
def test_a_quantised_model_loads_back_bit_for_bit(
    tmp_path: Path, name: str, weights: str, dtype: torch.dtype
) -> None:
    model = _quantised(name, weights, dtype)
    zoo.save(model, tmp_path)
    loaded = zoo.load(tmp_path)
    assert quantization_of(loaded) == quantization_of(model)
    _assert_same_weights(loaded, model)
    ids = torch.randint(3, 512, (2, 7))
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)
    assert torch.equal(loaded.generate(ids, max_new_tokens=6), model.generate(ids, max_new_tokens=6))


def test_the_file_holds_plain_parts_and_the_record_in_its_metadata(tmp_path: Path) -> None:
    model = _quantised()
    zoo.save(model, tmp_path)
    stored = load_file(str(tmp_path / "model.safetensors"))
    weight = "decoder.layers.0.ffn.down_proj.weight"
    assert weight not in stored
    assert stored[f"{weight}.qdata"].dtype == torch.int8 and stored[f"{weight}.qdata"].shape == (64, 128)
    assert stored[f"{weight}.scale"].dtype == torch.float32 and stored[f"{weight}.scale"].shape == (64, 1)
    assert stored["embed.tokens.weight"].dtype == torch.float32  # embeddings stay float
    record = json.loads(_metadata(tmp_path / "model.safetensors")["quantization"])
    assert record["weights"] == "int8" and record["group_size"] is None and record["library"] == "torchao"
    assert weight in record["tensors"] and len(record["tensors"]) == 9
    # int8 + a float32 scale per row: a bit over a quarter of the float32 matrices' bytes
    q = model.decoder.layers[0].ffn.down_proj.weight
    assert q.qdata.numel() * 1 + q.scale.numel() * 4 < 0.27 * q.numel() * 4


def test_a_sharded_quantised_checkpoint_loads_back(tmp_path: Path) -> None:
    model = _quantised()
    zoo.save(model, tmp_path, max_shard_size="20kB")
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert index["metadata"]["quantization"]["weights"] == "int8"  # readable in the index
    assert "decoder.layers.1.ffn.up_proj.weight.qdata" in index["weight_map"]
    _assert_same_weights(zoo.load(tmp_path), model)


def test_load_with_a_dtype_keeps_the_integers_and_computes_in_that_dtype(tmp_path: Path) -> None:
    model = _quantised()
    zoo.save(model, tmp_path)
    loaded = zoo.load(tmp_path, dtype=torch.bfloat16)
    weight, saved = loaded.lm_head.weight, model.lm_head.weight
    assert weight.dtype == torch.bfloat16 and torch.equal(weight.qdata, saved.qdata)
    assert torch.equal(weight.scale, saved.scale)  # float32 scales, as torchao keeps them
    assert loaded.embed.tokens.weight.dtype == torch.bfloat16
    with torch.no_grad():
        assert loaded(torch.randint(3, 512, (1, 5))).logits.dtype == torch.bfloat16


def test_the_tokenizer_and_spec_are_saved_as_for_any_model(tmp_path: Path) -> None:
    from zoo.io.tokenizer import train_tokenizer

    tokenizer = train_tokenizer(
        iter(["a cat sat", "a dog sat"] * 4), kind="bpe", vocab_size=30, min_frequency=1
    )
    model = _quantised()
    zoo.save(model, tmp_path, tokenizer=tokenizer)
    assert zoo.read_spec(tmp_path) == model.spec
    assert zoo.load_tokenizer(tmp_path).encode("a cat") == tokenizer.encode("a cat")


def test_saving_a_model_quantised_by_torchao_directly_is_refused(tmp_path: Path) -> None:
    from zoo.quant.library import import_torchao

    model = zoo.build("gpt2-tiny").eval()
    torchao = import_torchao()
    torchao.quantize_(model, torchao.Int8WeightOnlyConfig(set_inductor_config=False))
    with pytest.raises(CheckpointError, match=r"qkv_proj.weight is a quantised tensor .*no record of"):
        zoo.save(model, tmp_path / "out")
    assert not (tmp_path / "out" / "model.safetensors").exists()


def _rewrite(path: Path, edit) -> None:  # type: ignore[no-untyped-def]
    tensors, metadata = load_file(str(path)), _metadata(path)
    edit(tensors, metadata)
    save_file(tensors, str(path), metadata=metadata)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            lambda t, m: t.pop("lm_head.weight.scale"),
            "the int8 weight lm_head.weight has no lm_head.weight.scale in the checkpoint",
        ),
        (
            lambda t, m: t.update({"lm_head.weight.scale": t["lm_head.weight.scale"].half()}),
            r"lm_head.weight.scale must be float32 \[512, 1\] \(found float16 \[512, 1\]\)",
        ),
        (
            lambda t, m: t.update({"lm_head.weight.qdata": t["lm_head.weight.qdata"].float()}),
            r"lm_head.weight.qdata must be a 2-D int8 tensor \(found float32 \[512, 64\]\)",
        ),
        (
            lambda t, m: m.update({"quantization": m["quantization"].replace('"int8"', '"int3"')}),
            "quantization.weights is 'int3'; this zoo reads int8 or int4",
        ),
        (lambda t, m: m.update({"quantization": "{"}), "'quantization' in the metadata: not valid JSON"),
    ],
)
def test_a_file_that_does_not_fit_its_record_is_refused_by_name(tmp_path: Path, edit, message: str) -> None:  # type: ignore[no-untyped-def]
    zoo.save(_quantised(), tmp_path)
    _rewrite(tmp_path / "model.safetensors", edit)
    with pytest.raises(CheckpointError, match=message):
        zoo.load(tmp_path)


def test_a_part_the_model_does_not_have_is_reported_like_any_unexpected_tensor(tmp_path: Path) -> None:
    zoo.save(_quantised(), tmp_path)

    def rename(tensors: dict, metadata: dict) -> None:
        record = json.loads(metadata["quantization"])
        record["tensors"].append("decoder.layers.0.ffn.extra.weight")
        metadata["quantization"] = json.dumps(record)
        tensors["decoder.layers.0.ffn.extra.weight.qdata"] = torch.zeros(16, 64, dtype=torch.int8)
        tensors["decoder.layers.0.ffn.extra.weight.scale"] = torch.ones(16, 1)

    _rewrite(tmp_path / "model.safetensors", rename)
    with pytest.raises(CheckpointError, match=r"not in the model \(1\): decoder.layers.0.ffn.extra.weight"):
        zoo.load(tmp_path)


def test_int4_weights_are_refused_off_the_cpu(tmp_path: Path) -> None:
    zoo.save(_quantised("llama-tiny", "int4", torch.bfloat16), tmp_path)
    if torch.cuda.is_available():
        device = "cuda"
    else:  # the refusal comes before any device is touched: a device that is not there says so first
        pytest.skip("needs a CUDA GPU to ask for")
    with pytest.raises(
        CheckpointError, match="holds int4 weights; int4 weights run on torch's CPU kernel only"
    ):
        zoo.load(tmp_path, device=device)


def test_without_torchao_a_quantised_checkpoint_says_how_to_install_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    zoo.save(_quantised(), tmp_path)
    for name in [name for name in sys.modules if name == "torchao" or name.startswith("torchao.")]:
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(CheckpointError) as caught:
        zoo.load(tmp_path)
    assert str(caught.value) == (
        f"{tmp_path / 'model.safetensors'}: holds int8 weights; weight-only quantisation needs torchao: "
        "pip install -e '.[quant]' in zoo's clone (or: pip install torchao)"
    )
    assert zoo.read_spec(tmp_path).family == "decoder"  # the headers still read without it


def test_a_float_checkpoint_is_untouched_by_all_this(tmp_path: Path) -> None:
    model = lively(zoo.build("llama-tiny").eval())
    zoo.save(model, tmp_path)
    assert "quantization" not in _metadata(tmp_path / "model.safetensors")
    loaded = zoo.load(tmp_path)
    assert quantization_of(loaded) is None
    assert all(torch.equal(t, model.state_dict()[n]) for n, t in loaded.state_dict().items())
