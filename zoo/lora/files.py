"""Adapter files: `save` writes only the adapter tensors, `load` puts them onto a base model, `read_adapter`
describes one. The format, one safetensors file:

    tensors    <module path>.lora_A (r, I), .lora_B (O, r) [, .lora_magnitude (O,)], e.g.
               decoder.layers.0.self_attn.qkv_proj.lora_A
    metadata   format            "zoo-lora"
               format_version    "1"
               lora_spec         the `LoraSpec` as JSON
               base_spec         the base model's spec as JSON (what `zoo.save` writes)
               base_fingerprint  sha256 of the targeted base weights, see `base_fingerprint`
               base_id           where the base came from (a path, preset or Hub id), when known

`load` checks everything before it changes the model: the format, the spec (the differing fields named),
the fingerprint (unless ``check_base=False``), every tensor name and shape; only then are adapters applied.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from pydantic import ValidationError
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from zoo.io.atomic import write_atomic
from zoo.io.checkpoint.files import CheckpointError, read_header
from zoo.io.jsonfile import parse_json
from zoo.io.names import ADAPTER_NAME
from zoo.lora.checks import spec_problem
from zoo.lora.errors import LoraError
from zoo.lora.fingerprint import FINGERPRINT_METHOD, base_fingerprint
from zoo.lora.inject import (
    adapter_modules,
    adapter_shapes,
    adapter_state,
    apply,
    base_weights,
    resolve_targets,
)
from zoo.spec import DecoderSpec, EncoderDecoderSpec, EncoderSpec, LoraSpec, ModelSpec, parse_spec
from zoo.spec.presets import format_validation_error

FORMAT_NAME = "zoo-lora"
FORMAT_VERSION = "1"
_DESCRIPTIVE = ("name", "source")  # spec fields that never change the math: not compared
_SPEC_CLASSES = (EncoderSpec, DecoderSpec, EncoderDecoderSpec)  # ModelSpec is their (annotated) union


@dataclass(frozen=True)
class AdapterInfo:
    """What an adapter file says about itself (`read_adapter`): no tensor data is read."""

    path: Path
    spec: LoraSpec
    base_spec: ModelSpec
    base_id: str | None
    fingerprint: str
    tensors: int  # how many tensors the file holds
    bytes: int  # their data, in bytes


def save(model: torch.nn.Module, path: str | os.PathLike[str], *, base_id: str | None = None) -> Path:
    """Write ``model``'s adapters, and only them, to the safetensors file ``path`` (atomically); returns it.

    The metadata holds the `LoraSpec`, the base's spec, its fingerprint and ``base_id`` (default: the
    model's ``name_or_path``, when it has one). Refuses a model without adapters, and a merged one (the
    fingerprint is of the base weights: `unmerge` first).
    """
    modules = adapter_modules(model)
    spec = getattr(model, "lora_spec", None)
    base_spec = getattr(model, "spec", None)
    if not modules or not isinstance(spec, LoraSpec):
        raise LoraError("zoo.lora.save: the model has no LoRA adapters (add them with zoo.lora.apply)")
    if not isinstance(base_spec, _SPEC_CLASSES):
        raise LoraError(f"zoo.lora.save needs a zoo model (with a .spec), got {type(model).__name__}")
    target = Path(path).expanduser()
    if target.is_dir():
        raise LoraError(
            f"{target}: is a directory; zoo.lora.save writes one file, e.g. {target / ADAPTER_NAME}"
        )
    merged = [name for name, module in modules.items() if module.merged]
    if merged:
        raise LoraError(f"zoo.lora.save: {merged[0]} is merged; unmerge first (zoo.lora.unmerge)")
    tensors = {name: t.detach().to("cpu").contiguous() for name, t in adapter_state(model).items()}
    base_id = base_id if base_id is not None else getattr(model, "name_or_path", None)
    metadata = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        # The adapters alone: how the base was held while training (quantize_base) is not theirs to say.
        "lora_spec": spec.model_copy(update={"quantize_base": None}).model_dump_json(),
        "base_spec": base_spec.to_json(),
        "base_fingerprint": base_fingerprint(base_weights(modules)),
        "fingerprint_method": FINGERPRINT_METHOD,
    } | ({"base_id": str(base_id)} if base_id is not None else {})
    write_atomic(target, lambda temp: save_file(tensors, str(temp), metadata=metadata))
    return target


def read_adapter(path: str | os.PathLike[str]) -> AdapterInfo:
    """An adapter file's spec, base spec, base id and fingerprint, and its tensor count and bytes (headers only)."""
    source = Path(path).expanduser()
    if not source.is_file():
        raise LoraError(f"{source}: no such adapter file")
    try:
        metadata, infos = read_header(source)
    except CheckpointError as error:
        raise LoraError(str(error)) from None
    if metadata.get("format") != FORMAT_NAME:
        found = metadata.get("format")
        what = f"its format is {found!r}" if found else "it has no format marker"
        hint = " (a zoo checkpoint: load it with zoo.load)" if found == "zoo" else ""
        raise LoraError(f"{source}: not a zoo LoRA adapter file: {what}{hint}")
    if metadata.get("format_version") != FORMAT_VERSION:
        raise LoraError(
            f"{source}: adapter format version {metadata.get('format_version')!r}; this zoo reads {FORMAT_VERSION}"
        )
    missing = [key for key in ("lora_spec", "base_spec", "base_fingerprint") if key not in metadata]
    if missing:
        raise LoraError(f"{source}: adapter metadata lacks {', '.join(missing)}")
    # The bounded reader (depth, number length, no NaN / Infinity): the metadata is anyone's to write.
    lora_data = parse_json(
        metadata["lora_spec"], where=f"{source}: lora_spec in the metadata", error=LoraError
    )
    base_data = parse_json(
        metadata["base_spec"], where=f"{source}: base_spec in the metadata", error=LoraError
    )
    try:
        spec = LoraSpec.model_validate(lora_data)
    except ValidationError as error:
        raise LoraError(f"{source}: the adapter's lora_spec is invalid: {spec_problem(error)[0]}") from None
    try:
        base_spec = parse_spec(base_data)
    except ValidationError as error:
        raise LoraError(
            f"{source}: invalid spec in the adapter metadata:\n{format_validation_error(error)}"
        ) from None
    except ValueError as error:
        raise LoraError(f"{source}: unreadable spec in the adapter metadata: {error}") from None
    return AdapterInfo(
        path=source,
        spec=spec,
        base_spec=base_spec,
        base_id=metadata.get("base_id"),
        fingerprint=metadata["base_fingerprint"],
        tensors=len(infos),
        bytes=sum(info.numel * info.dtype.itemsize for info in infos.values()),
    )


