"""Every JSON file zoo opens goes through one bounded reader (`zoo.io.jsonfile`): nesting, size, long
integers and non-finite numbers are refused with one error naming the file, never a RecursionError, a bare
ValueError, an OverflowError or gigabytes of memory."""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path

import pytest
import torch

import zoo
from zoo.io.checkpoint import CheckpointError
from zoo.io.hf import HFError
from zoo.io.jsonfile import JSON_BYTES, JSONLimitError, nesting_exceeds, parse_json, read_json_object

DEEP = "[" * 50_000 + "]" * 50_000  # past Python's recursion limit: json.loads raises RecursionError


def write_safetensors(path: Path, header: bytes, data: bytes = b"") -> Path:
    """A safetensors file with exactly this JSON header (8-byte length, header, data)."""
    path.write_bytes(struct.pack("<Q", len(header)) + header + data)
    return path


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    zoo.save(zoo.build("gpt2-tiny"), tmp_path / "ckpt")
    return tmp_path / "ckpt"


@pytest.fixture
def hf_folder(tmp_path: Path) -> Path:
    return zoo.to_hf(zoo.build("gpt2-tiny"), tmp_path / "hf")


def edit_config(folder: Path, text: str) -> Path:
    (folder / "config.json").write_text(text)
    return folder / "config.json"


# -- the reader itself -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "deep"),
    [
        ('{"a": [[[1]]]}', False),
        ('{"a": "' + "[" * 500 + '"}', False),  # brackets inside a string do not nest
        ('["\\"' + "[" * 500 + '"]', False),  # an escaped quote does not end the string
        ('["\\\\", ' + "[" * 200 + "]" * 200 + "]", True),  # an escaped backslash does end it
        ("[" * 101 + "]" * 101, True),
        ("[" * 100 + "]" * 100, False),
        ("[]" * 10_000, False),  # many brackets, shallow
    ],
)
def test_nesting_is_measured_outside_strings(text: str, deep: bool) -> None:
    assert nesting_exceeds(text.encode(), 100) is deep


def test_deep_nesting_is_refused_before_json_parses_it() -> None:
    with pytest.raises(JSONLimitError, match=r"^x\.json: JSON nested more than 100 levels deep"):
        parse_json(DEEP, where="x.json")


def test_an_integer_of_more_than_4300_digits_is_refused_naming_the_file() -> None:
    with pytest.raises(JSONLimitError, match=r"^x\.json: holds an integer of more than 4,300 digits"):
        parse_json('{"n": ' + "1" * 5000 + "}", where="x.json")


@pytest.mark.parametrize(
    ("text", "key", "shown"),
    [
        ('{"layer_norm_epsilon": Infinity}', "layer_norm_epsilon", "Infinity"),
        ('{"a": {"b": [1, NaN]}}', r"a\.b\[1\]", "NaN"),
        ('{"std": -1e999}', "std", "-1e999"),
    ],
)
def test_non_finite_numbers_are_refused_naming_the_key(text: str, key: str, shown: str) -> None:
    with pytest.raises(ValueError, match=rf"^x\.json: {key}: {shown} is not a finite number"):
        parse_json(text, where="x.json")


def test_a_file_over_the_limit_is_refused_without_reading_it(tmp_path: Path) -> None:
    big = tmp_path / "config.json"
    with big.open("wb") as file:  # 1 GiB, sparse: reading it whole would take the memory
        file.truncate(2**30)
    start = time.perf_counter()
    with pytest.raises(JSONLimitError, match=rf"{big}: larger than the limit of 64 MiB.*{JSON_BYTES.env}"):
        read_json_object(big)
    assert time.perf_counter() - start < 5


def test_the_size_limit_is_raised_with_its_environment_variable(tmp_path, monkeypatch) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"pad": "x" * 2000}))
    monkeypatch.setenv("ZOO_MAX_JSON_BYTES", "1000")
    with pytest.raises(JSONLimitError, match="ZOO_MAX_JSON_BYTES"):
        read_json_object(path)
    monkeypatch.setenv("ZOO_MAX_JSON_BYTES", "10000")
    assert read_json_object(path)["pad"] == "x" * 2000


