"""Resumable checkpoints on disk: weights, optimizer, RNG and progress, written atomically.

    <output_dir>/checkpoints/step-00000500/
        model.safetensors, spec.json, tokenizer.json   zoo.save: a loadable model on its own
        adapter.safetensors                             a LoRA run's adapters (zoo.lora.save)
        optimizer.safetensors                           Adam moments by parameter name; groups in metadata
                                                        (8- / 4-bit moments: their codes and scales)
        rng.safetensors                                 every rank's torch (and CUDA) RNG state
        trainer_state.json                              step, epoch, batch position, elapsed time;
                                                        fp16: the loss scale (``grad_scaler``);
                                                        LoRA: the run's ``lora`` spec

No pickle: tensors go to safetensors and everything else to JSON. Each file is written through
`zoo.io.atomic`, into a directory under a temporary name that is renamed into place once complete, so a
crash mid-save never leaves a checkpoint that looks finished; `latest_checkpoint` only sees complete ones.
A failed write (a full disk) removes the temporary directory and raises one `RunWriteError` naming the
file; the checkpoints already there are untouched.

Resuming trusts no file unread: `checkpoint_problem` checks that every file is there and parses, and that
each safetensors file holds all the bytes its header promises (a truncated copy, a file system that lost
a tail). `resumable_checkpoint` takes the newest checkpoint that passes, logging each one it skips and why.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from zoo.io.atomic import TEMP_SUFFIX, fsync_dir, write_atomic, write_text_atomic
from zoo.io.checkpoint.discovery import open_checkpoint
from zoo.io.checkpoint.files import read_header
from zoo.io.jsonfile import parse_json, read_json_object
from zoo.io.names import (
    ADAPTER_NAME,
    CHECKPOINTS_DIR,
    OPTIMIZER_NAME,
    RNG_NAME,
    SOURCE_TOKENIZER_NAME,
    SPEC_NAME,
    STEP_DIR_PATTERN,
    TOKENIZER_NAME,
    TRAINER_STATE_NAME,
    step_dir_name,
)
from zoo.io.paths import inside
from zoo.training.precision import scaler_state_problem
from zoo.training.run.rundir import option, writing

log = logging.getLogger(__name__)

# trainer_state.json: the progress (`TrainerState.progress`) and the provenance `CheckpointIO` adds (and,
# from an fp16 run, ``grad_scaler``: GradScaler's state as JSON numbers, checked when present).
STATE_KEYS = ("step", "epoch", "position", "elapsed_s", "world_size", "grad_accum")


class ResumeError(ValueError):
    """A checkpoint that cannot be resumed from; the message names it."""


def checkpoint_dir(output_dir: Path, step: int) -> Path:
    return output_dir / CHECKPOINTS_DIR / step_dir_name(step)


def list_checkpoints(output_dir: Path) -> list[Path]:
    """Complete checkpoints under ``output_dir``, oldest first."""
    root = output_dir / CHECKPOINTS_DIR
    if not root.is_dir():
        return []
    found = [
        p for p in root.iterdir() if STEP_DIR_PATTERN.fullmatch(p.name) and (p / TRAINER_STATE_NAME).is_file()
    ]
    return sorted(found, key=lambda p: int(p.name.split("-")[1]))


def latest_checkpoint(output_dir: Path) -> Path | None:
    checkpoints = list_checkpoints(output_dir)
    return checkpoints[-1] if checkpoints else None


def prune_checkpoints(output_dir: Path, keep_last: int) -> None:
    for old in list_checkpoints(output_dir)[:-keep_last]:
        remove_checkpoint(old)


def remove_checkpoint(path: Path) -> None:
    """Delete checkpoint ``path``; a symbolic link to one (made by hand) is unlinked: what it points to may
    lie outside the run and is never deleted (`shutil.rmtree` refuses links, which left them all kept)."""
    if path.is_symlink():
        path.unlink(missing_ok=True)
    else:
        shutil.rmtree(path, ignore_errors=True)


# --- optimizer state as safetensors + JSON ------------------------------------------------------------------


# torchao's quantised optimizer states a checkpoint may hold: class name -> its module. Saved as their own
# parts (codes, scales, lookup table) with the class's few attributes in the metadata, and rebuilt from them:
# exactly the state the optimizer had, never dequantised and quantised again.
_QUANTIZED_STATES = {
    "OptimState8bit": "torchao.optim.subclass_8bit",
    "OptimState4bit": "torchao.optim.subclass_4bit",
}
_PART = "::"  # "<param>/<key>::<part>": one part of a quantised state


def flatten_optimizer_state(state: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """A full optimizer state dict (keyed by parameter name) -> (tensors, JSON metadata)."""
    tensors, scalars, quantized = {}, {}, {}
    for name, values in state["state"].items():
        for key, value in values.items():
            if type(value).__name__ in _QUANTIZED_STATES:
                parts, attributes = value.__tensor_flatten__()
                for part in parts:
                    tensors[f"{name}/{key}{_PART}{part}"] = getattr(value, part).detach().cpu().contiguous()
                quantized[f"{name}/{key}"] = {
                    "class": type(value).__name__,
                    "attributes": [_json_attribute(a) for a in attributes],
                }
            elif isinstance(value, torch.Tensor):
                tensors[f"{name}/{key}"] = value.detach().cpu().contiguous()
            else:
                scalars[f"{name}/{key}"] = value
    groups = [  # torchao keeps the learning rate as a tensor: saved as its number
        {k: v.item() if isinstance(v, torch.Tensor) else v for k, v in group.items()}
        for group in state["param_groups"]
    ]
    metadata = {"param_groups": json.dumps(groups), "scalars": json.dumps(scalars)}
    if quantized:
        metadata["quantized_states"] = json.dumps(quantized)
    return tensors, metadata


def unflatten_optimizer_state(path: Path) -> dict[str, Any]:
    state: dict[str, dict[str, Any]] = {}
    parts: dict[str, dict[str, torch.Tensor]] = {}
    with safe_open(str(path), framework="pt") as f:
        metadata = f.metadata() or {}
        for key in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
            if _PART in key:
                whole, _, part = key.rpartition(_PART)
                parts.setdefault(whole, {})[part] = f.get_tensor(key)
                continue
            name, _, field = key.rpartition("/")
            state.setdefault(name, {})[field] = f.get_tensor(key)
    quantized = parse_json(metadata.get("quantized_states", "{}"), where=f"{path}: quantized_states")
    for whole, record in quantized.items():
        name, _, field = whole.rpartition("/")
        state.setdefault(name, {})[field] = _quantized_state(path, whole, record, parts.get(whole, {}))
    for key, value in parse_json(metadata.get("scalars", "{}"), where=f"{path}: scalars").items():
        name, _, field = key.rpartition("/")
        state.setdefault(name, {})[field] = value
    groups = parse_json(metadata["param_groups"], where=f"{path}: param_groups")
    for group in groups:  # JSON turned tuples into lists; Adam unpacks betas either way, but keep the type
        if "betas" in group:
            group["betas"] = tuple(group["betas"])
    return {"state": state, "param_groups": groups}


def _json_attribute(value: Any) -> Any:
    """A quantised state's attribute (a flag, a shape, a dtype) as JSON."""
    if isinstance(value, torch.dtype):
        return {"dtype": str(value).removeprefix("torch.")}
    if isinstance(value, tuple | list):  # torch.Size too
        return {"shape": [int(v) for v in value]}
    return value


