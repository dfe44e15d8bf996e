"""Position information, one module per `PositionSpec` kind. Each plays one of three roles:

    absolute  (sinusoidal, learned)    a (B, T, E) table row added to the token embeddings
    rotary    (rotary)                 (cos, sin) that rotate queries and keys inside attention
    bias      (relative_bias, alibi)   a (1, H, Tq, Tk) additive logit bias, computed once per stack

The stack asks ``module.role`` and calls the matching method; nothing here knows which model it serves.
Fixed tables are non-persistent float32 buffers (not saved, recomputed by `reset_buffers` after a meta-device
build) that follow the model's device but never its dtype (`FixedTables`): each use casts what it reads.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from zoo.spec import PositionSpec
from zoo.spec.blocks import RopeScaling


def sinusoidal_table(
    num_positions: int, dim: int, *, layout: str = "interleaved", frequencies: str = "paper"
) -> torch.Tensor:
    """(P, dim) float32: PE[pos, 2i] = sin(pos * w_i), PE[pos, 2i+1] = cos(pos * w_i).

    ``frequencies="paper"``: w_i = 10000^(-2i/dim) (Vaswani et al. 2017, section 3.5); ``"fairseq"``:
    w_i = exp(-i * ln(10000) / (dim/2 - 1)), tensor2tensor's spacing that fairseq and M2M-100 use (the
    slowest rate is exactly 1/10000). ``layout="half"`` puts all sines in the first half and all cosines in
    the second (Marian, fairseq). Computed in float64, then rounded once: transformers computes M2M-100's
    table in float32, whose values drift by up to ~7e-5 by position 1000.
    """
    position = torch.arange(num_positions, dtype=torch.float64)[:, None]  # (P, 1)
    if frequencies == "fairseq":
        if dim < 4:
            raise ValueError(f"fairseq sinusoids divide by dim/2 - 1: dim must be at least 4, got {dim}")
        step = math.log(10000.0) / (dim // 2 - 1)
        inv_freq = torch.exp(-step * torch.arange(dim // 2, dtype=torch.float64))  # (dim/2,)
    else:
        inv_freq = 10000.0 ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)  # (dim/2,)
    angles = position * inv_freq  # (P, dim/2)
    if layout == "half":
        table = torch.cat([angles.sin(), angles.cos()], dim=-1)
    else:
        table = torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(1)  # sin, cos, sin, cos, ...
    return table.float()


class FixedTables(nn.Module):
    """Base of a module whose buffers are fixed float32 tables, computed by ``reset_buffers``.

    The tables move with the module (``.to(device)``, ``.cuda()``, ``to_empty``) but keep float32 through
    any cast (``.to(torch.bfloat16)``, ``.half()``): a model built with ``dtype=bfloat16`` then holds the
    same tables as one loaded in bfloat16 (`zoo.load` recomputes them), and each use casts the rows it
    reads to the activations' dtype — as Hugging Face keeps rotary ``inv_freq`` in float32.
    """

    def reset_buffers(self) -> None:
        raise NotImplementedError

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True) -> FixedTables:
        tables = dict(self._buffers)
        super()._apply(fn, recurse)
        for name, table in tables.items():
            moved = self._buffers[name]
            if table is not None and moved is not None and moved.dtype != table.dtype:
                # ``fn`` cast the table: keep the float32 one, on the device ``fn`` chose (from meta: no
                # values to copy, `reset_buffers` fills it)
                self._buffers[name] = (
                    torch.empty_like(table, device=moved.device) if table.is_meta else table.to(moved.device)
                )
        return self


class SinusoidalPositions(FixedTables):
    """The fixed table of `sinusoidal_table`; position p reads row p + ``offset`` (fairseq reserves the
    rows up to its padding index, so M2M-100's first token reads row 2)."""

    role = "absolute"
    table: torch.Tensor  # buffer (P + offset, E)

    def __init__(
        self, *, layout: str, max_positions: int, dim: int, offset: int = 0, frequencies: str = "paper"
    ) -> None:
        super().__init__()
        self.layout, self.frequencies, self.offset = layout, frequencies, offset
        self.max_positions, self.dim = max_positions, dim
        # Sized by the longest sequence, never by the vocabulary (sizing it by the vocabulary is a common slip).
        self.register_buffer("table", torch.empty(max_positions + offset, dim), persistent=False)
        self.reset_buffers()

    def reset_buffers(self) -> None:
        rows = self.max_positions + self.offset
        table = sinusoidal_table(rows, self.dim, layout=self.layout, frequencies=self.frequencies)
        self.table = table.to(self.table.device)

    def forward(self, position_ids: torch.Tensor) -> torch.Tensor:
        return self.table[position_ids + self.offset if self.offset else position_ids]  # (B, T, E)


class LearnedPositions(nn.Module):
    role = "absolute"

    def __init__(self, *, offset: int, max_positions: int, dim: int) -> None:
        super().__init__()
        self.offset = offset
        self.weight = nn.Parameter(torch.empty(max_positions + offset, dim))

    def forward(self, position_ids: torch.Tensor) -> torch.Tensor:
        return self.weight[position_ids + self.offset]  # (B, T, E)


def rotary_frequencies(theta: float, head_dim: int, scaling: RopeScaling | None = None) -> torch.Tensor:
    """(D/2,) float32 angle rates theta^(-2i/D), rescaled for long contexts as ``scaling`` says.

    Computed in float32 in the order transformers' ``modeling_rope_utils`` uses, so the tables agree with a
    Hugging Face model to the last bits.
    """
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)  # (D/2,)
    if scaling is None:
        return inv_freq
    if scaling.type == "linear":  # positions p / factor, folded into the rates
        return inv_freq / scaling.factor
    # llama3: keep short wavelengths, slow long ones by `factor`, blend those in between
    factor, low, high = scaling.factor, scaling.low_freq_factor, scaling.high_freq_factor
    original = scaling.original_max_positions
    wavelength = 2 * math.pi / inv_freq
    scaled = torch.where(wavelength > original / low, inv_freq / factor, inv_freq)
    smooth = (original / wavelength - low) / (high - low)  # 0 at the long end of the band, 1 at the short
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    in_band = ~(wavelength < original / high) & ~(wavelength > original / low)
    return torch.where(in_band, blended, scaled)


