"""Resumable training checkpoints: weights, optimizer, RNG and data position, written atomically.

    <output_dir>/checkpoints/step-00000500/
        model.safetensors, spec.json, tokenizer.json   zoo.save: a loadable model on its own
        optimizer.safetensors                           Adam moments by parameter name; groups in metadata
        rng.safetensors                                 every rank's torch (and CUDA) RNG state
        trainer_state.json                              step, epoch, batch position, elapsed time

No pickle: tensors go to safetensors and everything else to JSON. The directory is written under a
temporary name and renamed into place once complete, so a crash mid-save never leaves a checkpoint that
looks finished; `latest_checkpoint` only sees complete ones.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

CHECKPOINTS_DIR = "checkpoints"
STATE_NAME = "trainer_state.json"
OPTIMIZER_NAME = "optimizer.safetensors"
RNG_NAME = "rng.safetensors"
_STEP_DIR = re.compile(r"step-(\d+)")


class ResumeError(ValueError):
    """A checkpoint that cannot be resumed from; the message names it."""


def checkpoint_dir(output_dir: Path, step: int) -> Path:
    return output_dir / CHECKPOINTS_DIR / f"step-{step:08d}"


def list_checkpoints(output_dir: Path) -> list[Path]:
    """Complete checkpoints under ``output_dir``, oldest first."""
    root = output_dir / CHECKPOINTS_DIR
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if _STEP_DIR.fullmatch(p.name) and (p / STATE_NAME).is_file()]
    return sorted(found, key=lambda p: int(p.name.split("-")[1]))


def latest_checkpoint(output_dir: Path) -> Path | None:
    checkpoints = list_checkpoints(output_dir)
    return checkpoints[-1] if checkpoints else None


# --- optimizer state as safetensors + JSON ------------------------------------------------------------------


def flatten_optimizer_state(state: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """A full optimizer state dict (keyed by parameter name) -> (tensors, JSON metadata)."""
    tensors, scalars = {}, {}
    for name, values in state["state"].items():
        for key, value in values.items():
            if isinstance(value, torch.Tensor):
                tensors[f"{name}/{key}"] = value.detach().cpu().contiguous()
            else:
                scalars[f"{name}/{key}"] = value
    metadata = {"param_groups": json.dumps(state["param_groups"]), "scalars": json.dumps(scalars)}
    return tensors, metadata


def unflatten_optimizer_state(path: Path) -> dict[str, Any]:
    state: dict[str, dict[str, Any]] = {}
    with safe_open(str(path), framework="pt") as f:
        metadata = f.metadata() or {}
        for key in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
            name, _, field = key.rpartition("/")
            state.setdefault(name, {})[field] = f.get_tensor(key)
    for key, value in json.loads(metadata.get("scalars", "{}")).items():
        name, _, field = key.rpartition("/")
        state.setdefault(name, {})[field] = value
    groups = json.loads(metadata["param_groups"])
    for group in groups:  # JSON turned tuples into lists; Adam unpacks betas either way, but keep the type
        if "betas" in group:
            group["betas"] = tuple(group["betas"])
    return {"state": state, "param_groups": groups}


# --- writing and reading ------------------------------------------------------------------------------------


def write_checkpoint(
    final: Path,
    *,
    save_model: Any,
    optimizer_state: dict[str, Any],
    rng_states: list[dict[str, torch.Tensor]],
    trainer_state: dict[str, Any],
) -> Path:
    """Write a complete checkpoint to ``final`` (rank 0 only). ``save_model(dir)`` writes the weights."""
    final.parent.mkdir(parents=True, exist_ok=True)
    temp = final.parent / f".{final.name}.tmp"
    shutil.rmtree(temp, ignore_errors=True)  # a previous crashed attempt
    try:
        temp.mkdir()
        save_model(temp)
        tensors, metadata = flatten_optimizer_state(optimizer_state)
        save_file(tensors, str(temp / OPTIMIZER_NAME), metadata=metadata)
        rng = {
            f"rank{rank}/{name}": t.cpu()
            for rank, states in enumerate(rng_states)
            for name, t in states.items()
        }
        save_file(rng, str(temp / RNG_NAME))
        # Written last: its presence marks the checkpoint complete.
        (temp / STATE_NAME).write_text(json.dumps(trainer_state, indent=2) + "\n", encoding="utf-8")
        _fsync_tree(temp)
        if final.exists():  # re-saving a step (e.g. after resuming from it): swap, never half-delete
            old = final.parent / f".{final.name}.old"
            shutil.rmtree(old, ignore_errors=True)
            os.replace(final, old)
            os.replace(temp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(temp, final)
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise
    return final


def prune_checkpoints(output_dir: Path, keep_last: int) -> None:
    for old in list_checkpoints(output_dir)[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)


def read_trainer_state(path: Path) -> dict[str, Any]:
    file = path / STATE_NAME
    if not file.is_file():
        raise ResumeError(f"{path}: not a complete training checkpoint (no {STATE_NAME})")
    return json.loads(file.read_text(encoding="utf-8"))


def read_rng_state(path: Path, rank: int) -> dict[str, torch.Tensor] | None:
    """This rank's saved RNG states, or None when the checkpoint was written by fewer processes."""
    prefix = f"rank{rank}/"
    with safe_open(str(path / RNG_NAME), framework="pt") as f:
        states = {key[len(prefix) :]: f.get_tensor(key) for key in f.keys() if key.startswith(prefix)}  # noqa: SIM118
    return states or None


def rng_state(device: torch.device) -> dict[str, torch.Tensor]:
    states = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        states["cuda"] = torch.cuda.get_rng_state(device)
    return states


def set_rng_state(states: dict[str, torch.Tensor], device: torch.device) -> None:
    torch.set_rng_state(states["cpu"])
    if device.type == "cuda" and "cuda" in states:
        torch.cuda.set_rng_state(states["cuda"], device)


def _fsync_tree(directory: Path) -> None:
    for file in directory.iterdir():
        with open(file, "rb") as f:
            os.fsync(f.fileno())
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
