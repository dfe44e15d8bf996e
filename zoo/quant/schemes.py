"""The two weight formats: torchao's config for each, the shapes its kernel takes, and its tensors on disk.

A quantised weight W (N, K) (N output features, K input features) is one torchao tensor subclass in the
model and two plain tensors in a checkpoint, stored as ``W.<part>``:

    int8   Int8Tensor: symmetric, one scale per output row           W.qdata  int8 (N, K)
           (torchao ``Int8WeightOnlyConfig``; any shape)             W.scale  float32 (N, 1)
    int4   Int4OpaqueTensor: asymmetric, one scale and zero point     W.qdata  uint8 (N, K/2)
           per group of ``group_size`` inputs, packed for torch's         two 4-bit values per byte, in the
           CPU kernel ``_weight_int4pack_mm_for_cpu`` (torchao's          order _convert_weight_to_int4pack_for_cpu
           ``PrototypeInt4WeightOnlyConfig``; CPU only,               W.scale_and_zero  (K/group_size, N, 2)
           N % 16 == 0, K % group_size == 0, group 32/64/128)             the model's float dtype

Dequantised, int8 is ``qdata * scale`` (W.qdata's rows times their scale); int4 is the tinygemm form
``(q - 8) * scale + zero`` per group. Reading parts back builds the same subclass, bit for bit.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from zoo.quant.library import QuantizationError, import_torchao

__all__ = ["INT4_GROUP_SIZES", "SCHEMES", "PartInfo", "Scheme"]

INT4_GROUP_SIZES = (32, 64, 128)  # what Int4OpaqueTensor accepts
INT4_ROW_MULTIPLE = 16  # _convert_weight_to_int4pack_for_cpu packs rows in blocks of 16

PartInfo = tuple[torch.dtype, tuple[int, ...]]  # a stored part's dtype and shape (from the file's header)


class Scheme(Protocol):
    """One weight format: ``parts`` are the suffixes of its stored tensors, in the order they are written."""

    @property
    def parts(self) -> tuple[str, ...]: ...

    def group_size(self, requested: int | None) -> int | None: ...

    def config(self, group_size: int | None) -> Any: ...

    def check(self, name: str, weight: torch.Tensor, group_size: int | None) -> None: ...

    def split(self, name: str, tensor: Any) -> dict[str, torch.Tensor]: ...

    def logical_shape(
        self, name: str, infos: Mapping[str, PartInfo], group_size: int | None
    ) -> str | tuple[int, int]: ...

    def assemble(
        self, parts: Mapping[str, torch.Tensor], *, dtype: torch.dtype, group_size: int | None
    ) -> torch.Tensor: ...


def _is(tensor: torch.Tensor, class_name: str) -> bool:
    return type(tensor).__name__ == class_name


@dataclass(frozen=True)
class Int8:
    """Symmetric int8, one float32 scale per output row: torchao's ``Int8WeightOnlyConfig`` (PerRow)."""

    parts: tuple[str, ...] = ("qdata", "scale")

    def group_size(self, requested: int | None) -> int | None:
        if requested is not None:
            raise QuantizationError(
                f"group_size {requested}: int8 weights have one scale per output row; group_size applies to int4"
            )
        return None

    def config(self, group_size: int | None) -> Any:
        # set_inductor_config=False: torchao's default changes process-wide torch._inductor settings.
        return import_torchao().Int8WeightOnlyConfig(set_inductor_config=False)

    def check(self, name: str, weight: torch.Tensor, group_size: int | None) -> None:
        if weight.ndim != 2:
            raise QuantizationError(f"{name} {list(weight.shape)}: int8 weight-only needs a 2-D matrix")

    def split(self, name: str, tensor: Any) -> dict[str, torch.Tensor]:
        if not _is(tensor, "Int8Tensor"):
            raise QuantizationError(f"{name}: expected torchao's Int8Tensor, found {type(tensor).__name__}")
        zero = tensor.zero_point
        if (
            tensor.act_quant_kwargs is not None
            or tensor.act_pre_scale is not None
            or list(tensor.block_size) != [1, tensor.shape[1]]
            or (zero is not None and bool(zero.any()))
        ):
            raise QuantizationError(
                f"{name}: not symmetric per-row weight-only int8 (activation quantisation, a pre-scale, "
                "a zero point or another block size): zoo saves only what zoo.quant.quantize makes"
            )
        return {"qdata": tensor.qdata, "scale": tensor.scale}

    def logical_shape(
        self, name: str, infos: Mapping[str, PartInfo], group_size: int | None
    ) -> str | tuple[int, int]:
        (qtype, qshape), (stype, sshape) = infos["qdata"], infos["scale"]
        if group_size is not None:
            return "int8 weights have no group_size"
        if qtype != torch.int8 or len(qshape) != 2:
            return f"{name}.qdata must be a 2-D int8 tensor (found {_name(qtype)} {list(qshape)})"
        if stype != torch.float32 or sshape != (qshape[0], 1):
            return f"{name}.scale must be float32 [{qshape[0]}, 1] (found {_name(stype)} {list(sshape)})"
        return qshape[0], qshape[1]

    def assemble(
        self, parts: Mapping[str, torch.Tensor], *, dtype: torch.dtype, group_size: int | None
    ) -> torch.Tensor:
        qdata, scale = parts["qdata"], parts["scale"]
        Int8Tensor = import_torchao().Int8Tensor
        zero = torch.zeros_like(scale, dtype=torch.int8)  # symmetric: what Int8Tensor.from_hp keeps
        return Int8Tensor(qdata, scale, [1, qdata.shape[1]], dtype, zero_point=zero)


