"""Device names as users write them: ``auto``, ``cpu``, ``cuda``, ``cuda:N``, ``mps``: checked up front.

One place turns a string into a ``torch.device`` and says clearly when the device cannot be used, so that
no caller meets torch's own messages (a ``pin_memory`` failure, an allocator error) half-way through work.
"""

from __future__ import annotations

import torch


def resolve_device(device: str | torch.device, *, local_rank: int | None = None) -> torch.device:
    """``auto``: the GPU when CUDA is available, else the CPU. ``cuda`` means ``cuda:local_rank`` when a
    rank is given (one GPU per process under torchrun), else the current CUDA device.

    Raises ``ValueError`` naming the device when the string is not a device or the device is absent.
    """
    name = str(device)
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and local_rank is not None:
        name = f"cuda:{local_rank}"
    try:
        resolved = torch.device(name)
    except RuntimeError:
        raise ValueError(
            f"device {str(device)!r} is not a device; expected auto, cpu, cuda, cuda:N or mps"
        ) from None
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(
                f"device {str(device)!r} requested but CUDA is not available "
                "(torch.cuda.is_available() is False)"
            )
        if resolved.index is not None and resolved.index >= torch.cuda.device_count():
            raise ValueError(
                f"device {str(device)!r} requested but only {torch.cuda.device_count()} CUDA device(s) exist"
            )
    if resolved.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"device {str(device)!r} requested but MPS is not available on this machine")
    return resolved
