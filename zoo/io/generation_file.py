"""A model's Hugging Face ``generation_config.json``, carried with the model as it was read.

    zoo.from_hf(folder)   reads folder/generation_config.json (when there) onto the model
    zoo.save(model, dir)  writes it beside the weights, as zoo.save writes tokenizer_config.json
    zoo.load(dir)         reads it back onto the model
    zoo.to_hf(model, dir) writes it for transformers' ``generate``

Whisper's decoder prompt (language, task, no timestamps) and suppressed tokens live in this file
(`zoo.io.hf.generation_config` reads them), so a converted checkpoint must keep it or transcribe differently.
The document is kept whole, not just the fields zoo reads: an export hands transformers what it was given.
A model that carries none gets none written, and a previous save's or export's file is removed: a stale one
would be read as this model's settings.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from zoo.io.atomic import fsync_dir, remove_quietly, write_text_atomic
from zoo.io.jsonfile import read_json_object
from zoo.io.names import GENERATION_CONFIG_NAME
from zoo.io.paths import inside

__all__ = ["generation_file_of", "read_generation_file", "set_generation_file", "write_generation_file"]

_ATTRIBUTE = "hf_generation_config"  # a plain attribute on the model, as ``name_or_path`` is


def read_generation_file(folder: Path, *, error: type[Exception]) -> dict[str, Any] | None:
    """The ``generation_config.json`` in ``folder`` as a dict, or None when there is none. A file that is not
    JSON raises ``error``, one whose fields zoo reads have the wrong kind an `HFError`, each naming it."""
    from zoo.io.hf.generation_config import HFGenerationSettings  # below zoo.io.hf's package import

    path = inside(folder, GENERATION_CONFIG_NAME, error=error)
    if not path.is_file():
        return None
    data = read_json_object(path, error=error)
    HFGenerationSettings.from_dict(data, source=str(path))  # checked now, not when first transcribing
    return data


def generation_file_of(model: torch.nn.Module) -> dict[str, Any] | None:
    """The ``generation_config.json`` document the model was read with, or None."""
    data = getattr(model, _ATTRIBUTE, None)
    return data if isinstance(data, dict) else None


def set_generation_file(model: torch.nn.Module, data: dict[str, Any] | None) -> None:
    """Carry ``data`` (a ``generation_config.json`` document, or None for none) with ``model``."""
    setattr(model, _ATTRIBUTE, data)


def write_generation_file(folder: Path, model: torch.nn.Module) -> None:
    """Write the model's ``generation_config.json`` into ``folder`` (atomically), or remove an earlier one
    when the model carries none."""
    data = generation_file_of(model)
    path = folder / GENERATION_CONFIG_NAME
    if data is not None:
        write_text_atomic(path, json.dumps(data, indent=2, sort_keys=True) + "\n")
    elif path.is_file() or path.is_symlink():
        remove_quietly(path)
        fsync_dir(folder)