@dataclass(frozen=True)
class Int4:
    """Asymmetric int4 in groups, packed for torch's CPU kernel: torchao's ``PrototypeInt4WeightOnlyConfig``."""

    parts: tuple[str, ...] = ("qdata", "scale_and_zero")

    def group_size(self, requested: int | None) -> int | None:
        size = 32 if requested is None else requested
        if size not in INT4_GROUP_SIZES:
            raise QuantizationError(
                f"group_size {size}: int4 takes {', '.join(map(str, INT4_GROUP_SIZES))} (the CPU kernel's groups)"
            )
        return size

    def config(self, group_size: int | None) -> Any:
        int4 = import_torchao("torchao.prototype.quantization.int4")
        return int4.PrototypeInt4WeightOnlyConfig(group_size=group_size, set_inductor_config=False)

    def check(self, name: str, weight: torch.Tensor, group_size: int | None) -> None:
        assert group_size is not None  # `group_size` gave the default
        if weight.device.type != "cpu":
            raise QuantizationError(
                f"{name} is on {weight.device}: int4 runs on torch's CPU kernel (_weight_int4pack_mm_for_cpu) "
                "only; quantise on the CPU, or use int8 on this device"
            )
        if weight.ndim != 2:
            raise QuantizationError(f"{name} {list(weight.shape)}: int4 weight-only needs a 2-D matrix")
        rows, columns = weight.shape
        if columns % group_size:
            raise QuantizationError(
                f"{name} {list(weight.shape)}: int4 with group_size {group_size} needs the input features "
                f"({columns}) to be a multiple of {group_size}; choose another group_size or use int8"
            )
        if rows % INT4_ROW_MULTIPLE:
            raise QuantizationError(
                f"{name} {list(weight.shape)}: int4's CPU kernel needs the output features ({rows}) to be a "
                f"multiple of {INT4_ROW_MULTIPLE}; use int8"
            )

    def split(self, name: str, tensor: Any) -> dict[str, torch.Tensor]:
        if not _is(tensor, "Int4OpaqueTensor"):
            raise QuantizationError(
                f"{name}: expected torchao's Int4OpaqueTensor, found {type(tensor).__name__}"
            )
        if tensor.act_mapping_type is not None or tensor.act_pre_scale is not None:
            raise QuantizationError(
                f"{name}: not weight-only int4 (activation quantisation or a pre-scale): zoo saves only what "
                "zoo.quant.quantize makes"
            )
        return {"qdata": tensor.qdata, "scale_and_zero": tensor.scale_and_zero}

    def logical_shape(
        self, name: str, infos: Mapping[str, PartInfo], group_size: int | None
    ) -> str | tuple[int, int]:
        (qtype, qshape), (stype, sshape) = infos["qdata"], infos["scale_and_zero"]
        if group_size not in INT4_GROUP_SIZES:
            return f"int4 group_size must be one of {', '.join(map(str, INT4_GROUP_SIZES))}, not {group_size}"
        if qtype != torch.uint8 or len(qshape) != 2:
            return f"{name}.qdata must be a 2-D uint8 tensor (found {_name(qtype)} {list(qshape)})"
        rows, columns = qshape[0], 2 * qshape[1]
        expected = (columns // group_size, rows, 2)
        if not stype.is_floating_point or sshape != expected or columns % group_size:
            return (
                f"{name}.scale_and_zero must be a float tensor {list(expected)} for qdata {list(qshape)} and "
                f"group_size {group_size} (found {_name(stype)} {list(sshape)})"
            )
        return rows, columns

    def assemble(
        self, parts: Mapping[str, torch.Tensor], *, dtype: torch.dtype, group_size: int | None
    ) -> torch.Tensor:
        assert group_size is not None
        qdata, scale_and_zero = parts["qdata"], parts["scale_and_zero"]
        if qdata.device.type != "cpu":
            raise QuantizationError(
                f"int4 weights run on torch's CPU kernel only; load them on the CPU (not {qdata.device})"
            )
        int4 = import_torchao("torchao.prototype.quantization.int4")
        shape = torch.Size([qdata.shape[0], 2 * qdata.shape[1]])
        # The kernel computes in the dtype of the scales: they follow the model's dtype.
        return int4.Int4OpaqueTensor(qdata, scale_and_zero.to(dtype), [1, group_size], shape)


SCHEMES: dict[str, Scheme] = {"int8": Int8(), "int4": Int4()}


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
