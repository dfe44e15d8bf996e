"""zoo's own checkpoint format: safetensors weights with the spec in their metadata (DESIGN.md, section 5).

    zoo.save(model, "runs/mt")                      # runs/mt/model.safetensors + runs/mt/spec.json
    model = zoo.load("runs/mt")                     # or "runs/mt/model.safetensors": the spec is inside
    model = zoo.load("runs/mt", device="cuda", dtype=torch.bfloat16)
    model, report = zoo.load("runs/mt", strict=False, return_report=True)

Saving writes every file to a temp file in the same directory, fsyncs it and renames it into place:
weights first, then the index (when sharded), the tokenizer and spec.json, and only then removes what the
previous checkpoint there left behind. A failed save leaves the old checkpoint loadable.

Loading reads only safetensors (never pickle). It checks every header, the spec and every name and shape
before reading any tensor data, builds the model on the ``meta`` device, reads each tensor straight onto
the target device (cast to ``dtype`` if floating point) and assigns it, so no second full copy is made;
then it recomputes the fixed tables (sinusoids, rotary angles, ALiBi slopes) on the target device.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from zoo.devices import resolve_device
from zoo.io.checkpoint_files import (
    INDEX_NAME,
    SHARD_PATTERN,
    SPEC_NAME,
    TOKENIZER_NAME,
    WEIGHTS_NAME,
    CheckpointError,
    CheckpointNotFoundError,
    fsync_dir,
    parse_size,
    plan_shards,
    remove_quietly,
    shard_name,
    unique_tensors,
    write_temp,
    write_text_atomic,
)
from zoo.io.checkpoint_layout import (
    Checkpoint,
    LoadReport,
    checkpoint_metadata,
    index_document,
    open_checkpoint,
)
from zoo.models import ZooModel, build_model

if TYPE_CHECKING:
    from zoo.io.tokenizer import Tokenizer
    from zoo.spec import ModelSpec

__all__ = [
    "CheckpointError",
    "CheckpointNotFoundError",
    "LoadReport",
    "load",
    "load_tokenizer",
    "read_spec",
    "save",
]

logger = logging.getLogger(__name__)


def save(
    model: ZooModel, path: str | os.PathLike[str], *, tokenizer: Any = None, max_shard_size: int | str = "2GB"
) -> Path:
    """Write ``model`` to the directory ``path``; returns the directory.

    ``path/model.safetensors`` holds every tensor once, with ``{"format": "zoo", "format_version": "1",
    "spec": <spec JSON>}`` in its metadata, and ``path/spec.json`` the same spec indented. Above
    ``max_shard_size`` (bytes, or e.g. ``"500MB"``, ``"2GB"``) the weights go to
    ``model-00001-of-0000N.safetensors`` shards plus ``model.safetensors.index.json``. ``tokenizer`` (a
    `zoo.Tokenizer`) is saved as ``path/tokenizer.json``. The model is saved in its own dtype.
    """
    directory = Path(path).expanduser()
    if directory.suffix == ".safetensors" or (directory.exists() and not directory.is_dir()):
        raise CheckpointError(
            f"{directory}: zoo.save writes a directory (model.safetensors + spec.json); pass one"
        )
    spec = getattr(model, "spec", None)
    if not isinstance(model, torch.nn.Module) or spec is None:
        raise CheckpointError(f"zoo.save needs a zoo model (with a .spec), got {type(model).__name__}")
    tokenizer = _as_tokenizer(tokenizer)
    limit = parse_size(max_shard_size)
    tensors, aliases = unique_tensors(model.state_dict())
    metadata = checkpoint_metadata(spec, checkpoint_id=uuid.uuid4().hex, aliases=aliases)
    sizes = {name: t.numel() * t.element_size() for name, t in tensors.items()}
    groups = plan_shards(sizes, limit)
    names = [WEIGHTS_NAME] if len(groups) == 1 else [shard_name(i, len(groups)) for i in range(len(groups))]
    directory.mkdir(parents=True, exist_ok=True)

    files = {names[i]: {name: tensors[name] for name in group} for i, group in enumerate(groups)}
    _write_weights(directory, files, metadata)  # 1. the weights; a failure here changes nothing

    # 2. The commit point: the index (sharded), or no index (single file; zoo.load prefers an index).
    if len(files) > 1:
        weight_map = {name: file for file, part in files.items() for name in part}
        index = index_document(spec, metadata, weight_map, total_size=sum(sizes.values()))
        write_text_atomic(directory / INDEX_NAME, json.dumps(index, indent=2) + "\n")
    else:
        remove_quietly(directory / INDEX_NAME)

    # 3. Files for people and tools, then the previous checkpoint's leftovers.
    if tokenizer is not None:
        tokenizer.save(directory / TOKENIZER_NAME)
    write_text_atomic(directory / SPEC_NAME, spec.to_json(indent=2) + "\n")
    if len(files) > 1:
        remove_quietly(directory / WEIGHTS_NAME)
    for stale in directory.iterdir():
        if SHARD_PATTERN.fullmatch(stale.name) and stale.name not in names:
            remove_quietly(stale)
    fsync_dir(directory)
    return directory


def read_spec(path: str | os.PathLike[str]) -> ModelSpec:
    """The spec of a checkpoint (directory, ``.safetensors`` file or index), reading headers only."""
    return open_checkpoint(path).spec


def load(
    path: str | os.PathLike[str],
    *,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
    strict: bool = True,
    return_report: bool = False,
) -> ZooModel | tuple[ZooModel, LoadReport]:
    """The model saved at ``path`` (a checkpoint directory, its ``model.safetensors`` or its index), in eval mode.

    ``device``: where the tensors go (default CPU; ``"auto"``: CUDA when available); asking for a device
    that is not there (``"cuda"`` without CUDA) is a `ValueError`, raised before anything is read.
    ``dtype``: cast floating-point tensors (integer and bool tensors keep theirs); default: as saved.
    ``strict`` (default): any missing, unexpected or shape-mismatched tensor raises one `CheckpointError`
    naming them all. ``strict=False`` loads the tensors that fit, leaves the missing ones freshly
    initialised, and logs a warning; pass ``return_report=True`` to get ``(model, LoadReport)`` with the
    ``missing`` / ``unexpected`` / ``mismatched`` names.
    """
    # Checked first: without it, CUDA's absence surfaced from deep in safetensors (a pin_memory error).
    device = resolve_device(device if device is not None else "cpu")
    checkpoint = open_checkpoint(path)
    spec = checkpoint.spec
    model = build_model(spec, device="meta", init=False)
    expected = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    report = checkpoint.compare(expected)
    if strict and not report.ok:
        raise CheckpointError(
            f"{checkpoint.source}: the tensors do not fit the spec ({spec.name or spec.family}):\n{report}"
        )
    if not report.ok:
        logger.warning("%s: loaded with strict=False:\n%s", checkpoint.source, report)
    not_loaded = {*report.missing, *report.mismatched_names}
    matched = [name for name in expected if name not in not_loaded]
    if report.missing or report.mismatched:
        # The tensors not loaded need values: build for real (initialised) and copy the rest in, one by one.
        model = build_model(spec, device=device, dtype=dtype or checkpoint.floating_dtype())
        targets = model.state_dict()
        with torch.no_grad():
            for name, tensor in _read_tensors(checkpoint, matched, device=device, dtype=dtype):
                targets[name].copy_(tensor)
    else:
        # Names and shapes were checked above; `assign` adopts the tensors just read, no second copy.
        model.load_state_dict(
            dict(_read_tensors(checkpoint, matched, device=device, dtype=dtype)), assign=True
        )
        _materialize_buffers(model, device)
    _retie(model, checkpoint.aliases, loaded=set(matched))
    model.reset_buffers()
    _check_placed(model, checkpoint.source)
    model.eval()
    return (model, report) if return_report else model


def load_tokenizer(path: str | os.PathLike[str]) -> Tokenizer:
    """The ``tokenizer.json`` saved beside a checkpoint (``path``: the directory or a file in it)."""
    from zoo.io.tokenizer import Tokenizer

    path = Path(path).expanduser()
    if not path.exists():
        raise CheckpointNotFoundError(f"{path}: no such checkpoint (file or directory not found)")
    directory = path if path.is_dir() else path.parent
    file = directory / TOKENIZER_NAME
    if not file.is_file():
        raise CheckpointNotFoundError(
            f"{directory}: no {TOKENIZER_NAME} in this checkpoint (save one with zoo.save(model, dir, tokenizer=...))"
        )
    try:
        return Tokenizer.from_file(file)
    except ValueError as error:
        raise CheckpointError(str(error)) from None


# -- helpers -------------------------------------------------------------------------------------------------


def _as_tokenizer(tokenizer: Any) -> Tokenizer | None:
    """A zoo Tokenizer (a bare ``tokenizers.Tokenizer`` is wrapped), checked before anything is written."""
    if tokenizer is None:
        return None
    from tokenizers import Tokenizer as HFTokenizer

    from zoo.io.tokenizer import Tokenizer

    if isinstance(tokenizer, HFTokenizer):
        return Tokenizer(tokenizer)
    if not isinstance(tokenizer, Tokenizer):
        raise CheckpointError(f"zoo.save: tokenizer must be a zoo.Tokenizer, got {type(tokenizer).__name__}")
    return tokenizer


def _write_weights(
    directory: Path, files: dict[str, dict[str, torch.Tensor]], metadata: dict[str, str]
) -> None:
    """Write every weights file to a temp file, and only when all are written rename them into place."""
    temps: list[tuple[Path, Path]] = []
    try:
        for file, part in files.items():
            write = functools.partial(_save_part, part=part, metadata=metadata)
            temps.append((write_temp(directory / file, write), directory / file))
        while temps:
            os.replace(*temps[0])
            temps.pop(0)
    finally:
        for temp, _ in temps:
            remove_quietly(temp)
    fsync_dir(directory)


def _save_part(temp: Path, *, part: dict[str, torch.Tensor], metadata: dict[str, str]) -> None:
    save_file(part, str(temp), metadata=metadata)  # looked up at call time: tests patch it to fail mid-write


def _read_tensors(
    checkpoint: Checkpoint, names: list[str], *, device: torch.device, dtype: torch.dtype | None
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (name, tensor) read straight onto ``device``, floating point cast to ``dtype``, file by file."""
    by_file: dict[Path, list[str]] = {}
    for name in names:
        stored = checkpoint.aliases.get(name, name)
        by_file.setdefault(checkpoint.tensors[stored][0], []).append(name)
    for file, file_names in by_file.items():
        try:
            with safe_open(str(file), framework="pt", device=str(device)) as f:
                read: dict[str, torch.Tensor] = {}
                for name in file_names:
                    stored = checkpoint.aliases.get(name, name)
                    if stored not in read:
                        tensor = f.get_tensor(stored)
                        read[stored] = tensor.to(dtype) if dtype and tensor.is_floating_point() else tensor
                    yield name, read[stored]
        except Exception as error:  # safetensors raises its own (Rust) error type for bad files
            if isinstance(error, CheckpointError):
                raise
            raise CheckpointError(f"{file}: cannot read tensors: {error}") from None


def _materialize_buffers(model: torch.nn.Module, device: torch.device) -> None:
    """Give the non-persistent buffers (still meta: not in the file) storage on ``device`` to recompute into."""
    for module in model.modules():
        for name, buffer in module._buffers.items():
            if buffer is not None and buffer.is_meta:
                module._buffers[name] = torch.empty_like(buffer, device=device)


def _retie(model: torch.nn.Module, aliases: dict[str, str], *, loaded: set[str]) -> None:
    """Make each loaded alias the very same Parameter/buffer as the tensor it was saved as (ties survive)."""
    for alias, kept in aliases.items():
        if alias not in loaded:
            continue
        owner, _, leaf = alias.rpartition(".")
        kept_owner, _, kept_leaf = kept.rpartition(".")
        setattr(model.get_submodule(owner), leaf, getattr(model.get_submodule(kept_owner), kept_leaf))


def _check_placed(model: torch.nn.Module, source: Path) -> None:
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        if tensor.is_meta:
            raise CheckpointError(
                f"{source}: {name} has no value after loading (a fixed table whose module lacks reset_buffers?)"
            )
