"""Starting a run from a trained model (``model.init_from``): its spec, its tokenizer, its weights.

    model: {init_from: runs/pretrain}          # a zoo model folder: spec.json + model.safetensors
    model: {init_from: hf/bert-base-uncased}   # a Hugging Face folder: config.json + safetensors

The spec comes from the folder (``spec.json`` first, else ``config.json`` through `zoo.io.hf`), and the
tokenizer from its ``tokenizer.json`` unless ``tokenizer.path`` is given. The task may then change the
head (an MLM checkpoint fine-tuned for classification gets a new classifier), so the weights are copied by
name into the freshly initialised model: every tensor of the body must be in the folder with its shape;
head tensors the new model lacks are dropped and those it adds keep their initialisation, both logged.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from zoo.io.checkpoint import load as load_checkpoint
from zoo.io.checkpoint import read_spec as read_checkpoint_spec
from zoo.io.hf import from_hf, read_hf_spec
from zoo.io.names import CONFIG_NAME, SPEC_NAME, TOKENIZER_NAME
from zoo.io.paths import inside
from zoo.models.base import ZooModel
from zoo.spec import ModelSpec
from zoo.training.config import ConfigError

log = logging.getLogger(__name__)

# what a task may add or drop
HEADS = ("pooler.", "mlm_head.", "classifier.", "lm_head.", "replaced_token_head.")


def is_hf_folder(path: Path) -> bool:
    """A Hugging Face folder (config.json, no zoo spec.json)."""
    return not (path / SPEC_NAME).is_file() and (path / CONFIG_NAME).is_file()


def read_spec(path: Path) -> ModelSpec:
    """The spec of the model folder ``path``: its spec.json, or what its config.json converts to."""
    if not path.is_dir():
        raise ConfigError(
            f"model.init_from: {path} is not a folder (a zoo model or a Hugging Face checkpoint)"
        )
    if not (path / SPEC_NAME).is_file() and not (path / CONFIG_NAME).is_file():
        raise ConfigError(
            f"model.init_from: {path} has neither {SPEC_NAME} (a zoo model) nor {CONFIG_NAME} (Hugging Face)"
        )
    return read_hf_spec(path) if is_hf_folder(path) else read_checkpoint_spec(path)


def tokenizer_path(path: Path) -> Path:
    """The tokenizer.json of the model folder ``path``; a `ConfigError` when it has none."""
    file = inside(path, TOKENIZER_NAME, error=ConfigError)  # not a link out of the folder (`zoo.io.paths`)
    if not file.is_file():
        raise ConfigError(
            f"model.init_from: {path} has no {TOKENIZER_NAME}; give tokenizer.path (the tokenizer the model "
            "was trained with)"
        )
    return file


@dataclass(frozen=True)
class InitReport:
    """What `load_weights` did: tensors copied, head tensors dropped (not in the model), new ones."""

    loaded: list[str]
    dropped: list[str]
    new: list[str]


@torch.no_grad()
def load_weights(model: ZooModel, path: Path) -> InitReport:
    """Copy the weights of the model folder ``path`` into ``model`` by name (see the module docstring)."""
    source = from_hf(path) if is_hf_folder(path) else load_checkpoint(path)
    assert isinstance(source, ZooModel)  # load without return_report
    theirs, ours = source.state_dict(), model.state_dict()
    new = [name for name in ours if name not in theirs]
    dropped = [name for name in theirs if name not in ours]
    body = [name for name in [*new, *dropped] if not name.startswith(HEADS)]
    shapes = [
        f"{name} {tuple(theirs[name].shape)} in the folder, {tuple(tensor.shape)} in the model"
        for name, tensor in ours.items()
        if name in theirs and theirs[name].shape != tensor.shape
    ]
    if body or shapes:
        problems = [
            f"{name} {'missing from the folder' if name in new else 'not in the model'}" for name in body
        ]
        listed = "; ".join([*shapes, *problems][:6])
        raise ConfigError(
            f"model.init_from: {path} does not fit the model (model.overrides may change the body only in "
            f"ways that keep its tensors): {listed}"
        )
    loaded = [name for name in ours if name in theirs]
    for name in loaded:
        ours[name].copy_(theirs[name])
    if new or dropped:
        log.info(
            "%s: %d tensors loaded; new head tensors (initialised): %s; dropped: %s",
            path, len(loaded), ", ".join(new) or "none", ", ".join(dropped) or "none",
        )  # fmt: skip
    return InitReport(loaded=loaded, dropped=dropped, new=new)
