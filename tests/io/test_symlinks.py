"""A symbolic link inside a checkpoint folder is not followed out of it; a file the user names is read."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch

import zoo
from zoo.io.checkpoint import CheckpointError
from zoo.io.hf import HFError
from zoo.io.paths import OutsideFolderError, inside
from zoo.io.tokenizer import Tokenizer, train_tokenizer

OUTSIDE = "a symbolic link out of its folder"


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return train_tokenizer(iter(["the cat sat on the mat", "a dog ran"] * 20), kind="bpe", vocab_size=40)


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    """A file outside every checkpoint folder of the test (as /etc/passwd would be)."""
    path = tmp_path / "elsewhere" / "secret.txt"
    path.parent.mkdir()
    path.write_text("root:x:0:0:root:/root:/bin/bash\n" * 7)
    return path


def saved(tmp_path: Path, name: str = "ckpt", **kwargs: object) -> tuple[zoo.ZooModel, Path]:
    torch.manual_seed(0)
    model = zoo.build("gpt2-tiny")
    return model, zoo.save(model, tmp_path / name, **kwargs)  # type: ignore[arg-type]


def same(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    state_a, state_b = a.state_dict(), b.state_dict()
    return state_a.keys() == state_b.keys() and all(torch.equal(state_a[k], state_b[k]) for k in state_a)


def relink(path: Path, target: Path) -> None:
    path.unlink()
    path.symlink_to(target)


def test_inside_allows_links_within_the_folder_and_names_a_link_out(tmp_path: Path, secret: Path) -> None:
    folder = tmp_path / "f"
    folder.mkdir()
    (folder / "real.bin").write_bytes(b"x")
    (folder / "within.bin").symlink_to("real.bin")
    (folder / "out.bin").symlink_to(secret)
    assert inside(folder, "within.bin") == folder / "within.bin"
    assert inside(folder, "absent.bin") == folder / "absent.bin"
    with pytest.raises(OutsideFolderError, match=rf"out\.bin: {OUTSIDE} \(to .*secret\.txt\)"):
        inside(folder, "out.bin")


def test_zoo_load_refuses_weights_linked_out_of_the_folder_without_reading_them(
    tmp_path: Path, secret: Path
) -> None:
    _, folder = saved(tmp_path)
    relink(folder / "model.safetensors", secret)
    with pytest.raises(CheckpointError, match=rf"model\.safetensors: {OUTSIDE}") as refused:
        zoo.load(folder)
    assert str(secret.stat().st_size) not in str(refused.value)  # nothing about the file is revealed


def test_zoo_load_reads_a_linked_file_the_user_names_and_a_folder_that_is_a_link(tmp_path: Path) -> None:
    model, folder = saved(tmp_path, "real")
    links = tmp_path / "links"
    links.mkdir()
    (links / "model.safetensors").symlink_to(folder / "model.safetensors")
    (tmp_path / "alias").symlink_to(folder)
    for path in (links / "model.safetensors", tmp_path / "alias"):
        assert same(zoo.load(path), model)


def test_an_index_shard_linked_to_another_folders_file_is_refused(tmp_path: Path) -> None:
    _, folder = saved(tmp_path, "sharded", max_shard_size=20_000)
    shard = sorted(folder.glob("model-*.safetensors"))[0]
    other = tmp_path / "other"
    other.mkdir()
    shutil.move(shard, other / shard.name)  # the very same bytes, in another folder: loads on the old tree
    shard.symlink_to(other / shard.name)
    with pytest.raises(CheckpointError, match=rf"{shard.name}: {OUTSIDE}"):
        zoo.load(folder)


def test_a_tokenizer_linked_out_of_a_checkpoint_is_refused(tmp_path: Path, tokenizer: Tokenizer) -> None:
    _, folder = saved(tmp_path, tokenizer=tokenizer)
    elsewhere = tmp_path / "elsewhere.json"
    shutil.move(folder / "tokenizer.json", elsewhere)
    (folder / "tokenizer.json").symlink_to(elsewhere)
    with pytest.raises(CheckpointError, match=rf"tokenizer\.json: {OUTSIDE}"):
        zoo.load_tokenizer(folder)
    with pytest.raises(OutsideFolderError, match=rf"tokenizer\.json: {OUTSIDE}"):
        Tokenizer.from_file(folder)
    assert Tokenizer.from_file(folder / "tokenizer.json").vocab_size == tokenizer.vocab_size  # named: read


def test_a_tokenizer_config_linked_out_of_the_folder_is_refused(
    tmp_path: Path, tokenizer: Tokenizer, secret: Path
) -> None:
    folder = tokenizer.save_pretrained(tmp_path / "tok")
    relink(folder / "tokenizer_config.json", secret)
    with pytest.raises(OutsideFolderError, match=rf"tokenizer_config\.json: {OUTSIDE}"):
        Tokenizer.from_file(folder)


@pytest.mark.parametrize("name", ["config.json", "model.safetensors"])
def test_from_hf_refuses_a_file_linked_out_of_the_folder(tmp_path: Path, name: str) -> None:
    folder = zoo.to_hf(zoo.build("gpt2-tiny"), tmp_path / "hf")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shutil.move(folder / name, elsewhere / name)
    (folder / name).symlink_to(elsewhere / name)
    with pytest.raises(HFError, match=rf"{name.replace('.', '[.]')}: {OUTSIDE}"):
        zoo.from_hf(folder)


def test_from_hf_follows_the_hub_caches_links_to_its_blobs(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = zoo.build("gpt2-tiny")
    exported = zoo.to_hf(model, tmp_path / "export")
    repo = tmp_path / "hub" / "models--org--tiny"
    snapshot = repo / "snapshots" / "0123abc"
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for i, file in enumerate(sorted(exported.iterdir())):
        blob = repo / "blobs" / f"blob{i}"
        shutil.copy(file, blob)
        (snapshot / file.name).symlink_to(os.path.relpath(blob, snapshot))  # as huggingface_hub links them
    assert same(zoo.from_hf(snapshot), model)