def load(
    model: torch.nn.Module,
    path: str | os.PathLike[str],
    *,
    check_base: bool = True,
    quantize_base: str | None = None,
) -> torch.nn.Module:
    """Apply the adapters saved at ``path`` to the base ``model`` (in place) and return it.

    Refused, with the model left untouched: a file that is not an adapter file (or is truncated), a base whose
    spec differs from the one the adapter was trained on (the fields named), a base whose weights differ
    (the fingerprint; ``check_base=False`` skips this check only), a model that already has adapters, and
    tensors that are missing, unexpected or of the wrong shape. ``quantize_base="nf4"``: the base's
    projections are stored NF4 as `zoo.lora.apply` does (QLoRA; an NF4 base from `zoo.lora.load_base` needs it).
    """
    info = read_adapter(path)
    source = info.path
    base_spec = getattr(model, "spec", None)
    if not isinstance(base_spec, _SPEC_CLASSES):
        raise LoraError(f"zoo.lora.load needs a zoo model (with a .spec), got {type(model).__name__}")
    if adapter_modules(model):
        raise LoraError(f"{source}: the model already has LoRA adapters; load onto the base model")
    differing = spec_differences(info.base_spec, base_spec)
    if differing:
        more = f" (and {len(differing) - 6} more)" if len(differing) > 6 else ""
        raise LoraError(
            f"{source}: the adapter was trained on a different base ({_base_name(info)}): the spec differs in "
            f"{'; '.join(differing[:6])}{more}"
        )
    try:
        targeted = resolve_targets(model, info.spec)
    except LoraError as error:
        raise LoraError(f"{source}: {error}") from None
    if check_base:
        found = base_fingerprint(base_weights(targeted))
        if found != info.fingerprint:
            raise LoraError(
                f"{source}: the adapter was trained on another base ({_base_name(info)}; weights fingerprint "
                f"{info.fingerprint[:12]}), this model's targeted weights give {found[:12]}; load that base, or "
                "pass check_base=False to apply it anyway"
            )
    tensors = _read_tensors(source, adapter_shapes(targeted, info.spec))
    del targeted  # QLoRA: no reference to a dense weight outlives its quantisation
    apply(model, info.spec.model_copy(update={"quantize_base": quantize_base}))
    with torch.no_grad():
        for name, tensor in adapter_state(model).items():
            tensor.copy_(tensors[name])
    if info.base_id is not None and getattr(model, "name_or_path", None) is None:
        setattr(model, "name_or_path", info.base_id)  # noqa: B010 (a plain attribute on an nn.Module)
    return model


