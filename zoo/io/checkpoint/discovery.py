"""Finding and checking a zoo checkpoint on disk, headers only: which files, which spec, which tensors.

`open_checkpoint` accepts a checkpoint directory, its ``model.safetensors``, or its
``model.safetensors.index.json``. A directory holding both an index and a single file is read through the
index: that precedence is what makes every `zoo.save` switch from the old checkpoint to the new one in one
step (writing the index switches to shards, removing it switches to the single file; see saving.py). Every
problem is a `CheckpointError` naming the file: nothing here reads tensor data, so a bad checkpoint fails
before any memory is spent on it. An index may name only plain file names in its own directory, checked
before any of them is opened.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from pydantic import ValidationError

from zoo.io.checkpoint.files import (
    FORMAT_NAME,
    FORMAT_VERSION,
    CheckpointError,
    CheckpointNotFoundError,
    TensorInfo,
    read_header,
)
from zoo.io.checkpoint.limits import zoo_layers_held
from zoo.io.jsonfile import parse_json, read_json
from zoo.io.names import CONFIG_NAME, INDEX_NAME, SHARD_PATTERN, WEIGHTS_NAME, is_plain_file_name
from zoo.io.paths import inside
from zoo.quant.record import Quantization
from zoo.quant.state import logical_shapes, part_names
from zoo.spec import ModelSpec, parse_spec
from zoo.spec.presets import format_validation_error

_HF_HINT = "a Hugging Face checkpoint? import it with zoo.from_hf or `zoo convert --from-hf`"


@dataclass(frozen=True)
class LoadReport:
    """What did not fit when loading: tensor names, sorted. Returned by ``zoo.load(..., return_report=True)``."""

    missing: tuple[str, ...] = ()  # the spec's model has them, the checkpoint does not
    unexpected: tuple[str, ...] = ()  # the checkpoint has them, the spec's model does not
    mismatched: tuple[
        tuple[str, tuple[int, ...], tuple[int, ...]], ...
    ] = ()  # (name, file shape, model shape)

    @property
    def ok(self) -> bool:
        """True when every tensor was loaded and none was left over."""
        return not (self.missing or self.unexpected or self.mismatched)

    @property
    def mismatched_names(self) -> tuple[str, ...]:
        return tuple(name for name, _, _ in self.mismatched)

    def __str__(self) -> str:
        lines = []
        if self.missing:
            lines.append(f"  missing from the checkpoint ({len(self.missing)}): {', '.join(self.missing)}")
        if self.unexpected:
            lines.append(f"  not in the model ({len(self.unexpected)}): {', '.join(self.unexpected)}")
        for name, file_shape, model_shape in self.mismatched:
            lines.append(
                f"  shape mismatch: {name}: checkpoint {list(file_shape)}, model {list(model_shape)}"
            )
        return "\n".join(lines) or "  every tensor loaded"


@dataclass(frozen=True)
class Checkpoint:
    """A checked checkpoint: its spec and where each stored tensor lives. No tensor data is read."""

    source: Path  # the weights file or the index: what messages name
    spec: ModelSpec
    tensors: dict[str, tuple[Path, TensorInfo]]  # stored name -> (file, dtype and shape)
    aliases: dict[str, str]  # a name saved once under another: alias -> stored name
    quantization: Quantization | None = None  # zoo.quant's record: which weights are stored as parts

    def compare(self, expected: Mapping[str, tuple[int, ...]]) -> LoadReport:
        """Names and shapes of the checkpoint against ``expected`` (a model's state-dict shapes)."""
        shapes = self.model_shapes()
        shapes |= {alias: shapes[kept] for alias, kept in self.aliases.items() if kept in shapes}
        return LoadReport(
            missing=tuple(sorted(set(expected) - set(shapes))),
            unexpected=tuple(sorted(set(shapes) - set(expected))),
            mismatched=tuple(
                (name, shapes[name], shape)
                for name, shape in sorted(expected.items())
                if name in shapes and shapes[name] != shape
            ),
        )

    def model_shapes(self) -> dict[str, tuple[int, ...]]:
        """Stored shapes under the model's names: a quantised weight's parts count as the weight (N, K)."""
        shapes = {name: info.shape for name, (_, info) in self.tensors.items()}
        if self.quantization is None:
            return shapes
        parts = part_names(self.quantization)
        infos = {name: (info.dtype, info.shape) for name, (_, info) in self.tensors.items()}
        quantized = logical_shapes(self.quantization, infos, where=str(self.source), error=CheckpointError)
        return {name: shape for name, shape in shapes.items() if name not in parts} | quantized

    def floating_dtype(self) -> torch.dtype | None:
        """The dtype most floating-point elements are stored in (what the model was saved in), if any."""
        elements: Counter[torch.dtype] = Counter()
        parts = part_names(self.quantization) if self.quantization else {}
        for name, (_, info) in self.tensors.items():
            if info.dtype.is_floating_point and name not in parts:  # a quantised weight's scales do not count
                elements[info.dtype] += info.numel
        return elements.most_common(1)[0][0] if elements else None

    @property
    def elements(self) -> int:
        """Tensor elements stored in the file(s)."""
        return sum(info.numel for _, info in self.tensors.values())

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {name: info.shape for name, (_, info) in self.tensors.items()}

    def layers_held(self) -> dict[str, set[int]]:
        """For each stack of the spec, the layer indices the file holds tensors for (aliases count)."""
        names = [*self.tensors, *self.aliases]
        return {stack: zoo_layers_held(names, stack) for stack in self.spec.stacks()}


def checkpoint_metadata(
    spec: ModelSpec,
    *,
    checkpoint_id: str,
    aliases: Mapping[str, str],
    quantization: Quantization | None = None,
) -> dict[str, str]:
    """The safetensors metadata of every weights file of one save. ``checkpoint_id`` ties shards together;
    ``quantization``: zoo.quant's record of a quantised model (its weights stored as parts)."""
    metadata = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "checkpoint_id": checkpoint_id,
        "spec": spec.to_json(),
    }
    metadata |= {"quantization": quantization.to_json()} if quantization else {}
    return metadata | ({"aliases": json.dumps(dict(aliases))} if aliases else {})


