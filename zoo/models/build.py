"""`build_model(spec)`: the only place that dispatches on the family."""

from __future__ import annotations

import os
from collections.abc import Mapping
from contextlib import nullcontext
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from zoo.devices import ArgumentTypeError, resolve_device, resolve_dtype
from zoo.models.base import ZooModel
from zoo.models.decoder import DecoderModel
from zoo.models.encoder import EncoderModel
from zoo.models.encoder_decoder import EncoderDecoderModel
from zoo.models.init import initialize
from zoo.spec import DecoderSpec, EncoderDecoderSpec, EncoderSpec, ModelSpec, load_spec, parse_spec, preset
from zoo.spec.errors import short_repr

MODEL_CLASSES: dict[str, type[ZooModel]] = {
    "encoder": EncoderModel,
    "decoder": DecoderModel,
    "encoder-decoder": EncoderDecoderModel,
}


def resolve_spec(spec: ModelSpec | str | os.PathLike[str] | Mapping[str, Any]) -> ModelSpec:
    """A spec from a spec object, a mapping, a preset name, or a YAML/JSON file path.

    Anything else (``zoo.build(42)``) is an `ArgumentTypeError` naming what is accepted.
    """
    if isinstance(spec, Mapping):
        return parse_spec(spec)
    if isinstance(spec, os.PathLike) or (isinstance(spec, str) and spec.endswith((".yaml", ".yml", ".json"))):
        return load_spec(os.fspath(spec))
    if isinstance(spec, str):
        return preset(spec)
    if isinstance(spec, EncoderSpec | DecoderSpec | EncoderDecoderSpec):
        return spec
    raise ArgumentTypeError(
        "spec must be a preset name, a spec file path (.yaml, .yml, .json), a mapping of fields or a "
        f"ModelSpec; got {type(spec).__name__} {short_repr(spec)}"
    )


def build_model(
    spec: ModelSpec | str | os.PathLike[str] | Mapping[str, Any],
    *,
    device: torch.device | str | None = None,
    dtype: torch.dtype | str | None = None,
    init: bool = True,
) -> ZooModel:
    """Build a model from a spec, preset name or spec file; ``device="meta"`` builds instantly, no memory.

    ``device`` and ``dtype`` default to what ``nn.Module`` construction uses: the ambient device (``with
    torch.device("meta"):``, ``torch.set_default_device``) and ``torch.get_default_dtype()``; given, they
    win. Both are checked before anything is built (`zoo.devices`): ``device="cuda:7"`` on a machine with
    one GPU, or ``dtype=torch.int64``, is a one-line error naming the argument.

    >>> model = zoo.build("transformer-base")
    """
    target = resolve_device(device) if device is not None else None
    cast = resolve_dtype(dtype)
    name_or_path, spec = spec, resolve_spec(spec)
    with torch.device(target) if target is not None else nullcontext(), _NoRandomFillsOnMeta():
        model = MODEL_CLASSES[spec.family](spec)
        if init:
            num_layers = sum(stack.num_layers for stack in spec.stacks().values())
            initialize(model, spec.init, d_model=spec.d_model, num_layers=num_layers)
    if cast is not None:
        model = model.to(cast)
    if isinstance(
        name_or_path, str | os.PathLike
    ):  # a preset or spec file: zoo.lora.save records it as base_id
        setattr(model, "name_or_path", os.fspath(name_or_path))  # noqa: B010
    return model


# The random fills nn.Module constructors and `initialize` make: on a meta tensor there are no values to fill.
_RANDOM_FILLS = frozenset(
    (
        torch.Tensor.normal_,
        torch.Tensor.uniform_,
        nn.init.normal_,
        nn.init.uniform_,
        nn.init.trunc_normal_,
        nn.init.kaiming_uniform_,
        nn.init.kaiming_normal_,
        nn.init.xavier_uniform_,
        nn.init.xavier_normal_,
    )
)


class _NoRandomFillsOnMeta(TorchFunctionMode):
    """Skips a random fill of a meta tensor, which has no values to fill: the result is the same tensor.

    torch runs ``normal_`` and ``uniform_`` on the meta device through its Python reference implementations,
    which import torch._dynamo (and sympy) on first use: a second or more for every meta build (`zoo show`,
    `zoo presets`, `zoo.load` and `zoo.from_hf` before the weights are assigned), for nothing.
    """

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func in _RANDOM_FILLS:
            tensor = args[0] if args else kwargs.get("tensor")  # nn.init passes it by keyword
            if isinstance(tensor, torch.Tensor) and tensor.is_meta:
                return tensor
        return func(*args, **kwargs)
