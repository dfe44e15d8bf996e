"""Hugging Face folders as files: overwriting a sharded export, indexes that lie, weights of the wrong dtype,
configs asking for more than the weights hold. No transformers needed: zoo.to_hf writes the folders."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

import zoo
import zoo.io.checkpoint.mapped
import zoo.io.hf
from zoo.io.checkpoint import limits
from zoo.io.hf import HFError


def exported(
    tmp_path: Path, preset: str = "gpt2-tiny", *, seed: int = 0, name: str = "hf"
) -> tuple[zoo.ZooModel, Path]:
    """A randomly initialised ``preset`` model and the Hugging Face folder zoo.to_hf wrote for it."""
    torch.manual_seed(seed)
    model = zoo.build(preset)
    return model, zoo.to_hf(model, tmp_path / name)


def shard(folder: Path, parts: int = 3) -> list[str]:
    """Split the folder's model.safetensors into ``parts`` shards plus an index, named as save_pretrained
    names them."""
    tensors = load_file(folder / "model.safetensors")
    names = list(tensors)
    weight_map = {}
    for i in range(parts):
        file = f"model-{i + 1:05d}-of-{parts:05d}.safetensors"
        save_file({n: tensors[n] for n in names[i::parts]}, str(folder / file), metadata={"format": "pt"})
        weight_map |= {n: file for n in names[i::parts]}
    write_index(folder, weight_map)
    (folder / "model.safetensors").unlink()
    return sorted(set(weight_map.values()))


def write_index(folder: Path, weight_map: object) -> Path:
    index = folder / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map}))
    return index


def same_tensors(a: zoo.ZooModel, b: zoo.ZooModel) -> bool:
    state_a, state_b = a.state_dict(), b.state_dict()
    return state_a.keys() == state_b.keys() and all(torch.equal(state_a[k], state_b[k]) for k in state_a)


def edit_config(folder: Path, **changes: object) -> None:
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | changes))


# -- overwriting a sharded checkpoint ---------------------------------------------------------------------


def test_export_over_a_sharded_checkpoint_loads_the_new_weights_and_removes_the_old_shards(
    tmp_path: Path,
) -> None:
    old, folder = exported(tmp_path, seed=0)
    shard(folder)
    (folder / "README.md").write_text("a model card")
    (folder / "notes.safetensors").write_bytes(b"not ours")  # not Hugging Face's shard naming: kept
    new, _ = exported(tmp_path, seed=1)
    zoo.to_hf(new, folder)
    assert same_tensors(zoo.from_hf(folder), new) and not same_tensors(new, old)
    assert sorted(p.name for p in folder.iterdir()) == [
        "README.md",
        "config.json",
        "model.safetensors",
        "notes.safetensors",
    ]


def test_model_safetensors_is_read_before_an_index_as_transformers_does(tmp_path: Path) -> None:
    _, folder = exported(tmp_path, seed=0)
    shard(folder)
    new, newer = exported(tmp_path, seed=1, name="newer")
    (folder / "model.safetensors").write_bytes((newer / "model.safetensors").read_bytes())
    assert same_tensors(zoo.from_hf(folder), new)  # an export killed before it removed the old index


def test_an_export_removes_the_temp_files_of_killed_exports_only(tmp_path: Path) -> None:
    model, folder = exported(tmp_path)
    killed = [
        ".model.safetensors.ab12cd34.tmp",
        ".config.json.x_y_z_12.tmp",
        ".tokenizer_config.json.q1w2e3r4.tmp",
    ]
    foreign = [".notes.md.ab12cd34.tmp", "model.safetensors.tmp"]
    for name in killed + foreign:
        (folder / name).write_bytes(b"half a file")
    zoo.to_hf(model, folder)
    assert sorted(p.name for p in folder.iterdir()) == sorted(["config.json", "model.safetensors", *foreign])


# -- indexes that lie --------------------------------------------------------------------------------------


@pytest.mark.parametrize("weight_map", [["model-00001-of-00001.safetensors"], 3, None, "x"], ids=repr)
def test_an_index_whose_weight_map_is_not_a_mapping_is_named(tmp_path: Path, weight_map: object) -> None:
    _, folder = exported(tmp_path)
    shard(folder, parts=1)
    index = write_index(folder, weight_map)
    with pytest.raises(HFError) as error:
        zoo.from_hf(folder)
    assert str(index) in str(error.value) and "'weight_map' must map tensor names to file names" in str(
        error.value
    )


def test_an_index_that_is_not_a_json_object_is_named(tmp_path: Path) -> None:
    _, folder = exported(tmp_path)
    shard(folder, parts=1)
    (folder / "model.safetensors.index.json").write_text("[1, 2]")
    with pytest.raises(HFError, match=r"model\.safetensors\.index\.json: expected a JSON object"):
        zoo.from_hf(folder)


@pytest.mark.parametrize("where", ["parent", "absolute", "subfolder"])
def test_an_index_naming_a_file_outside_the_folder_is_refused_before_anything_is_opened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    _, folder = exported(tmp_path)
    outside = tmp_path / "outside.safetensors"  # a perfectly good weights file, just not in the folder
    (folder / "model.safetensors").rename(outside)
    (folder / "sub").mkdir()
    (folder / "sub" / "model.safetensors").write_bytes(outside.read_bytes())
    name = {
        "parent": "../outside.safetensors",
        "absolute": str(outside),
        "subfolder": "sub/model.safetensors",
    }
    write_index(folder, {tensor: name[where] for tensor in load_file(outside)})
    opened: list[str] = []

    def recording(real: Callable[..., Any]) -> Callable[..., Any]:
        def read(file: object, *args: Any, **kwargs: Any) -> Any:
            opened.append(str(file))
            return real(file, *args, **kwargs)

        return read

    # the two ways zoo.io.hf opens a weights file: its headers, and the mapping its tensors are read from
    for module, reader in ((zoo.io.hf, "read_header"), (zoo.io.checkpoint.mapped, "safe_open")):
        monkeypatch.setattr(module, reader, recording(getattr(module, reader)))
    with pytest.raises(HFError, match="not a plain file name in this folder"):
        zoo.from_hf(folder)
    assert opened == []


# -- weights of the wrong dtype ----------------------------------------------------------------------------


def retyped(folder: Path, name: str, dtype: torch.dtype) -> None:
    tensors = load_file(folder / "model.safetensors")
    tensors[name] = tensors[name].to(dtype)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})


@pytest.mark.parametrize("name", ["transformer.h.0.attn.c_attn.weight", "transformer.ln_f.bias"])
def test_an_integer_weight_where_a_float_belongs_is_named_before_loading(tmp_path: Path, name: str) -> None:
    _, folder = exported(tmp_path)
    retyped(folder, name, torch.int64)
    for dtype in (None, torch.float32):
        with pytest.raises(HFError) as error:
            zoo.from_hf(folder, dtype=dtype)
        short = name.removeprefix("transformer.")  # the family's table names tensors below the head class
        assert f"{short} is int64: a floating-point weight is expected" in str(error.value)


def test_a_float16_weight_among_float32_ones_is_named_unless_a_dtype_is_asked_for(tmp_path: Path) -> None:
    _, folder = exported(tmp_path)
    retyped(folder, "transformer.ln_f.weight", torch.float16)
    with pytest.raises(HFError) as error:
        zoo.from_hf(folder)
    assert "decoder.final_norm.weight is float16" in str(error.value) and "dtype=" in str(error.value)
    loaded = zoo.from_hf(folder, dtype=torch.float32)
    assert {t.dtype for t in loaded.state_dict().values()} == {torch.float32}


# -- configs asking for more than the weights hold ----------------------------------------------------------


@pytest.mark.parametrize("n_layer", [10**9, 10_000])
def test_a_config_asking_for_more_layers_than_the_weights_hold_is_refused_fast(
    tmp_path: Path, n_layer: int
) -> None:
    _, folder = exported(tmp_path)
    edit_config(folder, n_layer=n_layer)
    start = time.perf_counter()
    for read in (zoo.from_hf, zoo.read_hf_spec):
        with pytest.raises(HFError) as error:
            read(folder)
        assert str(folder / "config.json") in str(error.value) and "num_layers" in str(error.value)
    assert time.perf_counter() - start < 2
    if n_layer == 10_000:  # within the spec's own bounds: refused for what the weights hold
        assert "num_layers 10000 but the checkpoint holds tensors for 2 layers" in str(error.value)


def test_fixed_tables_over_the_allowance_are_refused_before_allocation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, folder = exported(tmp_path, "llama-tiny")
    edit_config(folder, max_position_embeddings=2**16)  # rotary cos and sin: 2 x 2**16 x 16, never stored
    assert zoo.from_hf(folder).decoder.positions.cos.shape == (2**16, 16)
    monkeypatch.setattr(limits, "TABLE_ALLOWANCE", 2**20)
    with pytest.raises(HFError, match="fixed tables for max_positions 65536"):
        zoo.from_hf(folder)
