"""Atomic saves: a save that fails partway never destroys the checkpoint it was replacing."""

from __future__ import annotations

import itertools
import json
import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import zoo
from zoo.io.checkpoint import saving

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


def test_a_failed_index_write_with_the_same_shard_count_keeps_the_old_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = model()
    zoo.save(old, tmp_path, max_shard_size=SHARD)

    def fail(final: Path, text: str) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(saving, "write_text_atomic", fail)
    with pytest.raises(OSError):
        zoo.save(model(), tmp_path, max_shard_size=SHARD)  # as many shards as the old one: new names anyway
    assert_loads_as(tmp_path, old)  # the old index still names the old shards, untouched


def test_a_crashed_saves_temp_file_is_ignored(tmp_path: Path) -> None:
    old = model()
    zoo.save(old, tmp_path)
    (tmp_path / ".model.safetensors.k3j4.tmp").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{")
    assert_loads_as(tmp_path, old)


def test_switching_between_single_file_and_shards_leaves_no_stale_files(tmp_path: Path) -> None:
    first, second, third, fourth = model(), model(num_layers=3), model(), model()
    zoo.save(first, tmp_path, max_shard_size=SHARD)
    assert len([name for name in visible(tmp_path) if name.startswith("model-")]) == 5
    zoo.save(second, tmp_path)
    assert visible(tmp_path) == ["model.safetensors", "spec.json"]
    assert_loads_as(tmp_path, second)
    zoo.save(third, tmp_path, max_shard_size=SHARD)
    assert "model.safetensors" not in visible(tmp_path)
    assert [name for name in visible(tmp_path) if name.startswith("model-")] == shard_files(tmp_path)
    assert len(shard_files(tmp_path)) == 5
    assert_loads_as(tmp_path, third)
    zoo.save(fourth, tmp_path, max_shard_size=SHARD)  # sharded over sharded: the old shards go
    assert [name for name in visible(tmp_path) if name.startswith("model-")] == shard_files(tmp_path)
    assert_loads_as(tmp_path, fourth)


def shard_files(directory: Path) -> list[str]:
    """The shards the index names, sorted."""
    index = json.loads((directory / "model.safetensors.index.json").read_text())
    return sorted(set(index["weight_map"].values()))


# -- a crash at every step ----------------------------------------------------------------------------------


class Crash(BaseException):
    """A stand-in for kill -9: raised instead of the k-th change to the folder and every change after it,
    so nothing after the crash point happens (not even a cleanup handler's unlink)."""


@contextmanager
def crash_at(step: int) -> Iterator[None]:
    """Make the ``step``-th (1-based) os.replace / os.unlink of this process, and all later ones, crash."""
    real = {"replace": os.replace, "unlink": os.unlink}
    calls = 0

    def guarded(name: str) -> Callable[..., None]:
        def op(*args: object, **kwargs: object) -> None:
            nonlocal calls
            calls += 1
            if calls >= step:
                raise Crash(f"crashed before {name}{args}")
            real[name](*args, **kwargs)

        return op

    with pytest.MonkeyPatch.context() as patch:
        for name in real:
            patch.setattr(os, name, guarded(name))
        yield


def identify(path: Path, candidates: dict[str, zoo.ZooModel]) -> str:
    """Which of ``candidates`` the checkpoint at ``path`` loads as, tensor for tensor (raises if none)."""
    loaded = zoo.load(path).state_dict()
    for label, candidate in candidates.items():
        state = candidate.state_dict()
        if loaded.keys() == state.keys() and all(torch.equal(loaded[k], state[k]) for k in state):
            return label
    raise AssertionError(f"{path} loads as neither {' nor '.join(candidates)}")


def states_over_every_crash_point(
    tmp_path: Path, old_dir: Path, new: zoo.ZooModel, candidates: dict[str, zoo.ZooModel], save: Callable
) -> list[str]:
    """Copy ``old_dir``, crash ``save(new, copy)`` at step 1, 2, ... until a save completes; after each,
    which candidate the copy loads as."""
    states = []
    for step in itertools.count(1):
        target = tmp_path / f"crash-{step}"
        shutil.copytree(old_dir, target)
        try:
            with crash_at(step):
                save(new, target)
        except Crash:
            states.append(identify(target, candidates))
        else:
            states.append(identify(target, candidates) + " (complete)")
            return states
    raise AssertionError("unreachable")


FEW = 160_000  # bytes: 3 shards for 2 layers, 4 for 3: every step of a sharded save, fewer steps
TRANSITIONS = {  # (old: layers, max_shard_size) -> (new: layers, max_shard_size)
    "sharded-to-sharded": ((2, FEW), (3, FEW)),
    "sharded-to-same-count": ((2, FEW), (2, FEW)),  # the shard names of the old save, before tagging
    "single-to-sharded": ((2, "2GB"), (3, FEW)),
    "sharded-to-single": ((3, FEW), (2, "2GB")),
    "single-to-single": ((2, "2GB"), (3, "2GB")),
}


@pytest.mark.parametrize("transition", TRANSITIONS)
def test_a_crash_at_any_step_of_an_overwrite_loads_as_the_old_or_the_new_checkpoint(
    tmp_path: Path, transition: str
) -> None:
    (old_layers, old_size), (new_layers, new_size) = TRANSITIONS[transition]
    torch.manual_seed(1)
    old, new = model(old_layers), model(new_layers)
    zoo.save(old, tmp_path / "old", max_shard_size=old_size)

    def save(m: zoo.ZooModel, path: Path) -> None:
        zoo.save(m, path, max_shard_size=new_size)

    states = states_over_every_crash_point(tmp_path, tmp_path / "old", new, {"old": old, "new": new}, save)
    committed = states.index("new") if "new" in states else len(states) - 1
    # old until one step (the commit), new from then on: never neither, never back
    assert states == ["old"] * committed + ["new"] * (len(states) - 1 - committed) + ["new (complete)"]
    assert committed >= 1

    # A save into any crashed folder cleans up after it: no temp files, no shard the index does not name.
    for crashed in sorted(tmp_path.glob("crash-*")):
        zoo.save(new, crashed, max_shard_size=new_size)
        names = visible(crashed)
        expected = ["model.safetensors"] if new_size == "2GB" else ["model.safetensors.index.json"]
        expected += [] if new_size == "2GB" else shard_files(crashed)
        assert names == sorted([*expected, "spec.json"]), crashed.name


def test_a_save_removes_the_temp_files_of_killed_saves_and_nothing_else(tmp_path: Path) -> None:
    zoo.save(model(), tmp_path, max_shard_size=SHARD)
    killed = [
        ".model.safetensors.k3j4_x9a.tmp",
        ".model-00002-of-00005-0a1b2c3d.safetensors.abcdefgh.tmp",
        ".model.safetensors.index.json.zz11yy22.tmp",
        ".spec.json.q1w2e3r4.tmp",
    ]
    foreign = [".notes.txt.abcdefgh.tmp", "model.safetensors.tmp", ".model.safetensors.tmp", "notes.tmp"]
    for name in killed + foreign:
        (tmp_path / name).write_bytes(b"half a file")
    killed_folder = (
        tmp_path / ".model-00001-of-00005-0a1b2c3d.safetensors.k3j4_x9a.tmp"
    )  # write_temp's folder
    killed_folder.mkdir()
    (killed_folder / ".tmpAbC123").write_bytes(b"half a file")  # safetensors' own temp, inside it
    zoo.save(model(), tmp_path)
    assert visible(tmp_path) == sorted(["model.safetensors", "spec.json", *foreign])


def test_a_crash_at_any_step_of_an_hf_export_over_a_sharded_one_loads_as_the_old_or_the_new(
    tmp_path: Path,
) -> None:
    torch.manual_seed(1)
    old, new = model(), model()  # one architecture, so one config.json: the weights decide
    folder = zoo.to_hf(old, tmp_path / "old")
    tensors = load_file(folder / "model.safetensors")
    names, weight_map = list(tensors), {}
    for i in range(3):  # as save_pretrained shards it
        file = f"model-{i + 1:05d}-of-00003.safetensors"
        save_file({n: tensors[n] for n in names[i::3]}, str(folder / file), metadata={"format": "pt"})
        weight_map |= {n: file for n in names[i::3]}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    (folder / "model.safetensors").unlink()

    states = []
    for step in itertools.count(1):
        target = tmp_path / f"crash-{step}"
        shutil.copytree(folder, target)
        try:
            with crash_at(step):
                zoo.to_hf(new, target)
        except Crash:
            pass
        else:
            break
        loaded = zoo.from_hf(target)
        states.append("new" if same_state(loaded, new) else "old" if same_state(loaded, old) else "neither")
    committed = states.index("new") if "new" in states else len(states)
    assert states == ["old"] * committed + ["new"] * (len(states) - committed)
    assert 1 <= committed < len(states)  # crashes before and after the switch were both tried
    assert sorted(p.name for p in target.iterdir()) == ["config.json", "model.safetensors"]


def same_state(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    state_a, state_b = a.state_dict(), b.state_dict()
    return state_a.keys() == state_b.keys() and all(torch.equal(state_a[k], state_b[k]) for k in state_a)
