"""zoo's checkpoint format: bit-exact round trips, ties, sharding, dtype casts, strictness, atomic overwrites."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from support import TINY_PRESETS

import zoo
from zoo.io import checkpoint
from zoo.io.checkpoint import CheckpointError, LoadReport, parse_size
from zoo.io.checkpoint.loading import _read_tensors
from zoo.io.tokenizer import train_tokenizer


def randomized(name: str, **overrides: object) -> zoo.ZooModel:
    """A tiny model whose every tensor (norms, biases, final_logits_bias too) holds distinct random values."""
    model = zoo.build(zoo.preset(name, **overrides))
    with torch.no_grad():
        for tensor in model.state_dict().values():
            tensor.normal_(0.0, 0.05)
    return model.eval()


def logits(model: zoo.ZooModel) -> torch.Tensor:
    ids = torch.arange(3, 17).view(2, 7) % model.spec.vocab_size
    if model.spec.family == "encoder-decoder":
        return model(ids, decoder_input_ids=ids[:, :5]).logits
    return model(ids).logits


def assert_same_tensors(a: zoo.ZooModel, b: zoo.ZooModel) -> None:
    state_a, state_b = a.state_dict(), b.state_dict()
    assert state_a.keys() == state_b.keys()
    for name, tensor in state_a.items():
        assert tensor.dtype == state_b[name].dtype, name
        assert torch.equal(tensor, state_b[name]), name


def file_keys(path: Path) -> set[str]:
    with safe_open(str(path), framework="pt") as f:
        return set(f.keys())


@pytest.mark.parametrize("name", TINY_PRESETS)
def test_save_then_load_is_bit_exact_for_every_family(name: str, tmp_path: Path) -> None:
    model = randomized(name)
    zoo.save(model, tmp_path / "ckpt")
    loaded = zoo.load(tmp_path / "ckpt")
    assert type(loaded) is type(model) and loaded.spec == model.spec
    assert_same_tensors(model, loaded)
    assert not loaded.training and all(p.requires_grad for p in loaded.parameters())
    with torch.no_grad():
        assert torch.equal(logits(model), logits(loaded))


def test_spec_json_and_metadata_hold_the_same_spec(tmp_path: Path) -> None:
    model = randomized("t5-tiny")
    zoo.save(model, tmp_path)
    with safe_open(str(tmp_path / "model.safetensors"), framework="pt") as f:
        metadata = f.metadata()
    assert metadata["format"] == "zoo" and metadata["format_version"] == "1"
    on_disk = json.loads((tmp_path / "spec.json").read_text())
    assert on_disk == json.loads(metadata["spec"]) == model.spec.model_dump(mode="json")
    assert zoo.parse_spec(on_disk) == model.spec
    assert checkpoint.read_spec(tmp_path) == model.spec


def test_load_accepts_the_safetensors_file_itself(tmp_path: Path) -> None:
    model = randomized("bart-tiny")
    zoo.save(model, tmp_path)
    (tmp_path / "spec.json").unlink()  # the file's metadata alone is enough
    assert_same_tensors(model, zoo.load(tmp_path / "model.safetensors"))


def test_tied_output_is_stored_once_and_tied_again_after_load(tmp_path: Path) -> None:
    model = randomized("gpt2-tiny")
    zoo.save(model, tmp_path)
    assert "lm_head.weight" not in file_keys(tmp_path / "model.safetensors")
    loaded = zoo.load(tmp_path)
    with torch.no_grad():
        loaded.embed.tokens.weight[5] = 0.0  # token 5's output logit reads the embedding row
        out = logits(loaded)
    assert torch.all(out[..., 5] == 0) and torch.all(out[..., 6] != 0)


def test_weights_tied_by_hand_are_stored_once_and_stay_one_parameter(tmp_path: Path) -> None:
    model = randomized("gpt2-tiny", **{"lm_head.tied": False})
    model.lm_head.weight = model.embed.tokens.weight  # both names now in the state dict, one tensor
    zoo.save(model, tmp_path)
    assert "lm_head.weight" not in file_keys(tmp_path / "model.safetensors")
    loaded = zoo.load(tmp_path)
    assert loaded.lm_head.weight is loaded.embed.tokens.weight
    assert_same_tensors(model, loaded)


def test_sharded_save_round_trips_and_every_shard_carries_the_spec(tmp_path: Path) -> None:
    model = randomized("llama-tiny")
    zoo.save(model, tmp_path, max_shard_size=150_000)  # ~560 kB of float32 -> several shards
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    shards = sorted({*index["weight_map"].values()})
    tag = index["metadata"]["checkpoint_id"][:8]  # this save's own: no save overwrites a shard in use
    assert len(shards) > 2 and shards[0] == f"model-00001-of-{len(shards):05d}-{tag}.safetensors"
    assert not (tmp_path / "model.safetensors").exists()
    assert index["weight_map"].keys() == model.state_dict().keys()
    assert index["metadata"]["spec"] == model.spec.model_dump(mode="json")
    assert index["metadata"]["total_size"] == 4 * model.num_parameters()
    for shard in shards:
        with safe_open(str(tmp_path / shard), framework="pt") as f:
            assert zoo.parse_spec(json.loads(f.metadata()["spec"])) == model.spec
            assert f.metadata()["checkpoint_id"] == index["metadata"]["checkpoint_id"]
    for path in (tmp_path, tmp_path / "model.safetensors.index.json"):
        loaded = zoo.load(path)
        assert_same_tensors(model, loaded)
    with torch.no_grad():
        assert torch.equal(logits(model), logits(loaded))


def test_load_in_bfloat16_casts_weights_and_keeps_fixed_tables_float32(tmp_path: Path) -> None:
    for name in ("llama-tiny", "transformer-tiny"):
        model = randomized(name)
        zoo.save(model, tmp_path / name)
        loaded = zoo.load(tmp_path / name, dtype=torch.bfloat16)
        for key, tensor in loaded.state_dict().items():
            assert tensor.dtype == torch.bfloat16 and torch.equal(tensor, model.state_dict()[key].bfloat16())
        tables = dict(loaded.named_buffers())
        assert tables and all(t.dtype == torch.float32 and t.device.type == "cpu" for t in tables.values())
        for key, table in model.named_buffers():
            assert torch.equal(tables[key], table), key  # recomputed, not left as meta or empty
        with torch.no_grad():
            assert torch.isfinite(logits(loaded).float()).all()


def test_bfloat16_model_saves_as_bfloat16_and_loads_as_saved(tmp_path: Path) -> None:
    model = randomized("bart-tiny").to(torch.bfloat16)
    zoo.save(model, tmp_path)
    loaded = zoo.load(tmp_path)
    assert loaded.lm_head.final_logits_bias.dtype == torch.bfloat16
    assert_same_tensors(model, loaded)


def test_casting_to_a_dtype_keeps_integer_and_bool_tensors(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    from zoo.io.checkpoint import open_checkpoint

    tensors = {"f": torch.randn(3), "i": torch.arange(3), "b": torch.tensor([True, False])}
    save_file(tensors, str(tmp_path / "model.safetensors"), metadata={"format": "zoo", "format_version": "1",
              "spec": zoo.preset("gpt2-tiny").to_json()})  # fmt: skip
    read = dict(_read_tensors(open_checkpoint(tmp_path), ["f", "i", "b"],
                device=torch.device("cpu"), dtype=torch.float16))  # fmt: skip
    assert (read["f"].dtype, read["i"].dtype, read["b"].dtype) == (torch.float16, torch.int64, torch.bool)
    assert torch.equal(read["i"], tensors["i"]) and torch.equal(read["b"], tensors["b"])


def test_strict_load_names_every_missing_unexpected_and_misshapen_tensor_at_once(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    model = randomized("gpt2-tiny")
    state = dict(model.state_dict())
    del state["decoder.final_norm.weight"]
    state["decoder.layers.0.extra"] = torch.zeros(2)
    state["decoder.positions.weight"] = torch.zeros(3, model.spec.d_model)
    metadata = {"format": "zoo", "format_version": "1", "spec": model.spec.to_json()}
    save_file(state, str(tmp_path / "model.safetensors"), metadata=metadata)
    with pytest.raises(CheckpointError) as error:
        zoo.load(tmp_path)
    message = str(error.value)
    assert str(tmp_path / "model.safetensors") in message
    assert "decoder.final_norm.weight" in message and "decoder.layers.0.extra" in message
    assert "decoder.positions.weight: checkpoint [3, 64], model [128, 64]" in message

    loaded, report = zoo.load(tmp_path, strict=False, return_report=True)
    assert report == LoadReport(
        missing=("decoder.final_norm.weight",),
        unexpected=("decoder.layers.0.extra",),
        mismatched=(("decoder.positions.weight", (3, 64), (128, 64)),),
    )
    assert not report.ok
    kept = loaded.state_dict()
    assert torch.equal(
        kept["decoder.layers.1.ffn.up_proj.weight"], state["decoder.layers.1.ffn.up_proj.weight"]
    )
    assert torch.equal(kept["decoder.final_norm.weight"], torch.ones(model.spec.d_model))  # fresh init
    assert kept["decoder.positions.weight"].shape == (128, 64) and kept["decoder.positions.weight"].std() > 0
    with torch.no_grad():
        assert torch.isfinite(logits(loaded)).all()


def test_non_strict_load_of_a_complete_checkpoint_reports_nothing(tmp_path: Path) -> None:
    model = randomized("t5-tiny")
    zoo.save(model, tmp_path)
    loaded, report = zoo.load(tmp_path, strict=False, return_report=True)
    assert report.ok and report == LoadReport()
    assert_same_tensors(model, loaded)


def test_tokenizer_is_saved_beside_the_weights_and_loads_back(tmp_path: Path) -> None:
    texts = ["the cat sat on the mat", "a dog sat on a log", "the dog and the cat"] * 5
    tokenizer = train_tokenizer(iter(texts), kind="bpe", vocab_size=60, min_frequency=1)
    zoo.save(randomized("gpt2-tiny"), tmp_path / "with", tokenizer=tokenizer)
    loaded = zoo.load_tokenizer(tmp_path / "with")
    assert loaded.encode("the cat sat") == tokenizer.encode("the cat sat")
    assert zoo.load_tokenizer(tmp_path / "with" / "model.safetensors").vocab_size == tokenizer.vocab_size

    zoo.save(randomized("gpt2-tiny"), tmp_path / "without")
    with pytest.raises(CheckpointError, match=r"without: no tokenizer\.json") as error:
        zoo.load_tokenizer(tmp_path / "without")
    assert isinstance(error.value, FileNotFoundError)


def test_max_shard_size_reads_units_and_rejects_nonsense() -> None:
    assert parse_size("2GB") == 2_000_000_000
    assert parse_size("500MB") == parse_size(500_000_000) == 500_000_000
    assert parse_size("1GiB") == 2**30 and parse_size("1.5kb") == 1500
    for bad in ("2 parsecs", "-5MB", 0, "GB"):
        with pytest.raises(ValueError, match="max_shard_size"):
            parse_size(bad)


def test_save_refuses_a_file_path_and_a_meta_model(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="writes a directory"):
        zoo.save(randomized("gpt2-tiny"), tmp_path / "model.safetensors")
    with pytest.raises(CheckpointError, match="meta device"):
        zoo.save(zoo.build("gpt2-tiny", device="meta"), tmp_path / "meta")
    assert not (tmp_path / "meta").exists()