def index_document(
    spec: ModelSpec, metadata: Mapping[str, str], weight_map: dict[str, str], *, total_size: int
) -> dict[str, Any]:
    """``model.safetensors.index.json`` as Hugging Face writes it, plus the spec (readable) and our metadata."""
    index_metadata: dict[str, Any] = {
        k: v for k, v in metadata.items() if k not in ("spec", "aliases", "quantization")
    }
    index_metadata["total_size"] = total_size  # bytes of tensor data, as in Hugging Face's index
    for key in ("aliases", "quantization"):  # JSON in the file's metadata, readable objects in the index
        if key in metadata:
            index_metadata[key] = parse_json(metadata[key], where=f"metadata {key}")
    index_metadata["spec"] = spec.model_dump(mode="json")
    return {"metadata": index_metadata, "weight_map": weight_map}


def open_checkpoint(path: str | os.PathLike[str]) -> Checkpoint:
    """Find and check the checkpoint at ``path`` (directory, ``.safetensors`` file or index)."""
    path = Path(path).expanduser()
    if not path.exists():
        raise CheckpointNotFoundError(f"{path}: no such checkpoint (file or directory not found)")
    if path.is_dir():
        for name, opener in ((INDEX_NAME, _open_sharded), (WEIGHTS_NAME, _open_single)):
            if (path / name).is_file():
                return opener(inside(path, name, error=CheckpointError))
        hint = f"; it has a {CONFIG_NAME}: {_HF_HINT}" if (path / CONFIG_NAME).is_file() else ""
        raise CheckpointNotFoundError(
            f"{path}: no weights here (expected {WEIGHTS_NAME} or {INDEX_NAME}){hint}"
        )
    if path.name.endswith(".json"):
        return _open_sharded(path)
    if SHARD_PATTERN.fullmatch(path.name):
        raise CheckpointError(
            f"{path}: one shard of a sharded checkpoint; load its directory or {INDEX_NAME}"
        )
    return _open_single(path)


def _open_single(file: Path) -> Checkpoint:
    metadata, infos = _read_header(file)
    checkpoint = Checkpoint(
        source=file,
        spec=_spec(file, metadata),
        tensors={name: (file, info) for name, info in infos.items()},
        aliases=_aliases(file, metadata.get("aliases"), stored=set(infos)),
        quantization=_quantization(file, metadata.get("quantization")),
    )
    checkpoint.model_shapes()  # a quantised checkpoint's parts are checked here, before any use
    return checkpoint