class RotaryPositions(FixedTables):
    """RoPE with the rotate-half layout (GPT-NeoX, Llama): dims (i, i + D/2) form a rotating pair.

    ``scaling`` (Llama 3's or linear) only changes the angle rates; the tables stay fixed per position.
    ``local_theta`` adds a second pair of tables, plain RoPE with that base, for the sliding-window layers
    (Gemma 3, ModernBERT): the stack asks for them with ``local=True``.
    """

    role = "rotary"
    cos: torch.Tensor  # buffer (P, D)
    sin: torch.Tensor  # buffer (P, D)
    local_cos: torch.Tensor | None  # buffer (P, D) with local_theta
    local_sin: torch.Tensor | None

    def __init__(
        self,
        *,
        theta: float,
        max_positions: int,
        head_dim: int,
        scaling: RopeScaling | None = None,
        local_theta: float | None = None,
    ) -> None:
        super().__init__()
        self.theta, self.max_positions, self.head_dim, self.scaling = theta, max_positions, head_dim, scaling
        self.local_theta = local_theta
        self.register_buffer("cos", torch.empty(max_positions, head_dim), persistent=False)
        self.register_buffer("sin", torch.empty(max_positions, head_dim), persistent=False)
        local = torch.empty(max_positions, head_dim) if local_theta is not None else None
        self.register_buffer("local_cos", local, persistent=False)
        self.register_buffer("local_sin", None if local is None else local.clone(), persistent=False)
        self.reset_buffers()

    def _tables(self, theta: float, scaling: RopeScaling | None) -> tuple[torch.Tensor, torch.Tensor]:
        inv_freq = rotary_frequencies(theta, self.head_dim, scaling)  # (D/2,)
        angles = torch.arange(self.max_positions, dtype=torch.float32)[:, None] * inv_freq  # (P, D/2)
        angles = torch.cat([angles, angles], dim=-1)  # (P, D)
        return angles.cos().to(self.cos.device), angles.sin().to(self.sin.device)

    def reset_buffers(self) -> None:
        self.cos, self.sin = self._tables(self.theta, self.scaling)
        if self.local_theta is not None:
            self.local_cos, self.local_sin = self._tables(self.local_theta, None)

    def forward(
        self, position_ids: torch.Tensor, *, local: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, T) positions -> (cos, sin), (B, 1, T, D) each; ``local``: the sliding layers' tables."""
        if local and self.local_cos is not None and self.local_sin is not None:
            return self.local_cos[position_ids][:, None], self.local_sin[position_ids][:, None]
        return self.cos[position_ids][:, None], self.sin[position_ids][:, None]  # (B, 1, T, D) each


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate (B, H, T, D) queries or keys by their positions' angles."""
    first, second = x.chunk(2, dim=-1)
    rotated = torch.cat([-second, first], dim=-1)
    return x * cos.to(x.dtype) + rotated * sin.to(x.dtype)


