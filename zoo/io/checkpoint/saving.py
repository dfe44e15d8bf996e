"""`zoo.save`: a model (and optionally its tokenizer) to a checkpoint directory, without ever breaking one.

Every file is written in a private temp folder in the same directory, fsynced and renamed into place
(`zoo.io.atomic`), and the switch from the previous checkpoint to the new one is ONE step, the commit:

    0. remove the temp folders of earlier killed saves (only zoo's own names)
    1. write the new weights under names no current file has: model.safetensors (read only once no
       index is left, see discovery.py), or shards named with this save's own tag
    2. commit   sharded: write model.safetensors.index.json (one rename): the loader reads the new shards
                single:  remove model.safetensors.index.json (one unlink): the loader reads model.safetensors
                         (with no index there, the rename in step 1 was the commit)
    3. tokenizer.json and tokenizer_config.json (its special tokens and chat template), generation_config.json
       (the generation settings the model carries, `zoo.io.generation_file`), then spec.json (a copy for
       people and tools; the loader reads the spec in the weights)
    4. remove the previous checkpoint's files: model.safetensors beside a new index, and every shard the
       new index does not name

Killed at any point, the directory loads as the previous checkpoint (before the commit) or the new one
(after it), never a mix; the leftovers (temp files, unreferenced shards) are removed by the next save.
"""

from __future__ import annotations

import functools
import json
import os
import re
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors.torch import save_file

from zoo.generation.weight_layout import row_major
from zoo.io.atomic import (
    discard_temp,
    fsync_dir,
    move_into_place,
    remove_quietly,
    remove_stale_temps,
    write_temp,
    write_text_atomic,
)
from zoo.io.checkpoint.discovery import checkpoint_metadata, index_document
from zoo.io.checkpoint.files import CheckpointError, parse_size, plan_shards, unique_tensors
from zoo.io.generation_file import write_generation_file
from zoo.io.names import (
    GENERATION_CONFIG_NAME,
    INDEX_NAME,
    SHARD_PATTERN,
    SPEC_NAME,
    TOKENIZER_CONFIG_NAME,
    TOKENIZER_NAME,
    WEIGHTS_NAME,
    shard_name,
)
from zoo.quant.state import quantized_state

if TYPE_CHECKING:
    from zoo.io.tokenizer import Tokenizer
    from zoo.models import ZooModel

__all__ = ["save"]

# The files a save writes, hence the temp files a killed one may leave: `remove_stale_temps` removes those.
_OWN_FILES = re.compile(
    "|".join(
        map(
            re.escape,
            (
                WEIGHTS_NAME,
                INDEX_NAME,
                SPEC_NAME,
                TOKENIZER_NAME,
                TOKENIZER_CONFIG_NAME,
                GENERATION_CONFIG_NAME,
            ),
        )
    )
    + "|"
    + SHARD_PATTERN.pattern
)


