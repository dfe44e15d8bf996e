"""A transposed copy of a large matrix that never holds two copies of it: the source's memory pages are given
back to the operating system as the copy reads them.

Changing a weight matrix's layout (`zoo.generation.weight_layout`) is a copy, and ``W.t().contiguous()``
allocates the new storage while the old one is still whole. On a Llama-3.2-1B-shaped model in float32 that
cost 1 GB at the peak of the first single-row `generate` (the tied 128256 x 2048 embedding table), and for
weights memory-mapped from a checkpoint the file's pages stayed resident beside every converted copy (3.4 GB).

`transposed_copy` copies in blocks, each block transposed into a small scratch matrix first (torch's tiled
transpose) and then written out in runs of at least a page. With ``release``, after every block the pages
of the source that hold nothing left to read are dropped with ``madvise(MADV_DONTNEED)``: anonymous memory
goes back to the system, a private file mapping lets go of its pages. The destination's pages are touched
only as the blocks fill them, so the resident set stays flat: it grows by the scratch block (8 MiB of float32,
more for rows over 2048 wide) and a partly filled page or two per destination row, not by the matrix. A matrix
of at most two blocks is copied in one piece and given back whole.

Releasing is for a source nothing else refers to (the caller checks), on Linux, in ordinary CPU memory
(`can_release`); the released source reads as zeros (or as the file) afterwards, so the caller swaps the
copy in at once, under `uninterrupted` so that Ctrl-C cannot leave a half-released matrix in a model.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import mmap
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from functools import cache
from typing import Any

import torch

logger = logging.getLogger(__name__)

PAGE = mmap.PAGESIZE
_MADV_DONTNEED = 4  # Linux
# Elements a block holds at least (the scratch matrix: 8 MiB of float32) and bytes a run holds at least:
# runs shorter than a page made the strided half of the copy ~3x slower (measured, 2-core EPYC).
BLOCK = 1 << 21
RUN_BYTES = 4096


def transposed_copy(src: torch.Tensor, *, release: bool = False) -> torch.Tensor:
    """A new contiguous (C, R) tensor holding ``src``ᵀ, for a contiguous 2-D ``src`` (R, C).

    ``release``: give ``src``'s memory pages back as they are read (see the module docstring; only where
    `can_release` says so). ``src`` is garbage afterwards."""
    rows, cols = src.shape
    if release and not src.is_contiguous():
        raise ValueError(f"transposed_copy: release needs a contiguous matrix, got strides {src.stride()}")
    pages = _Pages(src) if release else None
    if src.numel() <= 2 * BLOCK:  # small: in one piece (at most 16 MiB more, for a moment), then let go whole
        whole = src.t().contiguous()
        if pages is not None:
            pages.release(0, src.numel())
        return whole
    dst = torch.empty((cols, rows), dtype=src.dtype, device=src.device)
    run = max(1, RUN_BYTES // src.element_size())
    if rows >= cols:  # blocks of whole source rows: read once, then released in one piece
        step = min(rows, max(run, BLOCK // cols))
        flat = torch.empty(cols * step, dtype=src.dtype, device=src.device)
        for r0 in range(0, rows, step):
            r1 = min(rows, r0 + step)
            block = flat[: cols * (r1 - r0)].view(cols, r1 - r0)
            block.copy_(src[r0:r1].t())  # (C, r) contiguous: torch's tiled transpose
            dst[:, r0:r1].copy_(block)  # runs of r elements into each destination row
            if pages is not None:
                pages.release(0, r1 * cols, since=r0 * cols)
    else:  # blocks of whole destination rows: each source row read up to column c1
        step = min(cols, max(run, BLOCK // rows))
        flat = torch.empty(rows * step, dtype=src.dtype, device=src.device)
        for c0 in range(0, cols, step):
            c1 = min(cols, c0 + step)
            block = flat[: rows * (c1 - c0)].view(rows, c1 - c0)
            block.copy_(src[:, c0:c1])  # runs of c elements from each source row
            dst[c0:c1].copy_(block.t())  # (c, R) contiguous: torch's tiled transpose
            if pages is not None:
                pages.release_columns(rows, cols, c0, c1)
    return dst


def can_release(tensor: torch.Tensor) -> bool:
    """Whether `transposed_copy` can give ``tensor``'s pages back: Linux, ordinary (not pinned or shared)
    CPU memory."""
    return (
        tensor.device.type == "cpu"
        and not tensor.is_pinned()
        and not tensor.is_shared()
        and _madvise() is not None
    )


@contextlib.contextmanager
def uninterrupted() -> Iterator[None]:
    """Hold Ctrl-C (SIGINT, main thread) until the block is done, then raise it: a matrix whose pages were
    released must be swapped for its copy before anything can see it."""
    if threading.current_thread() is not threading.main_thread():
        yield  # Python raises KeyboardInterrupt in the main thread only
        return
    previous = signal.getsignal(signal.SIGINT)
    if previous is None:  # a handler installed outside Python: leave it alone
        yield
        return
    caught: list[Any] = []
    signal.signal(signal.SIGINT, lambda *args: caught.append(args))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if caught and callable(previous):
            previous(*caught[0])  # the default handler raises KeyboardInterrupt


class _Pages:
    """Releases whole pages of one tensor's bytes, given as element ranges."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.start, self.item = tensor.data_ptr(), tensor.element_size()
        self.madvise = _madvise()

    def release(self, lowest: int, end: int, *, since: int | None = None) -> None:
        """Drop the pages wholly inside elements [lowest, end), those from element ``since`` on (or all)."""
        floor = -(-(self.start + lowest * self.item) // PAGE) * PAGE  # first page wholly at or above lowest
        lo = floor if since is None else max(floor, (self.start + since * self.item) // PAGE * PAGE)
        self._drop(lo, (self.start + end * self.item) // PAGE * PAGE)

    def release_columns(self, rows: int, cols: int, c0: int, c1: int) -> None:
        """In each row of a (rows, cols) matrix whose columns up to c1 have been read, drop the whole pages of
        columns [c0, c1) (a page shared with the row before stays until the tensor is freed)."""
        start, item = self.start, self.item
        for r in range(rows):  # a call a row, 2-3 us each: ~40% of a copy back to row-major at 1B
            row = start + r * cols * item
            lo = max(-(-row // PAGE) * PAGE, (row + c0 * item) // PAGE * PAGE)
            self._drop(lo, (row + c1 * item) // PAGE * PAGE)

    def _drop(self, lo: int, hi: int) -> None:
        if hi > lo and self.madvise is not None and self.madvise(lo, hi - lo, _MADV_DONTNEED) != 0:
            logger.debug(
                "madvise failed (errno %d): the rest of this copy keeps its source", ctypes.get_errno()
            )
            self.madvise = None


@cache
def _madvise() -> Callable[[int, int, int], int] | None:
    """libc's ``madvise`` on Linux, None elsewhere."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        function = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    function.restype = ctypes.c_int
    return function