class RelativeBias(nn.Module):
    """T5's bucketed relative position bias (Raffel et al. 2020, section 2.1), one table per stack.

    Half the buckets are exact small distances, the rest log-spaced up to ``max_distance``; a
    bidirectional (encoder) stack splits them between keys before and after the query.
    """

    role = "bias"

    def __init__(self, *, num_buckets: int, max_distance: int, num_heads: int, bidirectional: bool) -> None:
        super().__init__()
        self.num_buckets, self.max_distance, self.bidirectional = num_buckets, max_distance, bidirectional
        self.weight = nn.Parameter(torch.empty(num_buckets, num_heads))

    def bucket(self, relative: torch.Tensor) -> torch.Tensor:
        """Bucket index for each key-minus-query distance."""
        num_buckets, buckets = self.num_buckets, torch.zeros_like(relative)
        if self.bidirectional:
            num_buckets //= 2
            buckets = buckets + (relative > 0).long() * num_buckets
            distance = relative.abs()
        else:
            distance = -torch.clamp(relative, max=0)
        max_exact = num_buckets // 2
        log_ratio = torch.log(distance.float().clamp(min=1) / max_exact) / math.log(
            self.max_distance / max_exact
        )
        large = (max_exact + log_ratio * (num_buckets - max_exact)).long().clamp(max=num_buckets - 1)
        return buckets + torch.where(distance < max_exact, distance, large)

    def forward(self, q_len: int, k_len: int) -> torch.Tensor:
        q_pos = torch.arange(k_len - q_len, k_len, device=self.weight.device)[:, None]
        k_pos = torch.arange(k_len, device=self.weight.device)[None, :]
        values = self.weight[self.bucket(k_pos - q_pos)]  # (Tq, Tk, H)
        return values.permute(2, 0, 1)[None]  # (1, H, Tq, Tk)


class AlibiBias(FixedTables):
    """ALiBi (Press et al. 2022): logit penalty slope_h * distance, slopes a geometric sequence per head."""

    role = "bias"
    slopes: torch.Tensor  # buffer (H,)

    def __init__(self, *, num_heads: int, bidirectional: bool) -> None:
        super().__init__()
        self.num_heads, self.bidirectional = num_heads, bidirectional
        self.register_buffer("slopes", torch.empty(num_heads), persistent=False)
        self.reset_buffers()

    def reset_buffers(self) -> None:
        self.slopes = alibi_slopes(self.num_heads).to(self.slopes.device)

    def forward(self, q_len: int, k_len: int) -> torch.Tensor:
        q_pos = torch.arange(k_len - q_len, k_len, device=self.slopes.device)[:, None]
        k_pos = torch.arange(k_len, device=self.slopes.device)[None, :]
        # Future keys of a causal stack are masked anyway; clamping keeps their bias at 0, not positive.
        distance = -(k_pos - q_pos).abs() if self.bidirectional else (k_pos - q_pos).clamp(max=0)  # (Tq, Tk)
        return (self.slopes[:, None, None] * distance.float())[None]  # (1, H, Tq, Tk)


def alibi_slopes(num_heads: int) -> torch.Tensor:
    """The paper's slopes 2^(-8i/n); for a head count that is not a power of two, interleave the next one."""
    closest = 2 ** math.floor(math.log2(num_heads))
    slopes = [2 ** (-8 * (i + 1) / closest) for i in range(closest)]
    if closest < num_heads:
        extra = [2 ** (-4 * (i + 1) / closest) for i in range(2 * closest)][0::2]
        slopes += extra[: num_heads - closest]
    return torch.tensor(slopes, dtype=torch.float32)


class NoPositions(nn.Module):
    role = "none"


def build_positions(
    spec: PositionSpec, *, max_positions: int, dim: int, head_dim: int, num_heads: int, causal: bool
) -> nn.Module:
    """The position module for ``spec`` (one registry from kind to class, no name-based switches)."""
    if spec.kind == "sinusoidal":
        return SinusoidalPositions(
            layout=spec.layout,
            max_positions=max_positions,
            dim=dim,
            offset=spec.offset,
            frequencies=spec.frequencies,
        )
    if spec.kind == "learned":
        return LearnedPositions(offset=spec.offset, max_positions=max_positions, dim=dim)
    if spec.kind == "rotary":
        return RotaryPositions(
            theta=spec.theta,
            max_positions=max_positions,
            head_dim=head_dim,
            scaling=spec.scaling,
            local_theta=spec.local_theta,
        )
    if spec.kind == "relative_bias":
        return RelativeBias(
            num_buckets=spec.num_buckets,
            max_distance=spec.max_distance,
            num_heads=num_heads,
            bidirectional=not causal,
        )
    if spec.kind == "alibi":
        return AlibiBias(num_heads=num_heads, bidirectional=not causal)
    return NoPositions()
