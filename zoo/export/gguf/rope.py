"""Rotary scaling as llama.cpp reads it, from a Hugging Face config's ``rope_scaling`` (what
`zoo.io.hf.rope.rope_to_config` writes for zoo's ``position.scaling``):

    rope_type   written as                                  llama.cpp applies it
    linear      {arch}.rope.scaling.type = linear           every rate times 1 / factor (``freq_scale``)
                {arch}.rope.scaling.factor = factor
    llama3      rope_freqs.weight: (rotary dims / 2,) f32   rate i divided by factor i (ggml's rope
                (llama.cpp's ``llama`` architecture only)   ``freq_factors``: theta / ff)

Llama 3's factors follow llama.cpp's converter (``LlamaModel.generate_extra_tensors``, read, not copied):
1 for wavelengths shorter than original / high_freq_factor, ``factor`` for those longer than original /
low_freq_factor, and in between 1 / ((1 - s) / factor + s) with s the smooth blend. Here they are computed
from the config alone, so the tests can check them against zoo's own rates (`zoo.blocks.position`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch


def scaling_kind(config: Mapping[str, Any]) -> str | None:
    """The config's rope scaling type (``rope_type``, or 4.x's ``type``); None for plain RoPE."""
    scaling = config.get("rope_scaling") or {}
    kind = scaling.get("rope_type") or scaling.get("type")
    return None if kind in (None, "default") else str(kind)


def linear_type(config: Mapping[str, Any]) -> str | None:
    """``linear`` where the config scales linearly (the ``rope.scaling.type`` row), else None."""
    return "linear" if scaling_kind(config) == "linear" else None


def linear_factor(config: Mapping[str, Any]) -> float | None:
    """Linear scaling's factor (the ``rope.scaling.factor`` row), else None."""
    return float(config["rope_scaling"]["factor"]) if scaling_kind(config) == "linear" else None


def llama3_factors(config: Mapping[str, Any], dims: int) -> torch.Tensor:
    """(dims/2,) float32: the divisor of each rotary rate that turns plain RoPE's rates into Llama 3's, as
    llama.cpp reads them from ``rope_freqs.weight``; ``dims``: how many of a head's dimensions rotate."""
    scaling = config["rope_scaling"]
    factor, low, high = (float(scaling[k]) for k in ("factor", "low_freq_factor", "high_freq_factor"))
    original = float(scaling["original_max_position_embeddings"])
    theta = float(config["rope_theta"])
    rates = 1.0 / theta ** (torch.arange(0, dims, 2, dtype=torch.float32) / dims)  # (dims/2,)
    factors = []
    for rate in rates.tolist():
        wavelength = 2 * math.pi / rate
        if wavelength < original / high:  # short wavelengths: kept
            factors.append(1.0)
        elif wavelength > original / low:  # long ones: slowed by factor
            factors.append(factor)
        else:  # the band between: blended smoothly
            smooth = (original / wavelength - low) / (high - low)
            factors.append(1.0 / ((1.0 - smooth) / factor + smooth))
    return torch.tensor(factors, dtype=torch.float32)
