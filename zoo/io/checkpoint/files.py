"""The files of a zoo checkpoint, below the model level: safetensors headers, tied tensors, shard plans.

    out/
      model.safetensors                  every tensor once; metadata {"format": "zoo", "spec": ...}
      spec.json                          the same spec, indented, for people
      tokenizer.json                     optional
    or, above ``max_shard_size``:
      model-00001-of-00003-<tag>.safetensors   ... each shard carries the same metadata; <tag> (8 hex
                                               digits) is this save's own, so no save overwrites a shard
                                               the current index names
      model.safetensors.index.json       {"metadata": {..., "spec": {...}}, "weight_map": {name: shard}}

Headers are parsed and checked here, before a single tensor is read, so that a truncated or foreign file
fails with one message naming the file and the problem instead of a Rust or pickle traceback.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TypeGuard

import torch

from zoo.io.jsonfile import parse_json
from zoo.spec.errors import clip

FORMAT_NAME = "zoo"
FORMAT_VERSION = "1"

_MAX_HEADER = 100_000_000  # safetensors' own limit on the JSON header
_DTYPES = {
    name: getattr(torch, attr)
    for name, attr in {
        "BOOL": "bool", "U8": "uint8", "I8": "int8", "I16": "int16", "U16": "uint16", "I32": "int32",
        "U32": "uint32", "I64": "int64", "U64": "uint64", "F16": "float16", "BF16": "bfloat16",
        "F32": "float32", "F64": "float64", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2",
    }.items()
    if hasattr(torch, attr)
}  # fmt: skip
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
_UNITS |= {"KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


class CheckpointError(ValueError):
    """A checkpoint that cannot be written or read; the message names the file and the problem."""


class CheckpointNotFoundError(CheckpointError, FileNotFoundError):
    """The path, a shard or the tokenizer is not there (also a ``FileNotFoundError``)."""


@dataclass(frozen=True)
class TensorInfo:
    """One tensor as a safetensors header describes it."""

    dtype: torch.dtype
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def read_header(path: Path) -> tuple[dict[str, str], dict[str, TensorInfo]]:
    """(metadata, tensors) of a safetensors file; checks that the data regions tile the file exactly.

    safetensors layout: 8-byte little-endian header length N, N bytes of JSON, then the tensor bytes.
    """
    size = path.stat().st_size
    with path.open("rb") as f:
        prefix = f.read(8)
        length = int.from_bytes(prefix, "little") if len(prefix) == 8 else -1
        if length < 2 or length > min(size - 8, _MAX_HEADER):
            raise CheckpointError(
                f"{path}: not a safetensors file, or truncated: the 8-byte header length says "
                f"{max(length, 0)} bytes but the file holds {size} bytes"
            )
        raw = f.read(length)
    # Bounded: depth, number lengths and non-finite numbers are refused naming the file (`zoo.io.jsonfile`).
    header = parse_json(raw, where=f"{path}: corrupted safetensors header", error=CheckpointError)
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: corrupted safetensors header: a JSON object was expected")
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise CheckpointError(
            f"{path}: corrupted safetensors header: __metadata__ must map strings to strings"
        )
    tensors, regions = {}, []
    for name, entry in header.items():
        entry = entry if isinstance(entry, dict) else {}
        shape, offsets = entry.get("shape"), entry.get("data_offsets")
        if (
            not isinstance(entry.get("dtype"), str)
            or entry["dtype"] not in _DTYPES
            or not _sizes(shape)
            or not _sizes(offsets)
            or len(offsets) != 2
        ):
            raise CheckpointError(
                f"{path}: corrupted safetensors header: bad entry for tensor {clip(name, 120)!r} (expected a "
                "known dtype, a shape and two data_offsets, as non-negative integers)"
            )
        dtype, shape = _DTYPES[entry["dtype"]], tuple(shape)
        start, end = offsets
        numel = 0 if 0 in shape else 1
        for n in shape if numel else ():
            numel *= n
            if numel > size:  # more than the file could hold: stop before the product grows huge
                break
        if end - start != numel * dtype.itemsize:
            needs = f"{numel * dtype.itemsize}" if numel <= size else f"more than the file's {size}"
            raise CheckpointError(
                f"{path}: corrupted safetensors header: tensor {clip(name, 120)!r} "
                f"{clip(str(list(shape)), 80)} {entry['dtype']} needs {needs} bytes but has {end - start}"
            )
        tensors[name] = TensorInfo(dtype, shape)
        regions.append((start, end))
    data_size, cursor = size - 8 - length, 0
    for start, end in sorted(regions):
        if start != cursor:
            raise CheckpointError(
                f"{path}: corrupted safetensors header: tensor data regions overlap or leave gaps"
            )
        cursor = end
    if cursor != data_size:
        raise CheckpointError(
            f"{path}: truncated or corrupted: the header describes {cursor} bytes of tensor data "
            f"but the file holds {data_size}"
        )
    return metadata, tensors


def _sizes(value: object) -> TypeGuard[list[int]]:
    """A JSON list of integers in [0, 2**64), safetensors' range (a bool, a float or a string is none)."""
    return isinstance(value, list) and all(type(n) is int and 0 <= n < 2**64 for n in value)


def unique_tensors(state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """(tensors to write, {alias: kept name}): a tensor registered under two names is written once.

    zoo's tied heads are not in the state dict at all; this guards models tied by hand. A tensor that
    only overlaps another's storage is copied, since safetensors stores each tensor on its own.
    """
    tensors: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    views: dict[tuple, str] = {}
    storages: set[tuple] = set()
    for name, tensor in state.items():
        if tensor.is_meta:
            raise CheckpointError(
                f"zoo.save: {name} is on the meta device; load or initialise the model first"
            )
        if tensor.numel() == 0:  # empty tensors may share a null pointer without sharing anything
            tensors[name] = tensor.contiguous()
            continue
        storage = (tensor.device, tensor.untyped_storage().data_ptr())
        view = (*storage, tensor.storage_offset(), tuple(tensor.shape), tensor.stride(), tensor.dtype)
        if view in views:
            aliases[name] = views[view]
            continue
        views[view] = name
        tensors[name] = tensor.clone() if storage in storages else tensor.contiguous()
        storages.add(storage)
    return tensors, aliases


def parse_size(size: int | str) -> int:
    """Bytes from ``5_000_000``, ``"500MB"`` or ``"2GiB"`` (KB/MB/GB are powers of 10, KiB/MiB/GiB of 2)."""
    if isinstance(size, int) and not isinstance(size, bool):
        value = size
    else:
        match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", str(size))
        unit = match.group(2).upper() if match else None
        if match is None or unit not in _UNITS:
            raise ValueError(
                f"max_shard_size: cannot read {size!r}; expected bytes or e.g. '500MB', '2GB', '1GiB'"
            )
        value = int(float(match.group(1)) * _UNITS[unit])
    if value <= 0:
        raise ValueError(f"max_shard_size must be positive, got {size!r}")
    return value


def plan_shards(sizes: dict[str, int], limit: int) -> list[list[str]]:
    """Names grouped into shards of at most ``limit`` bytes, in order (a larger tensor gets its own shard)."""
    shards: list[list[str]] = [[]]
    used = 0
    for name, nbytes in sizes.items():
        if shards[-1] and used + nbytes > limit:
            shards.append([])
            used = 0
        shards[-1].append(name)
        used += nbytes
    return shards
