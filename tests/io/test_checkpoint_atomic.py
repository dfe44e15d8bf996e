"""Atomic saves: a save that fails partway never destroys the checkpoint it was replacing."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import zoo
from zoo.io.checkpoint import CheckpointError, saving

SHARD = 100_000  # bytes: gpt2-tiny (432 kB) -> 5 shards; the 3-layer variant -> 6


def model(num_layers: int = 2) -> zoo.ZooModel:
    return zoo.build(zoo.preset("gpt2-tiny", num_layers=num_layers))


def assert_loads_as(path: Path, expected: zoo.ZooModel) -> None:
    loaded = zoo.load(path)
    assert loaded.spec == expected.spec
    state = expected.state_dict()
    assert loaded.state_dict().keys() == state.keys()
    assert all(torch.equal(tensor, state[name]) for name, tensor in loaded.state_dict().items())
    assert json.loads((path / "spec.json").read_text()) == expected.spec.model_dump(mode="json")


def visible(directory: Path) -> list[str]:
    return sorted(path.name for path in directory.iterdir())


def failing_writer(fail_on_call: int, exception: BaseException) -> Callable[[dict, str, dict], None]:
    """A safetensors writer that writes half of a file on call ``fail_on_call`` (1-based) and then raises."""
    calls = []

    def write(tensors: dict, filename: str, metadata: dict) -> None:
        calls.append(filename)
        save_file(tensors, filename, metadata=metadata)
        if len(calls) == fail_on_call:
            data = Path(filename).read_bytes()
            Path(filename).write_bytes(data[: len(data) // 2])
            raise exception

    return write


@pytest.mark.parametrize("max_shard_size", ["2GB", SHARD], ids=["single", "sharded"])
@pytest.mark.parametrize("exception", [OSError("disk full"), KeyboardInterrupt()], ids=["error", "interrupt"])
def test_failed_overwrite_leaves_the_old_checkpoint_bit_exact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, max_shard_size: int | str, exception: BaseException
) -> None:
    old = model()
    zoo.save(old, tmp_path, max_shard_size=max_shard_size)
    before = visible(tmp_path)
    monkeypatch.setattr(saving, "save_file", failing_writer(2 if max_shard_size == SHARD else 1, exception))
    with pytest.raises(type(exception)):
        zoo.save(model(num_layers=3), tmp_path, max_shard_size=max_shard_size)
    assert visible(tmp_path) == before  # no temp file left behind either
    assert_loads_as(tmp_path, old)


def test_failure_before_the_index_keeps_the_old_shards_and_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = model()
    zoo.save(old, tmp_path, max_shard_size=SHARD)
    real = saving.write_text_atomic

    def no_index(final: Path, text: str) -> None:
        if final.name.endswith(".index.json"):
            raise OSError("disk full")
        real(final, text)

    monkeypatch.setattr(saving, "write_text_atomic", no_index)
    new = model(num_layers=3)  # more shards: the new shard names differ from the old ones
    with pytest.raises(OSError, match="disk full"):
        zoo.save(new, tmp_path, max_shard_size=SHARD)
    assert_loads_as(tmp_path, old)  # the old index still names the old shards, untouched

    monkeypatch.setattr(saving, "write_text_atomic", real)
    zoo.save(new, tmp_path, max_shard_size=SHARD)
    assert_loads_as(tmp_path, new)
    assert [name for name in visible(tmp_path) if "-of-00005" in name] == []  # stale shards removed


def test_shards_replaced_without_their_index_are_refused_not_mixed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    zoo.save(model(), tmp_path, max_shard_size=SHARD)

    def fail(final: Path, text: str) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(saving, "write_text_atomic", fail)
    with pytest.raises(OSError):
        zoo.save(model(), tmp_path, max_shard_size=SHARD)  # same shard names, new tensors, old index
    with pytest.raises(CheckpointError, match="another save"):
        zoo.load(tmp_path)


def test_a_crashed_saves_temp_file_is_ignored(tmp_path: Path) -> None:
    old = model()
    zoo.save(old, tmp_path)
    (tmp_path / ".model.safetensors.k3j4.tmp").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{")
    assert_loads_as(tmp_path, old)


def test_switching_between_single_file_and_shards_leaves_no_stale_files(tmp_path: Path) -> None:
    first, second, third = model(), model(num_layers=3), model()
    zoo.save(first, tmp_path, max_shard_size=SHARD)
    assert len([name for name in visible(tmp_path) if name.startswith("model-")]) == 5
    zoo.save(second, tmp_path)
    assert visible(tmp_path) == ["model.safetensors", "spec.json"]
    assert_loads_as(tmp_path, second)
    zoo.save(third, tmp_path, max_shard_size=SHARD)
    assert "model.safetensors" not in visible(tmp_path)
    assert [name for name in visible(tmp_path) if name.startswith("model-")] == [
        f"model-{i:05d}-of-00005.safetensors" for i in range(1, 6)
    ]
    assert_loads_as(tmp_path, third)
