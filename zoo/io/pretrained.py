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

from zoo.io.names import CONFIG_NAME, SPEC_NAME, TOKENIZER_NAME, WEIGHTS_NAME

if TYPE_CHECKING:  # `pretrained_kind` needs neither torch nor the converters: `zoo eval` checks it first
    import torch

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
    from zoo.io.checkpoint import load, load_tokenizer
    from zoo.io.hf import from_hf

    folder = Path(path).expanduser()
    if pretrained_kind(folder) == "zoo":
        model, kind = load(folder, device=device, dtype=dtype), "zoo"
    else:
        model, kind = from_hf(folder, device=device, dtype=dtype), "hf"
    assert not isinstance(model, tuple)  # load(..., return_report=False)
    return Pretrained(model, load_tokenizer(folder), kind)


def pretrained_kind(path: str | os.PathLike[str]) -> str:
    """``"zoo"`` or ``"hf"``: which kind of model folder `load_pretrained` would read at ``path``, from the
    file names alone (nothing is opened; never a Hub lookup); a `CheckpointNotFoundError` naming what is
    missing otherwise."""
    from zoo.io.checkpoint.files import CheckpointNotFoundError

    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise CheckpointNotFoundError(f"{folder}: no such folder (a zoo checkpoint or a Hugging Face folder)")
    if not (folder / TOKENIZER_NAME).is_file():
        raise CheckpointNotFoundError(
            f"{folder}: no {TOKENIZER_NAME} (the model's tokenizer; save one with zoo.save(model, dir, "
            "tokenizer=...))"
        )
    hf = (folder / CONFIG_NAME).is_file() and not (folder / SPEC_NAME).is_file()
    # A zoo checkpoint's spec: spec.json, or the metadata zoo.save writes into the weights.
    if not hf and ((folder / SPEC_NAME).is_file() or (folder / WEIGHTS_NAME).is_file()):
        return "zoo"
    if hf:
        return "hf"
    raise CheckpointNotFoundError(
        f"{folder}: neither a zoo checkpoint ({SPEC_NAME}) nor a Hugging Face folder ({CONFIG_NAME})"
    )


__all__ = ["Pretrained", "load_pretrained", "pretrained_kind"]
