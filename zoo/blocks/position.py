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


def sinusoidal_table(num_positions: int, dim: int, *, layout: str = "interleaved") -> torch.Tensor:
    """(P, dim) float32: PE[pos, 2i] = sin(pos / 10000^(2i/dim)), PE[pos, 2i+1] = cos(same).

    ``layout="half"`` puts all sines in the first half and all cosines in the second (Marian, fairseq).
    """
    position = torch.arange(num_positions, dtype=torch.float64)[:, None]  # (P, 1)
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
    role = "absolute"
    table: torch.Tensor  # buffer (P, E)

    def __init__(self, *, layout: str, max_positions: int, dim: int) -> None:
        super().__init__()
        self.layout, self.max_positions, self.dim = layout, max_positions, dim
        # Sized by the longest sequence, never by the vocabulary (sizing it by the vocabulary is a common slip).
        self.register_buffer("table", torch.empty(max_positions, dim), persistent=False)
        self.reset_buffers()

    def reset_buffers(self) -> None:
        self.table = sinusoidal_table(self.max_positions, self.dim, layout=self.layout).to(self.table.device)

    def forward(self, position_ids: torch.Tensor) -> torch.Tensor:
        return self.table[position_ids]  # (B, T, E)


class LearnedPositions(nn.Module):
    role = "absolute"

    def __init__(self, *, offset: int, max_positions: int, dim: int) -> None:
        super().__init__()
        self.offset = offset
        self.weight = nn.Parameter(torch.empty(max_positions + offset, dim))

    def forward(self, position_ids: torch.Tensor) -> torch.Tensor:
        return self.weight[position_ids + self.offset]  # (B, T, E)


class RotaryPositions(FixedTables):
    """RoPE with the rotate-half layout (GPT-NeoX, Llama): dims (i, i + D/2) form a rotating pair."""

    role = "rotary"
    cos: torch.Tensor  # buffer (P, D)
    sin: torch.Tensor  # buffer (P, D)

    def __init__(self, *, theta: float, max_positions: int, head_dim: int) -> None:
        super().__init__()
        self.theta, self.max_positions, self.head_dim = theta, max_positions, head_dim
        self.register_buffer("cos", torch.empty(max_positions, head_dim), persistent=False)
        self.register_buffer("sin", torch.empty(max_positions, head_dim), persistent=False)
        self.reset_buffers()

    def reset_buffers(self) -> None:
        inv_freq = 1.0 / self.theta ** (
            torch.arange(0, self.head_dim, 2, dtype=torch.float32) / self.head_dim
        )
        angles = torch.arange(self.max_positions, dtype=torch.float32)[:, None] * inv_freq  # (P, D/2)
        angles = torch.cat([angles, angles], dim=-1)  # (P, D)
        self.cos, self.sin = angles.cos().to(self.cos.device), angles.sin().to(self.sin.device)

    def forward(self, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
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
        return SinusoidalPositions(layout=spec.layout, max_positions=max_positions, dim=dim)
    if spec.kind == "learned":
        return LearnedPositions(offset=spec.offset, max_positions=max_positions, dim=dim)
    if spec.kind == "rotary":
        return RotaryPositions(theta=spec.theta, max_positions=max_positions, head_dim=head_dim)
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
