"""safetensors files read in place: CPU tensors that are views of the file's memory mapping, and `release`,
which gives back the pages of a tensor that loading copied elsewhere.

safetensors maps each file privately (``MAP_PRIVATE``) and hands out CPU tensors that are views of the
mapping: reading one copies nothing; its pages become resident when first touched and count in the process's
resident set until the mapping goes. A model that adopts such tensors (``load_state_dict(assign=True)``) holds
the file's pages and nothing more, as transformers' ``from_pretrained`` does. A tensor that loading copies (a
cast, q/k/v fused into one matrix, a transpose, a move to the GPU) would leave its source's pages resident
for as long as any tensor of the file lives, although nothing reads them again: a second copy of those
weights. `release` drops them (``madvise(MADV_DONTNEED)``, one source at a time, right after its copy): on a
private file mapping that was never written, a later read faults the same bytes back in from the file, so
releasing changes no value, only what is resident.

    with MappedFiles(files) as source:
        q, k, v = (source.get(file, name) for name in names)   # views of the mapping: nothing copied
        fused = torch.cat([q, k, v])                            # the copy ...
        release_unless_shared([q, k, v], fused)                 # ... and its sources' pages given back

Only tensors inside a mapping this object opened (and holds open) are released; anything else (a tensor the
caller made, a mapping another load made and a model may have written to) is left alone. Where the mapping
cannot be identified (not Linux, no ``/proc/self/maps``) `release` does nothing.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import sys
from collections.abc import Iterable
from contextvars import ContextVar
from functools import cache
from pathlib import Path
from types import TracebackType

import torch
from safetensors import safe_open

__all__ = ["MappedFiles", "release", "release_unless_shared"]

# Linux: drop the range from the resident set; a private file page never written reads back from the file.
_MADV_DONTNEED = 4
_ACTIVE: ContextVar[MappedFiles | None] = ContextVar("zoo_mapped_files", default=None)


class MappedFiles:
    """safetensors files opened on the CPU for one load. Used in ``with``, the module's `release` acts on
    their tensors until the block ends and closes them; otherwise call the method and `close`."""

    def __init__(self, files: Iterable[Path]) -> None:
        self.files = list(files)  # opened on first use
        self._handles: dict[Path, object] = {}
        self._ranges: list[tuple[int, int]] = []  # [start, end) of each mapping these handles hold open
        self._located: set[Path] = set()
        self._token: object | None = None

    def __enter__(self) -> MappedFiles:
        self._token = _ACTIVE.set(self)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        if self._token is not None:
            _ACTIVE.reset(self._token)  # type: ignore[arg-type]
            self._token = None
        self.close()

    def close(self) -> None:
        """Close the files (the tensors handed out keep their mapping alive) and release nothing from now on:
        once the handles are gone, an address in a range recorded here may be reused."""
        self._handles.clear()
        self._ranges.clear()

    def handle(self, file: Path) -> object:
        """The open safetensors handle of ``file`` (opened on first use; safetensors raises its own errors)."""
        if file not in self._handles:
            self._handles[file] = safe_open(str(file), framework="pt", device="cpu")
        return self._handles[file]

    def get(self, file: Path, name: str) -> torch.Tensor:
        """Tensor ``name`` of ``file``: a view of its mapping (nothing read until touched)."""
        tensor: torch.Tensor = self.handle(file).get_tensor(name)  # type: ignore[attr-defined]
        if file not in self._located and tensor.numel():
            self._located.add(file)
            found = _mapping_of(file, tensor.data_ptr())
            if found is not None:
                self._ranges.append(found)
        return tensor

    def names(self, file: Path) -> list[str]:
        """The tensor names ``file`` holds, as its header lists them."""
        return list(self.handle(file).keys())  # type: ignore[attr-defined]

    def release(self, tensor: torch.Tensor) -> None:
        """Drop from the resident set the whole pages of ``tensor`` if it lies in a mapping opened here."""
        if (
            not self._ranges
            or tensor.device.type != "cpu"
            or not tensor.numel()
            or not tensor.is_contiguous()
        ):
            return
        start = tensor.data_ptr()
        end = start + tensor.numel() * tensor.element_size()
        if not any(low <= start and end <= high for low, high in self._ranges):
            return
        page = mmap.PAGESIZE
        first, last = -(-start // page) * page, end // page * page  # whole pages: a neighbour keeps its own
        if last > first:
            _madvise(first, last - first)


def release(tensor: torch.Tensor) -> None:
    """Give back ``tensor``'s pages if it is a view of a file that the active `MappedFiles` holds open (a
    source that loading has just copied); otherwise nothing."""
    active = _ACTIVE.get()
    if active is not None:
        active.release(tensor)


def release_unless_shared(sources: Iterable[torch.Tensor], result: torch.Tensor) -> None:
    """`release` each of ``sources`` that ``result`` was copied from (does not share its storage)."""
    if _ACTIVE.get() is None:
        return
    kept = result.untyped_storage().data_ptr() if result.device.type == "cpu" else None
    for source in sources:
        if source.untyped_storage().data_ptr() != kept:
            release(source)


def _mapping_of(file: Path, address: int) -> tuple[int, int] | None:
    """[start, end) of the private mapping of ``file`` holding ``address``, from /proc/self/maps; None where
    there is none (another platform, a copy rather than a view)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        stat = os.stat(file)
        lines = Path("/proc/self/maps").read_text().splitlines()
    except OSError:
        return None
    device = f"{os.major(stat.st_dev):02x}:{os.minor(stat.st_dev):02x}"
    for line in lines:
        fields = line.split(maxsplit=5)
        if len(fields) < 5:
            continue
        low, _, high = fields[0].partition("-")
        start, end = int(low, 16), int(high, 16)
        if start <= address < end:
            private = fields[1].endswith("p")
            same_file = fields[3] == device and fields[4] == str(stat.st_ino)
            return (start, end) if private and same_file else None
    return None


def _madvise(address: int, length: int) -> None:
    libc = _libc()
    if libc is not None:
        libc.madvise(ctypes.c_void_p(address), ctypes.c_size_t(length), ctypes.c_int(_MADV_DONTNEED))


@cache
def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
