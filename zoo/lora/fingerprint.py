"""The base fingerprint an adapter file records: which base weights its adapters were trained on.

sha256 over each targeted base weight's name and shape, and 4,096 of its values taken at evenly spaced
positions, rounded to bfloat16. A base stored NF4 (QLoRA, `zoo.lora.nf4`) no longer holds its dense values,
so its layers keep the `WeightSample` taken before quantising: the fingerprint of a QLoRA run's adapters is
that of the dense base they were trained from, and they load onto it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from zoo.lora.errors import LoraError

FINGERPRINT_METHOD = "sha256/bf16-strided-4096/v1"
_SAMPLES = 4096  # values read from each targeted weight for the fingerprint


@dataclass(frozen=True)
class WeightSample:
    """What the fingerprint reads from one weight: its shape and its sampled values (bfloat16-rounded,
    float32, on the CPU; at most 4,096)."""

    shape: tuple[int, ...]
    values: torch.Tensor  # (≤ 4096,)


def weight_sample(weight: torch.Tensor, *, name: str = "weight") -> WeightSample:
    """The shape and the 4,096 evenly spaced values of ``weight`` the fingerprint reads."""
    if weight.is_meta:
        raise LoraError(f"{name}: a meta tensor (the base was never loaded); cannot fingerprint it")
    flat = weight.detach().reshape(-1)
    picks = torch.linspace(0, flat.numel() - 1, min(_SAMPLES, flat.numel())).round().long()
    # float32 positions: past 2**24 elements the last one can round up past the end (a 16384 x 2048 FFN
    # weight did); clamped, every fingerprint that could be computed before stays the same.
    picks = picks.clamp_(max=flat.numel() - 1)
    values = flat[picks.to(flat.device)].to(torch.bfloat16).float().cpu()
    return WeightSample(tuple(weight.shape), values)


def base_fingerprint(weights: Mapping[str, torch.Tensor | WeightSample]) -> str:
    """A cheap hash that tells two bases of the same shapes apart: sha256 over each targeted base weight's
    name and shape, and 4,096 of its values taken at evenly spaced positions, rounded to bfloat16 (a
    `WeightSample` stands for a weight whose dense values are gone: an NF4 base).

    The rounding makes a base loaded in float32 and the same base in bfloat16 give the same fingerprint
    (float16 usually does too, save where double rounding or its narrower range changes a sampled value).
    It is a check against a mix-up, not a signature: two bases differing only off the sampled positions
    share it.
    """
    digest = hashlib.sha256(FINGERPRINT_METHOD.encode())
    for name, weight in sorted(weights.items()):
        sample = weight if isinstance(weight, WeightSample) else weight_sample(weight, name=name)
        digest.update(f"{name}:{list(sample.shape)};".encode())
        digest.update(sample.values.numpy().tobytes())
    return digest.hexdigest()
