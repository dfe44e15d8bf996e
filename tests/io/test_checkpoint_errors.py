"""Bad checkpoints: each gives one `CheckpointError` naming the file and the problem, and no model."""

from __future__ import annotations

import json
import pickle
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import zoo
from zoo.io.checkpoint import CheckpointError, CheckpointNotFoundError, limits


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    """A good gpt2-tiny checkpoint directory."""
    zoo.save(zoo.build("gpt2-tiny"), tmp_path / "ckpt")
    return tmp_path / "ckpt"


@pytest.fixture
def sharded(tmp_path: Path) -> Path:
    zoo.save(zoo.build("gpt2-tiny"), tmp_path / "sharded", max_shard_size=100_000)
    return tmp_path / "sharded"


def shards(directory: Path) -> list[str]:
    return sorted(path.name for path in directory.glob("model-*-of-*.safetensors"))


def load_error(path: Path) -> str:
    """The message of the CheckpointError that loading ``path`` raises (and that nothing is returned)."""
    with pytest.raises(CheckpointError) as error:
        zoo.load(path)
    assert "Traceback" not in str(error.value)
    return str(error.value)


def zoo_metadata(spec: dict) -> dict[str, str]:
    return {"format": "zoo", "format_version": "1", "spec": json.dumps(spec)}


def test_truncated_file_is_named_as_truncated(saved: Path) -> None:
    file = saved / "model.safetensors"
    file.write_bytes(file.read_bytes()[:-1000])
    message = load_error(saved)
    assert str(file) in message and "truncated" in message


def test_file_cut_inside_its_header_is_not_read(saved: Path) -> None:
    file = saved / "model.safetensors"
    file.write_bytes(file.read_bytes()[:50])
    message = load_error(file)
    assert str(file) in message and "truncated" in message


def test_header_that_is_not_json_is_reported_as_corrupted(saved: Path) -> None:
    file = saved / "model.safetensors"
    data = bytearray(file.read_bytes())
    data[8:20] = b"#not-json!#!"
    file.write_bytes(bytes(data))
    message = load_error(saved)
    assert str(file) in message and "not valid JSON" in message


def test_header_whose_offsets_do_not_match_the_shapes_is_corrupted(saved: Path) -> None:
    file = saved / "model.safetensors"
    data = file.read_bytes()
    length = int.from_bytes(data[:8], "little")
    header = data[8 : 8 + length].replace(b'"shape":[512,64]', b'"shape":[512,65]', 1)
    file.write_bytes(data[:8] + header + data[8 + length :])
    message = load_error(saved)
    assert str(file) in message and "corrupted" in message and "embed.tokens.weight" in message


@pytest.mark.parametrize(
    "content",
    [b"hello, this is text", pickle.dumps({"weight": [1.0, 2.0]}), b"", b"\x00" * 7],
    ids=["text", "pickle", "empty", "seven-bytes"],
)
def test_a_file_that_is_not_safetensors_is_refused_without_unpickling(tmp_path: Path, content: bytes) -> None:
    file = tmp_path / "model.safetensors"
    file.write_bytes(content)
    message = load_error(file)
    assert str(file) in message and "not a safetensors file" in message


def test_invalid_spec_in_metadata_names_the_file_and_the_field(tmp_path: Path) -> None:
    spec = zoo.preset("gpt2-tiny").model_dump(mode="json")
    spec["attention"]["num_heads"] = 5  # 64 is not divisible by 5
    file = tmp_path / "model.safetensors"
    save_file({"x": torch.zeros(1)}, str(file), metadata=zoo_metadata(spec))
    message = load_error(tmp_path)
    assert str(file) in message and "invalid" in message and "num_heads (5)" in message
    spec["attention"]["num_heads"] = 4
    spec["attention"]["colour"] = "blue"  # an unknown field
    save_file({"x": torch.zeros(1)}, str(file), metadata=zoo_metadata(spec))
    assert "attention.colour" in load_error(tmp_path)


def test_shapes_that_do_not_fit_the_spec_are_named(tmp_path: Path) -> None:
    small = zoo.build("gpt2-tiny", init=True)
    wider = zoo.preset("gpt2-tiny", d_model=128)
    file = tmp_path / "model.safetensors"
    save_file(small.state_dict(), str(file), metadata=zoo_metadata(wider.model_dump(mode="json")))
    message = load_error(tmp_path)
    assert str(file) in message and "do not fit the spec" in message
    assert "shape mismatch: embed.tokens.weight: checkpoint [512, 64], model [512, 128]" in message


def test_a_safetensors_file_without_a_zoo_spec_points_to_from_hf(tmp_path: Path) -> None:
    save_file(
        {"wte.weight": torch.zeros(2, 2)}, str(tmp_path / "model.safetensors"), metadata={"format": "pt"}
    )
    message = load_error(tmp_path)
    assert "not a zoo checkpoint" in message and "from_hf" in message