def _quantized_state(path: Path, whole: str, record: Any, parts: dict[str, torch.Tensor]) -> torch.Tensor:
    """torchao's quantised optimizer state rebuilt from its saved parts and attributes."""
    name = record.get("class") if isinstance(record, dict) else None
    if name not in _QUANTIZED_STATES:
        raise ResumeError(f"{path}: {whole} is a quantised optimizer state of unknown kind {name!r}")
    import importlib

    cls = getattr(importlib.import_module(_QUANTIZED_STATES[name]), name)
    attributes = []
    for value in record.get("attributes", []):
        if isinstance(value, dict) and "dtype" in value:
            value = getattr(torch, str(value["dtype"]))
        elif isinstance(value, dict) and "shape" in value:
            value = tuple(value["shape"])
        attributes.append(value)
    missing = [part for part in cls.tensor_attrs if part not in parts]
    if missing:
        raise ResumeError(f"{path}: {whole} lacks its part(s) {', '.join(missing)}")
    return cls.__tensor_unflatten__(parts, attributes, None, None)


# --- writing and reading ------------------------------------------------------------------------------------


def write_checkpoint(
    final: Path,
    *,
    save_model: Callable[[Path], object],
    optimizer_state: dict[str, Any],
    rng_states: list[dict[str, torch.Tensor]],
    trainer_state: dict[str, Any],
) -> Path:
    """Write a complete checkpoint to ``final`` (rank 0 only). ``save_model(dir)`` writes the weights and
    tokenizer(s) (zoo.save and Tokenizer.save write atomically too, so every file is durable)."""
    # One temporary directory, renamed as a whole: `zoo.io.atomic` makes files atomic, not folders.
    temp = final.parent / f".{final.name}{TEMP_SUFFIX}"
    kept = [p.name for p in list_checkpoints(final.parent.parent) if p != final]
    if kept:
        hint = f"this checkpoint was not kept and the checkpoints before it ({', '.join(kept)}) are intact: "
        hint += f"free some space (or fix the cause), then continue from the last ({option('resume')})"
    else:
        hint = "this checkpoint was not kept and there is no other to resume from: free some space (or fix "
        hint += f"the cause), then start over ({option('overwrite')})"
    try:
        with writing(final, hint=hint):
            final.parent.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(temp, ignore_errors=True)  # a previous crashed attempt
            temp.mkdir()
        with writing(f"{final} (its model and tokenizer)", hint=hint):
            save_model(temp)
        tensors, metadata = flatten_optimizer_state(optimizer_state)
        with writing(final / OPTIMIZER_NAME, hint=hint):
            write_atomic(temp / OPTIMIZER_NAME, lambda path: save_file(tensors, str(path), metadata=metadata))
        rng = {
            f"rank{rank}/{name}": t.cpu()
            for rank, states in enumerate(rng_states)
            for name, t in states.items()
        }
        with writing(final / RNG_NAME, hint=hint):
            write_atomic(temp / RNG_NAME, lambda path: save_file(rng, str(path)))
        # Written last: its presence marks the checkpoint complete.
        with writing(final / TRAINER_STATE_NAME, hint=hint):
            write_text_atomic(temp / TRAINER_STATE_NAME, json.dumps(trainer_state, indent=2) + "\n")
        with writing(final, hint=hint):
            if final.exists():  # re-saving a step (e.g. after resuming from it): swap, never half-delete
                old = final.parent / f".{final.name}.old"
                remove_checkpoint(old)
                os.replace(final, old)
                os.replace(temp, final)
                remove_checkpoint(old)
            else:
                os.replace(temp, final)
            fsync_dir(final.parent)
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise
    return final


