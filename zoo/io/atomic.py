"""Atomic file writes: a reader sees the old file or the new one, never half of one, even after a crash.

Every file zoo writes goes through here, with one durability policy:

    temp file in the target's folder -> write -> flush + fsync -> rename over the target -> fsync the folder

The temp file lives in the same folder (a rename is atomic only within one file system) under a hidden name
ending in ``.tmp`` that no loader reads, and it is removed if the write fails. ``write_temp`` stops before
the rename, for callers that switch several files at once (a sharded checkpoint).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

TEMP_SUFFIX = ".tmp"


def write_temp(final: Path, write: Callable[[Path], object]) -> Path:
    """Run ``write(temp)`` on a fresh temp file beside ``final`` and fsync it; the caller renames it.

    The temp file is removed if ``write`` fails. Its mode is 0644 (``mkstemp`` makes 0600), since what zoo
    writes is meant to be shared.
    """
    fd, name = tempfile.mkstemp(dir=final.parent, prefix=f".{final.name}.", suffix=TEMP_SUFFIX)
    os.close(fd)
    temp = Path(name)
    try:
        write(temp)
        with temp.open(
            "rb+"
        ) as f:  # the writer may not have synced: make the bytes durable before the rename
            os.fsync(f.fileno())
        os.chmod(temp, 0o644)
    except BaseException:
        remove_quietly(temp)
        raise
    return temp


def write_atomic(final: Path, write: Callable[[Path], object]) -> None:
    """Write ``final`` through ``write(temp)``: temp file, fsync, rename into place, fsync the folder."""
    final.parent.mkdir(parents=True, exist_ok=True)
    temp = write_temp(final, write)
    try:
        os.replace(temp, final)
    except BaseException:
        remove_quietly(temp)
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


def remove_quietly(path: Path) -> None:
    """Delete ``path`` if it exists."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
