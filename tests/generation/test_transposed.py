"""`transposed_copy` (`zoo.generation.transposed`): a transposed copy of any matrix, equal to ``t().contiguous()``;
with ``release``, the source's pages are given back while it copies (they read as zeros afterwards)."""

from __future__ import annotations

import os
import signal

import pytest
import torch

from zoo.generation.transposed import BLOCK, can_release, transposed_copy, uninterrupted

linux = pytest.mark.skipif(not can_release(torch.zeros(1)), reason="pages are given back on Linux only")


@pytest.mark.parametrize(
    "shape",
    [
        (1, 1),
        (1, 9),
        (9, 1),
        (3, 5),
        (4099, 1031),
        (1031, 4099),
        (8192, 600),
        (600, 8192),
        (70001, 61),
        (61, 70001),
    ],
)
@pytest.mark.parametrize("release", [False, True])
def test_the_copy_is_the_transpose_in_both_block_orders(shape, release):
    src = torch.randn(shape)
    expected = src.t().contiguous()
    copy = transposed_copy(src, release=release and can_release(src))
    assert copy.is_contiguous() and copy.shape == expected.shape and torch.equal(copy, expected)


def test_other_dtypes_copy_alike():
    src = torch.randn(3000, 1500).to(torch.bfloat16)
    assert torch.equal(transposed_copy(src), src.t())


@linux
@pytest.mark.parametrize("shape", [(4 * BLOCK // 512, 512), (512, 4 * BLOCK // 512)])
def test_released_pages_are_given_back_as_the_copy_reads_them(shape):
    """Both block orders (whole source rows; whole destination rows) drop the source's pages: anonymous
    memory given back reads as zeros. Only the pages a neighbour shares at a row's edge stay."""
    src = torch.randn(shape)
    expected = src.t().contiguous()
    copy = transposed_copy(src, release=True)
    assert torch.equal(copy, expected)
    assert (src == 0).float().mean() > 0.85  # a page of 4 KiB per 32 KiB row may straddle two rows


@linux
def test_a_small_matrix_is_copied_whole_then_given_back():
    src = torch.randn(1024, 512)  # under 2 * BLOCK elements: one piece
    expected = src.t().contiguous()
    assert torch.equal(transposed_copy(src, release=True), expected)
    assert (src == 0).float().mean() > 0.99


@pytest.mark.skipif(not hasattr(signal, "SIGINT") or os.name != "posix", reason="POSIX signals")
def test_ctrl_c_waits_until_the_block_is_done():
    done = []
    with pytest.raises(KeyboardInterrupt), uninterrupted():
        os.kill(os.getpid(), signal.SIGINT)
        done.append(True)  # still runs: the interrupt is held
    assert done == [True]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