def test_a_newer_format_version_is_refused(tmp_path: Path) -> None:
    metadata = zoo_metadata(zoo.preset("gpt2-tiny").model_dump(mode="json")) | {"format_version": "2"}
    save_file({"x": torch.zeros(1)}, str(tmp_path / "model.safetensors"), metadata=metadata)
    assert "format_version '2'" in load_error(tmp_path)


def test_missing_shard_is_named(sharded: Path) -> None:
    shard = shards(sharded)[1]
    (sharded / shard).unlink()
    with pytest.raises(CheckpointNotFoundError) as error:
        zoo.load(sharded)
    assert shard in str(error.value) and "missing" in str(error.value)
    assert str(sharded / "model.safetensors.index.json") in str(error.value)


def test_index_that_is_not_json_is_named(sharded: Path) -> None:
    (sharded / "model.safetensors.index.json").write_text("{weight_map: oops")
    assert "model.safetensors.index.json: not a valid index" in load_error(sharded)


def test_index_may_not_point_outside_its_directory(sharded: Path) -> None:
    index_file = sharded / "model.safetensors.index.json"
    index = json.loads(index_file.read_text())
    index["weight_map"]["embed.tokens.weight"] = "../elsewhere.safetensors"
    index_file.write_text(json.dumps(index))
    assert "weight_map" in load_error(sharded)


def test_shards_from_two_different_saves_are_not_mixed(sharded: Path, tmp_path: Path) -> None:
    zoo.save(zoo.build("gpt2-tiny"), tmp_path / "other", max_shard_size=100_000)
    shard = shards(sharded)[2]
    (sharded / shard).write_bytes((tmp_path / "other" / shards(tmp_path / "other")[2]).read_bytes())
    message = load_error(sharded)
    assert shard in message and "another save" in message


def test_a_single_shard_is_not_loaded_as_a_whole_checkpoint(sharded: Path) -> None:
    assert "one shard of a sharded checkpoint" in load_error(sharded / shards(sharded)[0])


def test_directory_without_weights_says_so(tmp_path: Path) -> None:
    (tmp_path / "spec.json").write_text(zoo.preset("gpt2-tiny").to_json())
    (tmp_path / ".model.safetensors.abc123.tmp").write_bytes(b"half a file")  # a crashed save's temp file
    with pytest.raises(CheckpointNotFoundError, match="no weights here") as error:
        zoo.load(tmp_path)
    assert str(tmp_path) in str(error.value)


def test_nonexistent_path_is_a_checkpoint_error_and_a_file_not_found_error(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="no such checkpoint") as error:
        zoo.load(tmp_path / "nope")
    assert isinstance(error.value, FileNotFoundError) and str(tmp_path / "nope") in str(error.value)
    with pytest.raises(CheckpointNotFoundError):
        zoo.load_tokenizer(tmp_path / "nope")


@pytest.mark.parametrize(
    "shard", ["..", "/etc/passwd", "sub/model.safetensors", "", "C:model.safetensors"], ids=repr
)
def test_index_may_name_only_plain_file_names_in_its_directory(sharded: Path, shard: str) -> None:
    index_file = sharded / "model.safetensors.index.json"
    index = json.loads(index_file.read_text())
    index["weight_map"]["embed.tokens.weight"] = shard
    index_file.write_text(json.dumps(index))
    message = load_error(sharded)
    assert (
        str(index_file) in message and "not a plain file name" in message and "embed.tokens.weight" in message
    )


@pytest.mark.parametrize("metadata", ["x", 3, None, ["format", "zoo"]], ids=repr)
def test_index_metadata_that_is_not_an_object_is_named(sharded: Path, metadata: object) -> None:
    index_file = sharded / "model.safetensors.index.json"
    index = json.loads(index_file.read_text())
    index["metadata"] = metadata
    index_file.write_text(json.dumps(index))
    message = load_error(sharded)
    assert str(index_file) in message and "'metadata' must be a JSON object" in message


def test_an_alias_to_a_tensor_the_file_does_not_store_is_named(tmp_path: Path) -> None:
    model = zoo.build(zoo.preset("gpt2-tiny", **{"lm_head.tied": False}))
    state = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}
    metadata = zoo_metadata(model.spec.model_dump(mode="json"))
    metadata["aliases"] = json.dumps({"lm_head.weight": "embed.nowhere.weight"})
    save_file(state, str(tmp_path / "model.safetensors"), metadata=metadata)
    message = load_error(tmp_path)
    assert "'aliases'" in message and "lm_head.weight" in message and "embed.nowhere.weight" in message
    with pytest.raises(CheckpointError, match=r"embed\.nowhere\.weight"):
        zoo.load(tmp_path, strict=False)  # not a silently fresh head either


