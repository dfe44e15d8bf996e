"""`build_model(spec)`: the only place that dispatches on the family."""

from __future__ import annotations

from pathlib import Path

import torch

from zoo.models.base import ZooModel
from zoo.models.decoder import DecoderModel
from zoo.models.encoder import EncoderModel
from zoo.models.encoder_decoder import EncoderDecoderModel
from zoo.models.init import initialize
from zoo.spec import ModelSpec, load_spec, parse_spec, preset

MODEL_CLASSES: dict[str, type[ZooModel]] = {
    "encoder": EncoderModel,
    "decoder": DecoderModel,
    "encoder-decoder": EncoderDecoderModel,
}


def resolve_spec(spec: ModelSpec | str | Path | dict) -> ModelSpec:
    """A spec from a spec object, a mapping, a preset name, or a YAML/JSON file path."""
    if isinstance(spec, dict):
        return parse_spec(spec)
    if isinstance(spec, Path) or (isinstance(spec, str) and spec.endswith((".yaml", ".yml", ".json"))):
        return load_spec(spec)
    if isinstance(spec, str):
        return preset(spec)
    return spec


def build_model(
    spec: ModelSpec | str | Path | dict,
    *,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
    init: bool = True,
) -> ZooModel:
    """Build a model from a spec, preset name or spec file; ``device="meta"`` builds instantly, no memory.

    >>> model = zoo.build("transformer-base")
    """
    name_or_path, spec = spec, resolve_spec(spec)
    with torch.device(device or "cpu"):
        model = MODEL_CLASSES[spec.family](spec)
        if init:
            num_layers = sum(stack.num_layers for stack in spec.stacks().values())
            initialize(model, spec.init, d_model=spec.d_model, num_layers=num_layers)
    if dtype is not None:
        model = model.to(dtype)
    if isinstance(name_or_path, str | Path):  # a preset or spec file: zoo.lora.save records it as base_id
        setattr(model, "name_or_path", str(name_or_path))  # noqa: B010
    return model
