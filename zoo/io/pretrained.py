"""One loader for the commands that take "a model" (``zoo generate``, ``zoo translate``, ``zoo chat``, ``zoo serve``,
``zoo eval``): a zoo checkpoint or a Hugging Face folder, with its tokenizer.

    zoo checkpoint   spec.json (or the spec in the weights' metadata) + model.safetensors (+ tokenizer.json):
                     `zoo.load`, `zoo.load_tokenizer`
    Hugging Face     config.json + safetensors + tokenizer.json (+ tokenizer_config.json): `zoo.from_hf`,
                     `zoo.load_tokenizer` (which reads the folder's special tokens and chat template too)

A folder that is neither is one `CheckpointNotFoundError` naming what was looked for.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import torch

from zoo.io.checkpoint import CheckpointNotFoundError, load, load_tokenizer
from zoo.io.hf import from_hf
from zoo.io.names import CONFIG_NAME, SPEC_NAME, TOKENIZER_NAME, WEIGHTS_NAME

if TYPE_CHECKING:
    from zoo.io.tokenizer import Tokenizer
    from zoo.models.base import ZooModel


class Pretrained(NamedTuple):
    model: ZooModel  # in eval mode
    tokenizer: Tokenizer
    kind: str  # "zoo" or "hf": which format the folder was


def load_pretrained(
    path: str | os.PathLike[str],
    *,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> Pretrained:
    """The model and tokenizer in ``path``: a zoo checkpoint (``spec.json``) or a Hugging Face folder
    (``config.json``), each with its ``tokenizer.json``. ``device`` and ``dtype`` as `zoo.load` takes them."""
    folder = pretrained_folder(path)
    if not (folder / TOKENIZER_NAME).is_file():
        raise CheckpointNotFoundError(
            f"{folder}: no {TOKENIZER_NAME} (the model's tokenizer; save one with zoo.save(model, dir, "
            "tokenizer=...))"
        )
    hf = (folder / CONFIG_NAME).is_file() and not (folder / SPEC_NAME).is_file()
    # A zoo checkpoint's spec: spec.json, or the metadata zoo.save writes into the weights.
    if not hf and ((folder / SPEC_NAME).is_file() or (folder / WEIGHTS_NAME).is_file()):
        model, kind = load(folder, device=device, dtype=dtype), "zoo"
    elif hf:
        model, kind = from_hf(folder, device=device, dtype=dtype), "hf"
    else:
        raise CheckpointNotFoundError(
            f"{folder}: neither a zoo checkpoint ({SPEC_NAME}) nor a Hugging Face folder ({CONFIG_NAME})"
        )
    assert not isinstance(model, tuple)  # load(..., return_report=False)
    return Pretrained(model, load_tokenizer(folder), kind)


def pretrained_folder(path: str | os.PathLike[str]) -> Path:
    """``path`` as a folder, or a `CheckpointNotFoundError` saying there is none (never a Hub lookup)."""
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise CheckpointNotFoundError(f"{folder}: no such folder (a zoo checkpoint or a Hugging Face folder)")
    return folder


__all__ = ["Pretrained", "load_pretrained", "pretrained_folder"]