def tampered(tmp_path: Path, name: str, dtype: torch.dtype) -> Path:
    """gpt2-tiny saved with tensor ``name`` stored as ``dtype``."""
    model = zoo.build("gpt2-tiny")
    state = dict(model.state_dict())
    state[name] = state[name].to(dtype)
    save_file(
        state, str(tmp_path / "model.safetensors"), metadata=zoo_metadata(model.spec.model_dump(mode="json"))
    )
    return tmp_path


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.bool], ids=str)
def test_an_integer_tensor_where_a_float_belongs_is_named_whatever_the_dtype(tmp_path: Path, dtype) -> None:
    path = tampered(tmp_path, "decoder.layers.1.ffn.up_proj.weight", dtype)
    message = load_error(path)
    assert str(path / "model.safetensors") in message and "decoder.layers.1.ffn.up_proj.weight" in message
    assert f"stored as {str(dtype).removeprefix('torch.')}" in message and "floating-point" in message
    with pytest.raises(CheckpointError, match="floating-point"):
        zoo.load(path, dtype=torch.float32)  # a cast does not make integers weights


def test_a_float16_tensor_among_float32_ones_is_named_unless_a_dtype_is_asked_for(tmp_path: Path) -> None:
    path = tampered(tmp_path, "decoder.final_norm.weight", torch.float16)
    message = load_error(path)
    assert "decoder.final_norm.weight is stored as float16" in message and "float32" in message
    assert "dtype=" in message
    loaded = zoo.load(path, dtype=torch.float32)  # one dtype asked for: every tensor cast to it
    assert {t.dtype for t in loaded.state_dict().values()} == {torch.float32}


def hostile(tmp_path: Path, preset: str = "gpt2-tiny", **spec: object) -> Path:
    """A tiny checkpoint of ``preset`` whose metadata spec says ``spec`` (e.g. a billion layers)."""
    model = zoo.build(preset)
    data = model.spec.model_dump(mode="json") | spec
    file = tmp_path / "model.safetensors"
    save_file(model.state_dict(), str(file), metadata=zoo_metadata(data))
    return file


def test_a_spec_asking_for_a_billion_layers_is_refused_fast(tmp_path: Path) -> None:
    file = hostile(tmp_path, num_layers=10**9)
    start = time.perf_counter()
    for strict in (True, False):
        with pytest.raises(CheckpointError) as error:
            zoo.load(tmp_path, strict=strict)
        assert str(file) in str(error.value) and "num_layers" in str(error.value)
    assert time.perf_counter() - start < 2


def test_a_spec_asking_for_more_layers_than_the_file_holds_is_refused_before_building(tmp_path: Path) -> None:
    file = hostile(tmp_path, num_layers=10_000)  # within the spec's own bounds; the file holds 2
    start = time.perf_counter()
    message = load_error(tmp_path)
    assert time.perf_counter() - start < 2
    assert f"{file}: the spec says num_layers 10000 but the file holds tensors for 2 layers" in message


def test_a_spec_wider_than_any_tensor_in_the_file_is_refused_before_building(tmp_path: Path) -> None:
    file = hostile(tmp_path, d_model=2**16)  # a 2**16-wide gpt2-tiny: 10**11 parameters to allocate
    with pytest.raises(CheckpointError) as error:
        zoo.load(tmp_path, strict=False)  # would build the wide model to copy the fitting tensors into
    message = str(error.value)
    assert (
        f"{file}: the spec says d_model 65536 but the largest tensor dimension in the file is 512" in message
    )


def test_fixed_tables_far_beyond_the_file_are_refused_before_allocation(tmp_path: Path) -> None:
    # transformer-tiny: two sinusoid tables of max_positions x 128, computed, not stored (the file: 3M)
    file = hostile(tmp_path, "transformer-tiny", max_positions=2**20)
    start = time.perf_counter()
    message = load_error(tmp_path)
    assert time.perf_counter() - start < 2
    assert str(file) in message and "max_positions 1048576" in message and "TABLE_ALLOWANCE" in message


def test_the_table_allowance_is_read_at_each_load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hostile(tmp_path, "llama-tiny", max_positions=2**16)  # rotary cos and sin: 2 x 2**16 x 16 elements
    assert zoo.load(tmp_path).decoder.positions.cos.shape == (2**16, 16)  # within the default allowance
    monkeypatch.setattr(limits, "TABLE_ALLOWANCE", 2**20)
    message = load_error(tmp_path)
    assert "fixed tables for max_positions 65536: 2,097,152" in message
    assert "ZOO_MAX_TABLE_ELEMENTS=2097152" in message  # how to allow it
    monkeypatch.setenv("ZOO_MAX_TABLE_ELEMENTS", "2097152")  # the variable wins over the module default
    assert zoo.load(tmp_path).decoder.positions.cos.shape == (2**16, 16)
    monkeypatch.setenv("ZOO_MAX_TABLE_ELEMENTS", "1e6")
    assert "fixed tables" in load_error(tmp_path)