def read_trainer_state(path: Path) -> dict[str, Any]:
    file = path / TRAINER_STATE_NAME
    if not file.is_file():
        raise ResumeError(f"{path}: not a complete training checkpoint (no {TRAINER_STATE_NAME})")
    state = read_json_object(file, error=ResumeError)
    bad = [key for key in STATE_KEYS if not _is_number(state.get(key))]
    if bad:
        raise ResumeError(f"{file}: incomplete: no valid {', '.join(bad)}")
    if "grad_scaler" in state and (problem := scaler_state_problem(state["grad_scaler"])) is not None:
        raise ResumeError(f"{file}: {problem}")
    return state


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


# --- choosing a checkpoint to resume from ------------------------------------------------------------------


def checkpoint_problem(path: Path) -> str | None:
    """Why checkpoint ``path`` cannot be resumed from, or None when it verifies: every file there and
    parseable, every safetensors file holding all its tensors' bytes (headers only: nothing is loaded)."""
    if not path.is_dir():
        return "no such directory" if not path.exists() else "not a directory"
    needed = (TRAINER_STATE_NAME, SPEC_NAME, OPTIMIZER_NAME, RNG_NAME)  # and the tokenizer, unless images
    try:  # no file read on resume may be a link out of the checkpoint (`zoo.io.paths`)
        for name in (*needed, TOKENIZER_NAME, ADAPTER_NAME, SOURCE_TOKENIZER_NAME):
            inside(path, name, error=ResumeError)
    except ResumeError as error:
        return str(error).replace(f"{path}{os.sep}", "")
    missing = [name for name in needed if not (path / name).is_file()]
    if missing:
        return f"{', '.join(missing)} missing"
    try:
        state = read_trainer_state(path)
        text = state.get("tokenizer", True) is not False  # a run that reads no text saved none
        if text and not (path / TOKENIZER_NAME).is_file():
            return f"{TOKENIZER_NAME} missing"
        if state.get("lora") is not None:  # a LoRA run's checkpoint: its adapters are what a resume loads
            if not (path / ADAPTER_NAME).is_file():
                return f"{ADAPTER_NAME} missing"
            read_header(path / ADAPTER_NAME)
        read_json_object(path / SPEC_NAME, error=ResumeError)
        if text:
            read_json_object(path / TOKENIZER_NAME, error=ResumeError)
        open_checkpoint(path)  # the weights: headers, sizes and spec
        metadata, _ = read_header(path / OPTIMIZER_NAME)
        groups = parse_json(metadata.get("param_groups", "null"), where=f"{OPTIMIZER_NAME}: param_groups")
        if not isinstance(groups, list):
            return f"{OPTIMIZER_NAME}: no parameter groups in its metadata"
        parse_json(metadata.get("scalars", "{}"), where=f"{OPTIMIZER_NAME}: scalars")
        read_header(path / RNG_NAME)
    except (ValueError, OSError) as error:  # CheckpointError and ResumeError are ValueErrors
        return str(error).replace(f"{path}{os.sep}", "").replace(f"{path}: ", "")
    return None


