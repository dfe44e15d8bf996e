"""Pytest fixtures shared by every test; helper functions live in `support.py` (importable as `support`)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)
