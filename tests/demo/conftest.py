"""The demo tests train with the training tests' tiny model on their toy files: the same fixtures."""

from __future__ import annotations

from training.conftest import make_config, toy_files

__all__ = ["make_config", "toy_files"]