def resumable_checkpoint(output_dir: Path) -> Path:
    """The newest checkpoint under ``output_dir`` that verifies (`checkpoint_problem`); each newer one
    skipped is logged with its problem. A `ResumeError` lists them all when none verifies."""
    candidates = list_checkpoints(output_dir)[::-1]
    if not candidates:
        raise ResumeError(
            f"{output_dir}: no complete checkpoint to resume from; start over ({option('overwrite')}), or resume "
            f"from a checkpoint elsewhere ({option('resume', 'PATH')})"
        )
    problems: list[str] = []
    for path in candidates:
        problem = checkpoint_problem(path)
        if problem is None:
            for skipped in problems:
                log.warning("resuming from %s; skipped the newer %s", path, skipped)
            return path
        problems.append(f"{path.name} ({problem})")
    raise ResumeError(
        f"{output_dir}: none of its checkpoints can be resumed from: {'; '.join(problems)}. Resume from a "
        f"copy of a good checkpoint ({option('resume', 'PATH')}), or start over ({option('overwrite')})"
    )


def read_rng_state(path: Path, rank: int) -> dict[str, torch.Tensor] | None:
    """This rank's saved RNG states, or None when the checkpoint was written by fewer processes."""
    prefix = f"rank{rank}/"
    with safe_open(str(path / RNG_NAME), framework="pt") as f:
        states = {key[len(prefix) :]: f.get_tensor(key) for key in f.keys() if key.startswith(prefix)}  # noqa: SIM118
    return states or None
