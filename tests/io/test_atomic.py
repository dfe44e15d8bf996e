"""zoo.io.atomic: the old file or the new one, never half; no temp file left behind; mode 0644."""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from zoo.io.atomic import move_into_place, remove_stale_temps, write_atomic, write_temp, write_text_atomic


def test_a_write_replaces_the_file_whole(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "a.json"
    write_text_atomic(target, "old")
    write_text_atomic(target, "new")
    assert target.read_text() == "new" and os.listdir(target.parent) == ["a.json"]
    assert stat.S_IMODE(target.stat().st_mode) == 0o644


def test_a_failed_write_keeps_the_old_file_and_removes_its_temp(tmp_path: Path) -> None:
    target = tmp_path / "a.json"
    write_text_atomic(target, "old")

    def half_then_fail(path: Path) -> None:
        path.write_text("half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_atomic(target, half_then_fail)
    assert target.read_text() == "old" and os.listdir(tmp_path) == ["a.json"]


def test_a_temp_file_is_hidden_beside_its_target_until_renamed(tmp_path: Path) -> None:
    target = tmp_path / "model.safetensors"
    temp = write_temp(target, lambda path: path.write_bytes(b"x"))
    folder = temp.parent  # a private folder: a writer's own temp files land in it too
    assert (
        folder.parent == tmp_path
        and folder.name.startswith(".model.safetensors.")
        and folder.suffix == ".tmp"
    )
    assert not target.exists() and temp.read_bytes() == b"x"
    move_into_place(temp, target)
    assert target.read_bytes() == b"x" and os.listdir(tmp_path) == ["model.safetensors"]


def test_a_writer_killed_mid_write_leaves_its_own_temp_files_only_inside_zoos_temp_folder(
    tmp_path: Path,
) -> None:
    target = tmp_path / "model.safetensors"

    def killed_inside_safetensors(path: Path) -> None:  # safetensors writes .tmpXXXXXX beside `path` first
        (path.parent / ".tmpAbC123").write_bytes(b"half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_atomic(target, killed_inside_safetensors)
    assert os.listdir(tmp_path) == []
    temp = write_temp(target, lambda path: save_file({"x": torch.zeros(3)}, str(path)))
    (temp.parent / ".tmpAbC123").write_bytes(b"half")  # as a kill -9 would leave it: nothing removes it...
    assert [p.name for p in tmp_path.iterdir()] == [temp.parent.name]  # ...but it is inside zoo's folder
    assert remove_stale_temps(tmp_path, re.compile(re.escape("model.safetensors"))) == [temp.parent]
    assert os.listdir(tmp_path) == []


def test_stale_temps_of_other_targets_and_foreign_files_are_kept(tmp_path: Path) -> None:
    names = [
        ".model.safetensors.abc_123.tmp",
        ".notes.txt.abc_123.tmp",
        ".tmpAbC123",
        "model.safetensors.tmp",
    ]
    for name in names:
        (tmp_path / name).write_bytes(b"x")
    (tmp_path / ".spec.json.zz9.tmp").mkdir()
    removed = remove_stale_temps(tmp_path, re.compile(r"model\.safetensors|spec\.json"))
    assert sorted(p.name for p in removed) == [".model.safetensors.abc_123.tmp", ".spec.json.zz9.tmp"]
    assert sorted(os.listdir(tmp_path)) == sorted(names[1:])


def test_a_symlinked_target_is_replaced_never_written_through(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text("keep me")
    (tmp_path / "out").mkdir()
    link = tmp_path / "out" / "config.json"
    link.symlink_to(elsewhere)
    write_text_atomic(link, "new")
    assert not link.is_symlink() and link.read_text() == "new" and elsewhere.read_text() == "keep me"