def save(
    model: ZooModel, path: str | os.PathLike[str], *, tokenizer: Any = None, max_shard_size: int | str = "2GB"
) -> Path:
    """Write ``model`` to the directory ``path``; returns the directory.

    ``path/model.safetensors`` holds every tensor once, with ``{"format": "zoo", "format_version": "1",
    "spec": <spec JSON>}`` in its metadata, and ``path/spec.json`` the same spec indented. Above
    ``max_shard_size`` (bytes, or e.g. ``"500MB"``, ``"2GB"``) the weights go to
    ``model-00001-of-0000N-<tag>.safetensors`` shards (``<tag>``: 8 hex digits of this save's
    ``checkpoint_id``) plus ``model.safetensors.index.json``. ``tokenizer`` (a `zoo.Tokenizer`) is saved as
    ``path/tokenizer.json`` and ``path/tokenizer_config.json`` (its special tokens, ``model_max_length`` and
    chat template, which `zoo.load_tokenizer` reads back). The ``generation_config.json`` the model carries
    (read by `zoo.from_hf` or `zoo.load`: Whisper's prompt and suppressed tokens) is written as it was read,
    and an earlier one removed when it carries none. The model is saved in its own dtype.

    Overwriting a checkpoint switches from the old one to the new one in one step: killed at any moment, the
    directory loads as exactly one of them (module docstring). One save per directory at a time.
    """
    directory = Path(path).expanduser()
    if directory.suffix == ".safetensors" or (directory.exists() and not directory.is_dir()):
        raise CheckpointError(
            f"{directory}: zoo.save writes a directory (model.safetensors + spec.json); pass one"
        )
    spec = getattr(model, "spec", None)
    if not isinstance(model, torch.nn.Module) or spec is None:
        raise CheckpointError(f"zoo.save needs a zoo model (with a .spec), got {type(model).__name__}")
    # io sits below zoo.lora, so its wrapper is recognised by class name: its tensors fit no spec.
    if any(type(module).__name__ == "LoraLinear" for module in model.modules()):
        raise CheckpointError(
            "zoo.save: the model has LoRA adapters: save them with zoo.lora.save, or fold them in with "
            "zoo.lora.merge_and_unload first"
        )
    tokenizer = _as_tokenizer(tokenizer)
    limit = parse_size(max_shard_size)
    row_major(model)  # contiguous in place, one matrix at a time, not a copy of all (weight_layout.py)
    state, quantization = quantized_state(model, error=CheckpointError)  # int8/int4 weights as plain parts
    tensors, aliases = unique_tensors(state)
    sizes = {name: t.numel() * t.element_size() for name, t in tensors.items()}
    groups = plan_shards(sizes, limit)
    directory.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(directory, _OWN_FILES)  # 0. what killed saves left
    checkpoint_id, names = _new_names(directory, len(groups))
    metadata = checkpoint_metadata(
        spec, checkpoint_id=checkpoint_id, aliases=aliases, quantization=quantization
    )

    files = {names[i]: {name: tensors[name] for name in group} for i, group in enumerate(groups)}
    _write_weights(directory, files, metadata)  # 1. the new weights; the old checkpoint is untouched

    # 2. The commit: the one step that switches the loader from the old checkpoint to the new one.
    if len(files) > 1:
        weight_map = {name: file for file, part in files.items() for name in part}
        index = index_document(spec, metadata, weight_map, total_size=sum(sizes.values()))
        write_text_atomic(directory / INDEX_NAME, json.dumps(index, indent=2) + "\n")
    elif (directory / INDEX_NAME).exists():
        remove_quietly(directory / INDEX_NAME)
        fsync_dir(directory)  # durable before step 4 removes the shards it named

    # 3. Files for people and tools.
    if tokenizer is not None:
        tokenizer.save(directory / TOKENIZER_NAME)
        tokenizer.save_config(directory / TOKENIZER_CONFIG_NAME)
    write_generation_file(directory, model)
    write_text_atomic(directory / SPEC_NAME, spec.to_json(indent=2) + "\n")

    # 4. The previous checkpoint's files, now unreferenced.
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


def _new_names(directory: Path, count: int) -> tuple[str, list[str]]:
    """(checkpoint_id, weights file names) for a save of ``count`` files: ``model.safetensors``, or shards
    tagged with the id's first 8 hex digits, none of them already in ``directory``."""
    while True:
        checkpoint_id = uuid.uuid4().hex
        if count == 1:
            return checkpoint_id, [WEIGHTS_NAME]
        names = [shard_name(i, count, checkpoint_id[:8]) for i in range(count)]
        if not any((directory / name).exists() or (directory / name).is_symlink() for name in names):
            return checkpoint_id, names


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
            move_into_place(*temps[0])
            temps.pop(0)
    finally:
        for temp, _ in temps:
            discard_temp(temp)
    fsync_dir(directory)


def _save_part(temp: Path, *, part: dict[str, torch.Tensor], metadata: dict[str, str]) -> None:
    save_file(part, str(temp), metadata=metadata)  # looked up at call time: tests patch it to fail mid-write
