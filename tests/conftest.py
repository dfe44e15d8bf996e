"""Pytest fixtures shared by every test; helper functions live in `support.py` (importable as `support`)."""

from __future__ import annotations

import pytest
import torch

# The tests run tiny tensors, where two threads cost more in hand-offs than they win in parallelism
# (and fight each other on a loaded 2-core machine); one thread makes the suite faster and steadier.
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)
