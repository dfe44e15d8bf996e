"""A quantised model's tensors as a checkpoint stores them, and back: what `zoo.save` and `zoo.load` call.

    save   `quantized_state`    state dict with each quantised W as plain parts W.qdata, W.scale, ... + record
    open   `logical_shapes`     the parts checked against the record -> {W: (N, K)}, as the model expects
    load   `check_loadable`     torchao present, the device able to run the kernel (before anything is read)
           `assemble`           the parts read from the file -> torchao's tensor, bit for bit
           `place`              each tensor made the model's parameter; the record set on the model

Why zoo's own flattening and not torchao's prototype safetensors helpers: those write a JSON object per
tensor into the metadata and rebuild classes named in it, and do not cover ``Int4OpaqueTensor``; here the
record is one small entry, every stored tensor is an ordinary one whose dtype and shape the loader checks
like any other before reading it, and the format is written down (`zoo.quant.schemes`, docs/quantization.md).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

import torch
from torch import nn

from zoo.quant.apply import is_quantized_tensor
from zoo.quant.library import QuantizationError, import_torchao
from zoo.quant.record import Quantization, quantization_of, set_quantization
from zoo.quant.schemes import SCHEMES, PartInfo

__all__ = [
    "assemble",
    "check_loadable",
    "float_parts",
    "logical_shapes",
    "part_names",
    "place",
    "quantized_state",
]


def quantized_state(
    model: nn.Module, *, error: type[ValueError] = QuantizationError
) -> tuple[dict[str, torch.Tensor], Quantization | None]:
    """(tensors to save, record): ``model.state_dict()`` with every quantised weight split into its plain
    parts, in state-dict order; the record is None for a floating-point model."""
    state = model.state_dict()
    record = quantization_of(model)
    quantized = set(record.tensors) if record else set()
    tensors: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        if record is not None and name in quantized:
            try:
                parts = SCHEMES[record.weights].split(name, tensor)
            except QuantizationError as problem:
                raise error(f"zoo.save: {problem}") from None
            tensors |= {f"{name}.{part}": data.contiguous() for part, data in parts.items()}
        elif is_quantized_tensor(tensor):
            raise error(
                f"zoo.save: {name} is a quantised tensor ({type(tensor).__name__}) the model has no record of; "
                "quantise with zoo.quant.quantize, which records what it did for the checkpoint"
            )
        else:
            tensors[name] = tensor
    if record is not None and (missing := quantized - set(state)):
        raise error(f"zoo.save: the quantisation record names {sorted(missing)[0]}, which the model lacks")
    return tensors, record


def part_names(record: Quantization) -> dict[str, str]:
    """{stored part name: the quantised weight it belongs to}: ``W.qdata`` -> ``W``."""
    parts = SCHEMES[record.weights].parts
    return {f"{name}.{part}": name for name in record.tensors for part in parts}


def logical_shapes(
    record: Quantization,
    infos: Mapping[str, PartInfo],
    *,
    where: str,
    error: type[ValueError] = QuantizationError,
) -> dict[str, tuple[int, ...]]:
    """{quantised weight: its (N, K)} from the stored parts' dtypes and shapes (``infos``: every stored
    tensor); ``error`` naming ``where`` for a missing part, a weight also stored whole, or a part whose
    dtype or shape the scheme does not write."""
    scheme = SCHEMES[record.weights]
    shapes: dict[str, tuple[int, ...]] = {}
    for name in record.tensors:
        if name in infos:
            raise error(f"{where}: {name} is stored whole and quantised: corrupted checkpoint")
        absent = [f"{name}.{part}" for part in scheme.parts if f"{name}.{part}" not in infos]
        if absent:
            raise error(
                f"{where}: the {record.weights} weight {name} has no {', '.join(absent)} in the checkpoint"
            )
        shape = scheme.logical_shape(
            name, {part: infos[f"{name}.{part}"] for part in scheme.parts}, record.group_size
        )
        if isinstance(shape, str):
            raise error(f"{where}: {shape}")
        shapes[name] = shape
    return shapes


def check_loadable(record: Quantization, *, device: torch.device) -> None:
    """Refuse, before anything is read, what cannot run here: no torchao, or int4 off the CPU."""
    import_torchao()  # TorchaoMissingError names the extra to install
    if record.weights == "int4" and device.type != "cpu":
        raise QuantizationError(
            f"int4 weights run on torch's CPU kernel only; load them with device='cpu' (not {device})"
        )


def assemble(
    record: Quantization, name: str, parts: Mapping[str, torch.Tensor], *, dtype: torch.dtype
) -> torch.Tensor:
    """The quantised weight ``name`` from its stored parts ({``W.qdata``: tensor, ...}); ``dtype``: the
    floating-point dtype it computes in (the model's)."""
    by_suffix = {part: parts[f"{name}.{part}"] for part in SCHEMES[record.weights].parts}
    return SCHEMES[record.weights].assemble(by_suffix, dtype=dtype, group_size=record.group_size)


def place(model: nn.Module, weights: Mapping[str, torch.Tensor], record: Quantization) -> None:
    """Make each quantised weight (``{name: tensor}``) the model's parameter, frozen as torchao leaves it,
    and record ``record`` on the model, naming only the weights placed (``strict=False`` may leave some)."""
    for name, tensor in weights.items():
        owner, _, leaf = name.rpartition(".")
        setattr(model.get_submodule(owner), leaf, nn.Parameter(tensor, requires_grad=False))
    set_quantization(model, replace(record, tensors=tuple(n for n in record.tensors if n in weights)))


def float_parts(tensor: torch.Tensor) -> Iterable[torch.Tensor]:
    """The floating-point data of a weight: itself, or a quantised one's scales (its integers cannot be
    NaN). For checks such as "no NaN in the weights", which torchao's tensors do not implement."""
    if not is_quantized_tensor(tensor):
        return [tensor]
    kind = type(tensor)
    names = [*getattr(kind, "tensor_data_names", []), *getattr(kind, "optional_tensor_data_names", [])]
    return [
        part
        for part in (getattr(tensor, attr, None) for attr in names)
        if isinstance(part, torch.Tensor) and part.is_floating_point()
    ]