def spec_differences(saved: ModelSpec, current: ModelSpec) -> list[str]:
    """``"d_model: 64 (adapter's base) vs 128 (this model)"`` for each field that differs (name and source
    aside: they never change the math)."""
    a, b = _flatten(saved.model_dump(mode="json")), _flatten(current.model_dump(mode="json"))
    rows = []
    for key in dict.fromkeys([*a, *b]):
        if key.split(".")[0] in _DESCRIPTIVE:
            continue
        if a.get(key, "—") != b.get(key, "—"):
            rows.append(f"{key}: {a.get(key, '—')} (adapter's base) vs {b.get(key, '—')} (this model)")
    return rows


# -- helpers -------------------------------------------------------------------------------------------------


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict) and value:
        out: dict[str, Any] = {}
        for key, item in value.items():
            out |= _flatten(item, f"{prefix}.{key}" if prefix else str(key))
        return out
    return {prefix: value}


def _base_name(info: AdapterInfo) -> str:
    return info.base_id or info.base_spec.name or f"a {info.base_spec.family} model"


def _read_tensors(source: Path, expected: dict[str, tuple[int, ...]]) -> dict[str, torch.Tensor]:
    """Every adapter tensor, names and shapes checked against ``expected`` from the header first."""
    _, infos = read_header(source)
    problems = [f"missing {name}" for name in expected if name not in infos]
    problems += [f"unexpected {name}" for name in infos if name not in expected]
    problems += [
        f"{name}: expected shape {list(shape)}, the file has {list(infos[name].shape)}"
        for name, shape in expected.items()
        if name in infos and infos[name].shape != shape
    ]
    problems += [
        f"{name} is {str(info.dtype).removeprefix('torch.')}: a floating-point tensor is expected"
        for name, info in infos.items()
        if name in expected and not info.dtype.is_floating_point
    ]
    if problems:
        more = f" (and {len(problems) - 8} more)" if len(problems) > 8 else ""
        raise LoraError(
            f"{source}: the adapter tensors do not fit this model: {'; '.join(problems[:8])}{more}"
        )
    try:
        with safe_open(str(source), framework="pt", device="cpu") as handle:
            return {name: handle.get_tensor(name) for name in expected}
    except SafetensorError as error:
        raise LoraError(f"{source}: not a readable safetensors file: {error}") from None
