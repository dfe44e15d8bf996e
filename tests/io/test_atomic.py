"""zoo.io.atomic: the old file or the new one, never half; no temp file left behind; mode 0644."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from zoo.io.atomic import write_atomic, write_temp, write_text_atomic


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
    assert temp.parent == tmp_path and temp.name.startswith(".model.safetensors.") and temp.suffix == ".tmp"
    assert not target.exists() and temp.read_bytes() == b"x"