@pytest.mark.slow
def test_the_depth_scan_of_a_100_mb_document_takes_seconds_not_minutes() -> None:
    record = b'{"name": "layers.0.weight [x]", "shape": [1, 2, 3], "data_offsets": [0, 24]},'
    text = b"[" + record * (100_000_000 // len(record)) + b"{}]"
    start = time.perf_counter()
    assert not nesting_exceeds(text, 100)
    assert time.perf_counter() - start < 10  # about 1 s on one core


# -- every place a JSON file is opened ------------------------------------------------------------------------


def test_load_refuses_a_deeply_nested_safetensors_header(tmp_path: Path) -> None:
    file = write_safetensors(tmp_path / "model.safetensors", DEEP.encode())
    for read in (zoo.load, zoo.read_spec):
        with pytest.raises(CheckpointError, match=f"{file}: corrupted safetensors header: JSON nested"):
            read(file)


def test_load_refuses_a_deeply_nested_index(saved: Path) -> None:
    index = saved / "model.safetensors.index.json"
    index.write_text(DEEP)
    with pytest.raises(
        CheckpointError, match=f"{index}: not a valid index: JSON nested more than 100 levels"
    ):
        zoo.load(saved)


def test_load_refuses_an_oversized_index_without_reading_it(saved: Path) -> None:
    index = saved / "model.safetensors.index.json"
    with index.open("wb") as file:
        file.truncate(2**30)  # sparse: 1 GiB of zeros, which json would otherwise hold several times over
    with pytest.raises(CheckpointError, match=f"{index}: larger than the limit of 64 MiB"):
        zoo.load(saved)


def test_load_refuses_a_deeply_nested_spec_in_the_metadata(tmp_path: Path) -> None:
    metadata = {"format": "zoo", "format_version": "1", "spec": DEEP}
    file = write_safetensors(tmp_path / "model.safetensors", json.dumps({"__metadata__": metadata}).encode())
    with pytest.raises(CheckpointError, match=f"{file}: the spec in the metadata: JSON nested"):
        zoo.load(file)


def test_a_huge_integer_in_a_header_names_the_file(tmp_path: Path) -> None:
    header = '{"w": {"dtype": "F32", "shape": [' + "9" * 5000 + '], "data_offsets": [0, 4]}}'
    file = write_safetensors(tmp_path / "model.safetensors", header.encode(), b"\0" * 4)
    with pytest.raises(CheckpointError, match=f"{file}: corrupted safetensors header: holds an integer"):
        zoo.load(file)


@pytest.mark.parametrize("shape", ["[Infinity]", "[1e999]", "[2.0]", "[true]", '["2"]', "[-1]", "7"])
def test_a_shape_that_is_not_a_list_of_sizes_names_the_file_and_tensor(tmp_path: Path, shape: str) -> None:
    header = '{"w": {"dtype": "F32", "shape": ' + shape + ', "data_offsets": [0, 8]}}'
    file = write_safetensors(tmp_path / "model.safetensors", header.encode(), b"\0" * 8)
    with pytest.raises(CheckpointError, match=f"{file}: corrupted safetensors header: .*"):
        zoo.load(file)


def test_a_huge_shape_is_refused_without_multiplying_it_out(tmp_path: Path) -> None:
    dims = ", ".join([str(2**63)] * 20_000)  # the product alone would be a 380,000-digit number
    header = '{"w": {"dtype": "F32", "shape": [' + dims + '], "data_offsets": [0, 8]}}'
    file = write_safetensors(tmp_path / "model.safetensors", header.encode(), b"\0" * 8)
    start = time.perf_counter()
    with pytest.raises(CheckpointError, match="needs more than the file's"):
        zoo.load(file)
    assert time.perf_counter() - start < 2


def test_from_hf_refuses_a_deeply_nested_config(hf_folder: Path) -> None:
    config = edit_config(hf_folder, '{"model_type": "gpt2", "x": ' + DEEP + "}")
    for read in (zoo.from_hf, zoo.read_hf_spec):
        with pytest.raises(HFError, match=f"{config}: JSON nested more than 100 levels"):
            read(hf_folder)


def test_from_hf_refuses_an_oversized_config_naming_the_variable(hf_folder: Path) -> None:
    with (hf_folder / "config.json").open("wb") as file:
        file.truncate(2**30)
    with pytest.raises(
        HFError, match=r"larger than the limit of 64 MiB for this JSON file.*ZOO_MAX_JSON_BYTES"
    ):
        zoo.from_hf(hf_folder)


def test_from_hf_refuses_a_deeply_nested_index(hf_folder: Path) -> None:
    (hf_folder / "model.safetensors").unlink()
    index = hf_folder / "model.safetensors.index.json"
    index.write_text(DEEP)
    with pytest.raises(HFError, match=f"{index}: JSON nested"):
        zoo.from_hf(hf_folder)


def test_from_hf_names_an_infinite_layer_norm_epsilon(hf_folder: Path) -> None:
    config = json.loads((hf_folder / "config.json").read_text())
    edit_config(hf_folder, json.dumps(config | {"layer_norm_epsilon": float("inf")}))  # writes Infinity
    with pytest.raises(HFError, match="layer_norm_epsilon: Infinity is not a finite number"):
        zoo.from_hf(hf_folder)


@pytest.mark.parametrize("model_type", [["gpt2"], {"name": "gpt2"}, 7])
def test_a_model_type_that_is_not_a_string_is_named(hf_folder: Path, model_type: object) -> None:
    config = json.loads((hf_folder / "config.json").read_text())
    edit_config(hf_folder, json.dumps(config | {"model_type": model_type}))
    with pytest.raises(HFError, match=r"config\.json: model_type must be a string naming the family"):
        zoo.from_hf(hf_folder)


def test_show_prints_one_line_for_a_deeply_nested_header(tmp_path: Path, capsys) -> None:
    from zoo.cli import main

    file = write_safetensors(tmp_path / "model.safetensors", DEEP.encode())
    assert main(["show", str(file)]) == 2
    err = capsys.readouterr().err
    assert "JSON nested more than 100 levels" in err and "Traceback" not in err


def test_a_real_checkpoint_still_loads(saved: Path) -> None:
    model = zoo.load(saved)
    assert isinstance(model, torch.nn.Module)
