"""`zoo.save`: a model (and optionally its tokenizer) to a checkpoint directory, without ever breaking one.

Saving writes every file to a temp file in the same directory, fsyncs it and renames it into place
(`zoo.io.atomic`): weights first, then the index (when sharded), the tokenizer and spec.json, and only then
removes what the previous checkpoint there left behind. A failed save leaves the old checkpoint loadable.
"""

from __future__ import annotations

import functools
import json
import os
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors.torch import save_file

from zoo.io.atomic import fsync_dir, remove_quietly, write_temp, write_text_atomic
from zoo.io.checkpoint.files import CheckpointError, parse_size, plan_shards, unique_tensors
from zoo.io.checkpoint.layout import checkpoint_metadata, index_document
from zoo.io.names import INDEX_NAME, SHARD_PATTERN, SPEC_NAME, TOKENIZER_NAME, WEIGHTS_NAME, shard_name

if TYPE_CHECKING:
    from zoo.io.tokenizer import Tokenizer
    from zoo.models import ZooModel

__all__ = ["save"]


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
