"""`build_model(spec)`: the only place that dispatches on the family; and a spec's sizes, counted on its model.

Every build is sized first: the model is built on the meta device (no memory, no values), its parameters and
fixed buffer elements counted (`zoo.models.sizes`), and an oversized one refused (`check_size`,
``ZOO_MAX_PARAMETERS``) before a single real tensor is allocated. The count is the model's own, so it cannot
drift from what is built.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from contextlib import nullcontext
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from zoo.devices import ArgumentTypeError, resolve_device, resolve_dtype
from zoo.models.audio import AudioEncoderDecoderModel
from zoo.models.base import ZooModel
from zoo.models.decoder import DecoderModel
from zoo.models.dual_encoder import DualEncoderModel
from zoo.models.encoder import EncoderModel
from zoo.models.encoder_decoder import EncoderDecoderModel
from zoo.models.init import initialize
from zoo.models.sizes import ModelSizes, model_sizes
from zoo.spec import (
    DecoderSpec,
    DualEncoderSpec,
    EncoderDecoderSpec,
    EncoderSpec,
    ModelSpec,
    load_spec,
    parse_spec,
    preset,
)
from zoo.spec.errors import SpecError, short_repr
from zoo.spec.limits import parameters_message
from zoo.stacks import sizing_build

SpecLike = ModelSpec | str | os.PathLike[str] | Mapping[str, Any]

MODEL_CLASSES: dict[str, type[ZooModel]] = {
    "encoder": EncoderModel,
    "decoder": DecoderModel,
    "encoder-decoder": EncoderDecoderModel,
    "dual-encoder": DualEncoderModel,
}


def resolve_spec(spec: SpecLike) -> ModelSpec:
    """A spec from a spec object, a mapping, a preset name, or a YAML/JSON file path.

    Anything else (``zoo.build(42)``) is an `ArgumentTypeError` naming what is accepted.
    """
    if isinstance(spec, Mapping):
        return parse_spec(spec)
    if isinstance(spec, os.PathLike) or (isinstance(spec, str) and spec.endswith((".yaml", ".yml", ".json"))):
        return load_spec(os.fspath(spec))
    if isinstance(spec, str):
        return preset(spec)
    if isinstance(spec, EncoderSpec | DecoderSpec | EncoderDecoderSpec | DualEncoderSpec):
        return spec
    raise ArgumentTypeError(
        "spec must be a preset name, a spec file path (.yaml, .yml, .json), a mapping of fields or a "
        f"ModelSpec; got {type(spec).__name__} {short_repr(spec)}"
    )


def build_model(
    spec: SpecLike,
    *,
    device: torch.device | str | None = None,
    dtype: torch.dtype | str | None = None,
    init: bool = True,
) -> ZooModel:
    """Build a model from a spec, preset name or spec file; ``device="meta"`` builds instantly, no memory.

    ``device`` and ``dtype`` default to what ``nn.Module`` construction uses: the ambient device (``with
    torch.device("meta"):``, ``torch.set_default_device``) and ``torch.get_default_dtype()``; given, they
    win. Both are checked before anything is built (`zoo.devices`): ``device="cuda:7"`` on a machine with
    one GPU, or ``dtype=torch.int64``, is a one-line error naming the argument. A model over
    ``ZOO_MAX_PARAMETERS`` is refused before anything is built (`check_size`).

    >>> model = zoo.build("transformer-base")
    """
    target = resolve_device(device) if device is not None else None
    cast = resolve_dtype(dtype)
    name_or_path, spec = spec, resolve_spec(spec)
    check_size(spec)  # counted on the meta device: an oversized model is refused before any allocation
    model = _construct(spec, target, init=init)
    if cast is not None:
        model = model.to(cast)
    if isinstance(
        name_or_path, str | os.PathLike
    ):  # a preset or spec file: zoo.lora.save records it as base_id
        setattr(model, "name_or_path", os.fspath(name_or_path))  # noqa: B010
    return model


def parameter_count(spec: SpecLike, *, active: bool = False) -> int:
    """Distinct parameters of the model ``spec`` describes (== ``zoo.build(spec).num_parameters()``), counted
    on its meta-device build; a preset name, spec file or mapping is accepted, as `zoo.build` accepts it.

    ``active``: the parameters one token runs through: a Mixture-of-Experts layer counts its router, its
    shared expert and ``top_k`` of its ``num_experts`` routed experts (Mixtral 8x7B: 46.7B total, 12.9B
    active); a dense model's active count is its total. Not held to ``ZOO_MAX_PARAMETERS``: it can say how
    far over the limit a spec is."""
    sizes = spec_sizes(resolve_spec(spec))
    return sizes.active if active else sizes.parameters


def buffer_count(spec: SpecLike) -> int:
    """Elements of the fixed (non-persistent) tables built with the model ``spec`` describes."""
    return spec_sizes(resolve_spec(spec)).buffers


def check_size(spec: ModelSpec) -> None:
    """Refuse ``spec`` (`SpecError`, one line naming ``ZOO_MAX_PARAMETERS`` and how to raise it) when its
    model would hold more parameters and fixed buffer elements than the limit; nothing is allocated."""
    sizes = spec_sizes(spec)
    message = parameters_message(sizes.parameters, sizes.buffers)
    if message is not None:
        raise SpecError(message)


def spec_sizes(spec: ModelSpec) -> ModelSizes:
    """The sizes of ``spec``'s model, counted on a sizing build on the meta device (`zoo.models.sizes`)."""
    with sizing_build():
        return model_sizes(_construct(spec, torch.device("meta"), init=False))


def _construct(spec: ModelSpec, device: torch.device | None, *, init: bool) -> ZooModel:
    """The model of ``spec`` on ``device`` (None: the ambient one), initialised from ``spec.init`` if ``init``."""
    with torch.device(device) if device is not None else nullcontext(), _NoRandomFillsOnMeta():
        model = _model_class(spec)(spec)
        if init:
            num_layers = sum(stack.num_layers for stack in spec.stacks().values())
            initialize(model, spec.init, d_model=spec.d_model, num_layers=num_layers)
    return model


def _model_class(spec: ModelSpec) -> type[ZooModel]:
    """The family's class; an encoder-decoder whose encoder has an audio front-end takes input_features."""
    if isinstance(spec, EncoderDecoderSpec) and spec.encoder.embedding is not None:
        return AudioEncoderDecoderModel
    return MODEL_CLASSES[spec.family]


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
