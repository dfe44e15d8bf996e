"""Rotary angle rates and their long-context schedules, one function per `RopeScaling` type.

    scaling     rates (R/2,)                                              cos/sin scale   changes per call
    none        theta^(-2i/R)                                             1               -
    linear      theta^(-2i/R) / factor                                    1               -
    llama3      by wavelength: kept, divided by factor, or blended        1               -
    longrope    theta^(-2i/R) / factor_i, short or long set               attention_f.    the set (`position`)
    yarn        ramp between theta^(-2i/R) and it / factor over the dims  attention_f.    -
    dynamic     theta'^(-2i/R), theta' grown from the call's length L     1               the rates

Everything is computed in float32 in the order transformers' ``modeling_rope_utils`` uses, so the angles
agree with a Hugging Face model to the last bit. R is the number of rotating dims per head.
"""

from __future__ import annotations

import math

import torch

from zoo.spec.blocks import DynamicRopeScaling, LongRopeScaling, RopeScaling, YarnRopeScaling


def rotary_frequencies(theta: float, head_dim: int, scaling: RopeScaling | None = None) -> torch.Tensor:
    """(R/2,) float32 angle rates theta^(-2i/R), rescaled for long contexts as ``scaling`` says.

    ``head_dim`` is the number of dims that rotate (all of a head's, or its rotary fraction's). LongRoPE's
    rates here are its short-context set (`longrope_frequencies` gives either); dynamic NTK's are those of a
    call within the original context (`dynamic_frequencies` gives those of a longer one).
    """
    if scaling is not None and scaling.type == "longrope":
        return longrope_frequencies(theta, head_dim, scaling.short_factor)
    if scaling is not None and scaling.type == "yarn":
        return yarn_frequencies(theta, head_dim, scaling)
    if scaling is not None and scaling.type == "dynamic":
        return dynamic_frequencies(theta, head_dim, scaling, scaling.original_max_positions)
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)  # (R/2,)
    if scaling is None:
        return inv_freq
    if scaling.type == "linear":  # positions p / factor, folded into the rates
        return inv_freq / scaling.factor
    # llama3: keep short wavelengths, slow long ones by `factor`, blend those in between
    factor, low, high = scaling.factor, scaling.low_freq_factor, scaling.high_freq_factor
    original = scaling.original_max_positions
    wavelength = 2 * math.pi / inv_freq
    scaled = torch.where(wavelength > original / low, inv_freq / factor, inv_freq)
    if high == low:  # no band between the kept and the scaled wavelengths (Llama 4 Scout)
        return scaled
    smooth = (original / wavelength - low) / (high - low)  # 0 at the long end of the band, 1 at the short
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    in_band = ~(wavelength < original / high) & ~(wavelength > original / low)
    return torch.where(in_band, blended, scaled)


def longrope_frequencies(theta: float, head_dim: int, factors: list[float]) -> torch.Tensor:
    """(R/2,) LongRoPE rates: rate i is theta^(-2i/R) divided by its own factor (as transformers divides)."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim  # (R/2,)
    return 1.0 / (torch.tensor(factors, dtype=torch.float32) * theta**exponents)


def longrope_attention_factor(scaling: LongRopeScaling, max_positions: int) -> float:
    """The cos/sin scale: given, or transformers' default sqrt(1 + ln(s) / ln(original)), s = extension."""
    if scaling.attention_factor is not None:
        return scaling.attention_factor
    extension = max_positions / scaling.original_max_positions
    if extension <= 1.0:
        return 1.0
    return math.sqrt(1 + math.log(extension) / math.log(scaling.original_max_positions))


def attention_factor(scaling: RopeScaling | None, max_positions: int) -> float:
    """What cos and sin are multiplied by: LongRoPE's and YaRN's attention factor, else 1."""
    if scaling is not None and scaling.type == "longrope":
        return longrope_attention_factor(scaling, max_positions)
    if scaling is not None and scaling.type == "yarn":
        return scaling.resolved_attention_factor()
    return 1.0


def yarn_frequencies(theta: float, head_dim: int, scaling: YarnRopeScaling) -> torch.Tensor:
    """(R/2,) YaRN rates (transformers' ``_compute_yarn_parameters``): dim pair i keeps its rate where it turns
    more than ``beta_fast`` times within the original context, takes rate / factor where it turns fewer than
    ``beta_slow`` times, and a linear blend of the two in between."""
    dim, original = head_dim, scaling.original_max_positions

    def correction_dim(turns: float) -> float:  # the dim pair that turns ``turns`` times within the original
        return (dim * math.log(original / (turns * 2 * math.pi))) / (2 * math.log(theta))

    low, high = correction_dim(scaling.beta_fast), correction_dim(scaling.beta_slow)
    if scaling.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # transformers' guard against a zero-width ramp
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)  # (R/2,) 0 -> 1
    keep = 1 - ramp  # 1: the dim pair extrapolates (keeps its rate), 0: it is interpolated
    rates = theta ** (torch.arange(0, dim, 2).float() / dim)  # (R/2,) wavelengths / 2 pi
    return (1.0 / (scaling.factor * rates)) * (1 - keep) + (1.0 / rates) * keep


def dynamic_frequencies(
    theta: float, head_dim: int, scaling: DynamicRopeScaling, length: int | torch.Tensor
) -> torch.Tensor:
    """(R/2,) dynamic-NTK rates for a call whose sequence is ``length`` long (an int, or a () tensor on the
    device: no host sync). A length within the original context counts as the original context.

    As transformers: the base theta * (factor * L / original - (factor - 1)) ** (R / (R - 2)), in Python
    floats for an int length (its rates at build time) and in float32 for a tensor (its rates per call)."""
    dim, factor, original = head_dim, scaling.factor, scaling.original_max_positions
    if isinstance(length, torch.Tensor):
        length = torch.maximum(length, torch.tensor(original, dtype=length.dtype, device=length.device))
    else:
        length = max(length, original)
    base = theta * ((factor * length / original) - (factor - 1)) ** (dim / (dim - 2))
    device = length.device if isinstance(length, torch.Tensor) else None
    exponents = torch.arange(0, dim, 2, dtype=torch.int64, device=device).float() / dim  # (R/2,)
    return 1.0 / (base**exponents)