def _open_sharded(index: Path) -> Checkpoint:
    try:
        data = read_json(index, error=CheckpointError, what="not a valid index")  # bounded (zoo.io.jsonfile)
    except OSError as error:
        raise CheckpointError(f"{index}: cannot read: {error.strerror or error}") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{index}: not a valid index: a JSON object was expected")
    weight_map = data.get("weight_map")
    if not isinstance(weight_map, dict):
        raise CheckpointError(f"{index}: not a valid index: 'weight_map' must map tensor names to file names")
    for name, shard in weight_map.items():  # every name checked before any file is opened
        if not is_plain_file_name(shard):
            raise CheckpointError(
                f"{index}: not a valid index: 'weight_map' sends {name} to {shard!r}, which is not a plain "
                "file name in the index's directory"
            )
    metadata = data.get("metadata", {})
    if not isinstance(metadata, dict):
        raise CheckpointError(
            f"{index}: not a valid index: 'metadata' must be a JSON object, got {type(metadata).__name__}"
        )
    spec = _spec(index, metadata)
    by_shard: dict[str, list[str]] = {}
    for name, shard in weight_map.items():
        by_shard.setdefault(shard, []).append(name)
    tensors: dict[str, tuple[Path, TensorInfo]] = {}
    for shard, names in by_shard.items():
        file = inside(index.parent, shard, error=CheckpointError)  # a shard linked out of the folder: refused
        if not file.is_file():
            raise CheckpointNotFoundError(
                f"{index}: the shard {shard} it names is missing ({len(names)} tensors, e.g. {names[0]})"
            )
        shard_metadata, infos = _read_header(file)
        if shard_metadata.get("checkpoint_id") != metadata.get("checkpoint_id"):
            raise CheckpointError(
                f"{file}: this shard was written by another save than {index} (checkpoint_id differs): "
                "an overwrite was interrupted; save the model again"
            )
        if set(infos) != set(names):
            extra, absent = sorted(set(infos) - set(names)), sorted(set(names) - set(infos))
            raise CheckpointError(
                f"{file}: holds other tensors than {index} says: missing {absent or 'none'}, extra {extra or 'none'}"
            )
        tensors |= {name: (file, infos[name]) for name in names}
    aliases = _aliases(index, metadata.get("aliases"), stored=set(tensors))
    quantization = _quantization(index, metadata.get("quantization"))
    checkpoint = Checkpoint(
        source=index, spec=spec, tensors=tensors, aliases=aliases, quantization=quantization
    )
    checkpoint.model_shapes()  # a quantised checkpoint's parts are checked here, before any use
    return checkpoint


def _read_header(file: Path) -> tuple[dict[str, str], dict[str, TensorInfo]]:
    try:
        return read_header(file)
    except IsADirectoryError:
        raise CheckpointError(f"{file}: a directory where a safetensors file was expected") from None
    except OSError as error:
        raise CheckpointError(f"{file}: cannot read: {error.strerror or error}") from None


def _spec(source: Path, metadata: Mapping[str, Any]) -> ModelSpec:
    """The spec in a file's metadata, validated; errors name the file and the failing fields."""
    fmt = metadata.get("format")
    if fmt != FORMAT_NAME or "spec" not in metadata:
        raise CheckpointError(
            f"{source}: not a zoo checkpoint: no zoo spec in its metadata (format {fmt!r}); {_HF_HINT}"
        )
    version = metadata.get("format_version")
    if version != FORMAT_VERSION:
        raise CheckpointError(
            f"{source}: format_version {version!r}; this zoo reads version {FORMAT_VERSION} (a newer zoo wrote it?)"
        )
    raw = metadata["spec"]
    where = f"{source}: the spec in the metadata"
    data = parse_json(raw, where=where, error=CheckpointError) if isinstance(raw, str) else raw
    if not isinstance(data, dict):
        raise CheckpointError(f"{source}: the spec in the metadata must be a JSON object")
    try:
        return parse_spec(data)
    except ValidationError as error:
        raise CheckpointError(
            f"{source}: the spec in the metadata is invalid:\n{format_validation_error(error)}"
        ) from None


def _quantization(source: Path, raw: Any) -> Quantization | None:
    """zoo.quant's record in the metadata, checked (None for a floating-point checkpoint)."""
    if isinstance(raw, str):  # a weights file's metadata holds it as JSON text: parsed within bounds here
        raw = parse_json(raw, where=f"{source}: 'quantization' in the metadata", error=CheckpointError)
    return None if raw is None else Quantization.parse(raw, where=str(source), error=CheckpointError)


def _aliases(source: Path, raw: Any, *, stored: set[str]) -> dict[str, str]:
    """{alias: stored name}: each alias must name a tensor the file stores, and not be stored itself."""
    where = f"{source}: corrupted metadata: 'aliases'"
    aliases = parse_json(raw, where=where, error=CheckpointError) if isinstance(raw, str) else (raw or {})
    if not isinstance(aliases, dict) or not all(isinstance(v, str) for v in aliases.values()):
        raise CheckpointError(
            f"{source}: corrupted metadata: 'aliases' must map tensor names to tensor names"
        )
    for alias, kept in aliases.items():
        if kept not in stored:
            raise CheckpointError(
                f"{source}: corrupted metadata: 'aliases' makes {alias} a copy of {kept}, which the "
                "checkpoint does not store"
            )
        if alias in stored:
            raise CheckpointError(
                f"{source}: corrupted metadata: 'aliases' makes {alias} a copy of {kept}, but {alias} is "
                "stored too"
            )
    return aliases
