"""Atomic file writes: a reader sees the old file or the new one, never half of one, even after a crash.

Every file zoo writes goes through here, with one durability policy:

    private temp folder beside the target -> write the file in it -> fsync -> rename over the target
    -> fsync the target's folder -> remove the (now empty) temp folder

The temp folder lives beside the target (a rename is atomic only within one file system) under a hidden
name ``.<target>.<random>.tmp`` that no loader reads, and it is removed if the write fails. It is a folder,
not a file, because writers make temp files of their own: safetensors writes ``.tmpXXXXXX`` beside the path
it is given and renames it there, and a kill would leave that file beside the checkpoint. ``write_temp``
stops before the rename, for callers that switch several files at once (a sharded checkpoint). A process
killed mid-write cannot remove its temp folder: `remove_stale_temps` does, at the start of the next save.

Symlinks: the temp folder is made by ``mkdtemp`` (mode 0700, never an existing path), so the writer never
opens an existing file or link; the rename replaces a target that is a symlink by the new file and leaves
what it pointed to untouched. Nothing here writes through a link. A *folder* that is a symlink is followed,
like any path the caller names: the files land in the folder it points to.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

TEMP_SUFFIX = ".tmp"
# write_temp's folders: "." + target + "." + mkdtemp's random letters, digits and "_" + ".tmp"
_TEMP_NAME = re.compile(r"\.(?P<target>.+)\.[A-Za-z0-9_]+" + re.escape(TEMP_SUFFIX))


def write_temp(final: Path, write: Callable[[Path], object]) -> Path:
    """Run ``write(temp)`` on a fresh path in a private temp folder beside ``final`` and fsync the file; the
    caller moves it with `move_into_place` (or drops it with `discard_temp`).

    Everything is removed if ``write`` fails. The file's mode is 0644, since what zoo writes is meant to be
    shared.
    """
    folder = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}.", suffix=TEMP_SUFFIX))
    temp = folder / final.name
    try:
        write(temp)
        with temp.open(
            "rb+"
        ) as f:  # the writer may not have synced: make the bytes durable before the rename
            os.fsync(f.fileno())
        os.chmod(temp, 0o644)
    except BaseException:
        discard_temp(temp)
        raise
    return temp


def move_into_place(temp: Path, final: Path) -> None:
    """Rename `write_temp`'s file over ``final`` (one atomic step), then remove its empty temp folder."""
    os.replace(temp, final)
    with contextlib.suppress(OSError):  # left over, it is only an empty folder the next save removes
        os.rmdir(temp.parent)


def discard_temp(temp: Path) -> None:
    """Remove `write_temp`'s file and its temp folder, whatever the writer left in it."""
    shutil.rmtree(temp.parent, ignore_errors=True)


def write_atomic(final: Path, write: Callable[[Path], object]) -> None:
    """Write ``final`` through ``write(temp)``: temp file, fsync, rename into place, fsync the folder."""
    final.parent.mkdir(parents=True, exist_ok=True)
    temp = write_temp(final, write)
    try:
        move_into_place(temp, final)
    except BaseException:
        discard_temp(temp)
        raise
    fsync_dir(final.parent)


def write_text_atomic(final: Path, text: str) -> None:
    """`write_atomic` for UTF-8 text (a JSON, YAML or CSV file)."""
    write_atomic(final, lambda path: path.write_text(text, encoding="utf-8"))


def fsync_dir(directory: Path) -> None:
    """Make renames in ``directory`` durable (a no-op where directories cannot be opened, e.g. Windows)."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def remove_stale_temps(directory: Path, targets: re.Pattern[str]) -> list[Path]:
    """Remove the temp folders (or files, from older versions) that killed writes left in ``directory`` for
    targets named by ``targets``; returns what was removed.

    Only names of `write_temp`'s form whose target fullmatches ``targets`` are touched (a link is removed,
    never followed). A write still running in another process into the same folder would lose its temp and
    fail: one writer per folder at a time.
    """
    removed = []
    for path in directory.iterdir():
        match = _TEMP_NAME.fullmatch(path.name)
        if not (match and targets.fullmatch(match["target"])):
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            remove_quietly(path)
        removed.append(path)
    return removed


def remove_quietly(path: Path) -> None:
    """Delete ``path`` if it exists."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
