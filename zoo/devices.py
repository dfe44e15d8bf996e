"""Device and dtype arguments as users write them, checked up front: one resolver for ``zoo.build``,
``zoo.load``, ``zoo.from_hf`` and training.

    device   "auto" | "cpu" | "cuda" | "cuda:N" | "mps" | "meta", or a torch.device
    dtype    torch.float32 | torch.float16 | torch.bfloat16 | torch.float64, or the names
             "float32"/"fp32", "float16"/"fp16"/"half", "bfloat16"/"bf16", "float64"/"fp64"

So that no caller meets torch's own messages half-way through work (a ``pin_memory`` failure, "Torch not
compiled with CUDA enabled", an "Invalid device string" for a dtype), a value of the wrong type is an
`ArgumentTypeError` and a device that is not there a ValueError, each naming the argument and what it
accepts. ``None`` means what ``nn.Module`` construction means: the ambient default
(``with torch.device(...)``, ``torch.set_default_device``; `default_device`).
"""

from __future__ import annotations

import os
import reprlib
from typing import Any

import torch

__all__ = ["ArgumentTypeError", "default_device", "path_argument", "resolve_device", "resolve_dtype"]

_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = 60
_REPR.maxlist = _REPR.maxtuple = _REPR.maxdict = 4


class ArgumentTypeError(TypeError, ValueError):
    """A Python API argument of the wrong type (``zoo.build(42)``, ``zoo.load(5)``): a TypeError, as Python's
    own, and a ValueError, so that the CLI reports it in one line like every other user error. The message
    names the argument and what it accepts."""


DEVICE_HELP = "auto, cpu, cuda, cuda:N, mps or meta, or a torch.device"
_DTYPES = {
    "float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float64": torch.float64, "fp64": torch.float64, "double": torch.float64,
}  # fmt: skip
DTYPE_HELP = "torch.float32, torch.float16, torch.bfloat16 or torch.float64 (or their names, e.g. 'bf16')"


def resolve_device(
    device: str | torch.device, *, local_rank: int | None = None, argument: str = "device"
) -> torch.device:
    """``auto``: the GPU when CUDA is available, else the CPU. ``cuda`` means ``cuda:local_rank`` when a
    rank is given (one GPU per process under torchrun), else the current CUDA device.

    Raises `ArgumentTypeError` for a value that is neither a string nor a ``torch.device``, and ``ValueError``
    naming the device when the string is not a device or the device is absent.
    """
    if not isinstance(device, str | torch.device):
        raise ArgumentTypeError(f"{argument} must be {DEVICE_HELP}; got {_kind(device)}")
    name = str(device)
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and local_rank is not None:
        name = f"cuda:{local_rank}"
    try:
        resolved = torch.device(name)
    except RuntimeError:
        raise ValueError(
            f"{argument} {short_repr(str(device))} is not a device; expected {DEVICE_HELP}"
        ) from None
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(
                f"{argument} {str(device)!r} requested but CUDA is not available "
                "(torch.cuda.is_available() is False)"
            )
        if resolved.index is not None and resolved.index >= torch.cuda.device_count():
            raise ValueError(
                f"{argument} {str(device)!r} requested but only {torch.cuda.device_count()} CUDA device(s) exist"
            )
    if resolved.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"{argument} {str(device)!r} requested but MPS is not available on this machine")
    return resolved


def default_device() -> torch.device:
    """Where ``nn.Module`` construction would put tensors now: the innermost ``with torch.device(...)``, else
    ``torch.set_default_device``'s, else the CPU."""
    return torch.get_default_device()


def resolve_dtype(dtype: Any, *, argument: str = "dtype") -> torch.dtype | None:
    """``None`` (keep the dtype: stored, or the ambient default when building), or the floating-point dtype
    ``dtype`` names. A non-float dtype (int8, bool) is a ValueError, anything else an `ArgumentTypeError`."""
    if dtype is None:
        return None
    if isinstance(dtype, str):
        if dtype.lower().removeprefix("torch.") in _DTYPES:
            return _DTYPES[dtype.lower().removeprefix("torch.")]
        raise ValueError(
            f"{argument} {short_repr(dtype)} is not a dtype zoo builds in; expected {DTYPE_HELP}"
        )
    if not isinstance(dtype, torch.dtype):
        raise ArgumentTypeError(f"{argument} must be {DTYPE_HELP}; got {_kind(dtype)}")
    if dtype not in _DTYPES.values():
        raise ValueError(
            f"{argument} {dtype} is not a floating-point dtype a model computes in; expected {DTYPE_HELP}"
        )
    return dtype


def path_argument(path: Any, *, argument: str = "path", where: str) -> str | os.PathLike[str]:
    """``path`` when it is a ``str`` or an ``os.PathLike``; else an `ArgumentTypeError` naming ``where``
    (``zoo.load``) and the argument."""
    if isinstance(path, str | os.PathLike) and not isinstance(path, bytes):
        return path
    raise ArgumentTypeError(
        f"{where}: {argument} must be a folder or file path (str or os.PathLike); got {_kind(path)}"
    )


def _kind(value: object) -> str:
    """What a wrong argument is, for messages: its type, and a short repr (never a huge one)."""
    return f"{type(value).__name__} {short_repr(value)}"


def short_repr(value: object) -> str:
    """A bounded repr: a few elements, a few dozen characters, however large ``value`` is."""
    return _REPR.repr(value)
