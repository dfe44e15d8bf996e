"""Position information, one module per `PositionSpec` kind. Each plays one of three roles:

    absolute  (sinusoidal, learned)    a (B, T, E) table row added to the token embeddings
    rotary    (rotary)                 (cos, sin) that rotate queries and keys inside attention
    bias      (relative_bias, alibi)   a (1, H, Tq, Tk) additive logit bias, computed once per stack

Learned positions may also carry a relative bias (MPNet: both signals): `build_position_bias` makes that
second module, which the stack adds to the logits as it does a ``bias`` role.

The stack asks ``module.role`` and calls the matching method; nothing here knows which model it serves.
Fixed tables are non-persistent float32 buffers (not saved, recomputed by `reset_buffers` after a meta-device
build) that follow the model's device but never its dtype (`FixedTables`): each use casts what it reads.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from zoo.blocks.rope_scaling import (
    attention_factor,
    dynamic_frequencies,
    longrope_frequencies,
    rotary_frequencies,
)
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

    def _fill_tables(self) -> None:
        """`reset_buffers` at construction; on the meta device, nothing: the tables keep the shapes
        ``__init__`` registered, in float32, with no values (a meta build's loader calls `reset_buffers` once
        the model is on a real device). Computing them there would cost a second or more per `zoo show`:
        torch runs ``arange``, ``pow`` and friends on meta tensors through reference implementations that
        import its compiler."""
        if torch.get_default_device().type != "meta":
            self.reset_buffers()
            return
        for name, table in self._buffers.items():
            if table is not None:
                self._buffers[name] = table.float()

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
        self._fill_tables()

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


class RotaryPositions(FixedTables):
    """RoPE with the rotate-half layout (GPT-NeoX, Llama): dims (i, i + R/2) form a rotating pair, for the
    first R = ``rotary_dims`` dims of each head (all of them unless the spec's ``fraction`` < 1).

    ``scaling`` (Llama 3's, linear, YaRN) only changes the angle rates and, for YaRN, the cos/sin scale; the
    tables stay fixed per position (`zoo.blocks.rope_scaling`). LongRoPE keeps two pairs of tables, short and
    long, and each forward reads the long pair when its largest position id reaches past
    ``original_max_positions`` (transformers' rule, per call): a ``torch.where`` on that one flag, so
    compiled and exported graphs keep both branches. Dynamic NTK reads the tables while a forward stays
    within its original context and computes the angles from the forward's length past it, behind the same
    kind of ``torch.where``.
    ``local_theta`` adds a second pair of tables, plain RoPE with that base, for the sliding-window layers
    (Gemma 3, ModernBERT): the stack asks for them with ``local=True``.
    """

    role = "rotary"
    cos: torch.Tensor  # buffer (P, R)
    sin: torch.Tensor  # buffer (P, R)
    long_cos: torch.Tensor | None  # buffer (P, R), LongRoPE only
    long_sin: torch.Tensor | None
    local_cos: torch.Tensor | None  # buffer (P, R) with local_theta
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
        self.longrope = scaling if scaling is not None and scaling.type == "longrope" else None
        self.dynamic = scaling if scaling is not None and scaling.type == "dynamic" else None
        self.scale = attention_factor(scaling, max_positions)  # of cos and sin: LongRoPE's, YaRN's
        self.local_theta = local_theta
        wanted = {"long": self.longrope is not None, "local": local_theta is not None}
        for name in ("cos", "sin", "long_cos", "long_sin", "local_cos", "local_sin"):
            kind = name.split("_")[0] if "_" in name else None
            table = torch.empty(max_positions, head_dim) if kind is None or wanted[kind] else None
            self.register_buffer(name, table, persistent=False)
        self._fill_tables()

    @property
    def switch_length(self) -> int | None:
        """LongRoPE: a forward whose largest position reaches this length or past it reads the long tables,
        so keys cached by earlier, shorter forwards were rotated the other way (`zoo.generation.session`
        recomputes them); None when the tables never change."""
        return self.longrope.original_max_positions + 1 if self.longrope is not None else None

    def reset_buffers(self) -> None:
        inv_freq = rotary_frequencies(self.theta, self.head_dim, self.scaling)  # (R/2,)
        self.cos, self.sin = self._tables(inv_freq, scaled=True)
        if self.longrope is not None:
            long = longrope_frequencies(self.theta, self.head_dim, self.longrope.long_factor)
            self.long_cos, self.long_sin = self._tables(long, scaled=True)
        if self.local_theta is not None:
            local = rotary_frequencies(self.local_theta, self.head_dim, None)
            self.local_cos, self.local_sin = self._tables(local, scaled=False)

    def _tables(self, inv_freq: torch.Tensor, *, scaled: bool) -> tuple[torch.Tensor, torch.Tensor]:
        angles = torch.arange(self.max_positions, dtype=torch.float32)[:, None] * inv_freq  # (P, R/2)
        angles = torch.cat([angles, angles], dim=-1)  # (P, R)
        cos, sin = angles.cos(), angles.sin()
        if scaled and self.scale != 1.0:  # transformers scales LongRoPE's both sets, short contexts included
            cos, sin = cos * self.scale, sin * self.scale
        return cos.to(self.cos.device), sin.to(self.sin.device)

    def forward(
        self, position_ids: torch.Tensor, *, local: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, T) positions -> (cos, sin), (B, 1, T, R) each; ``local``: the sliding layers' tables."""
        if local and self.local_cos is not None and self.local_sin is not None:
            return self.local_cos[position_ids][:, None], self.local_sin[position_ids][:, None]
        cos, sin = self.cos[position_ids], self.sin[position_ids]  # (B, T, R) each
        if self.longrope is not None:
            assert self.long_cos is not None and self.long_sin is not None  # built with self.longrope
            long = position_ids.max() + 1 > self.longrope.original_max_positions  # () bool, no sync
            cos = torch.where(long, self.long_cos[position_ids], cos)
            sin = torch.where(long, self.long_sin[position_ids], sin)
        if self.dynamic is not None:
            length = position_ids.max() + 1  # () the forward's sequence length, cache included: no sync
            inv_freq = dynamic_frequencies(self.theta, self.head_dim, self.dynamic, length)  # (R/2,)
            angles = position_ids[..., None].float() * inv_freq  # (B, T, R/2)
            angles = torch.cat([angles, angles], dim=-1)  # (B, T, R)
            grown = length > self.dynamic.original_max_positions  # () bool
            cos, sin = torch.where(grown, angles.cos(), cos), torch.where(grown, angles.sin(), sin)
        return cos[:, None], sin[:, None]  # (B, 1, T, R) each


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate (B, H, T, D) queries or keys by their positions' angles; with (.., R) tables, R < D, only the
    first R dims of each head rotate and the rest pass through (partial rotary)."""
    rotary = cos.shape[-1]
    if rotary < x.shape[-1]:
        turned, kept = x[..., :rotary], x[..., rotary:]  # (B, H, T, R), (B, H, T, D - R)
        return torch.cat([apply_rotary(turned, cos, sin), kept], dim=-1)
    first, second = x.chunk(2, dim=-1)
    rotated = torch.cat([-second, first], dim=-1)
    return x * cos.to(x.dtype) + rotated * sin.to(x.dtype)


class RelativeBias(nn.Module):
    """T5's bucketed relative position bias (Raffel et al. 2020, section 2.1), one table per stack, or one
    per layer (``num_layers``: umT5, Chung et al. 2023), all gathered from one (L, buckets, H) parameter.

    Half the buckets are exact small distances, the rest log-spaced up to ``max_distance``; a
    bidirectional (encoder) stack splits them between keys before and after the query.
    """

    role = "bias"

    def __init__(
        self,
        *,
        num_buckets: int,
        max_distance: int,
        num_heads: int,
        bidirectional: bool,
        num_layers: int | None = None,
    ) -> None:
        super().__init__()
        self.num_buckets, self.max_distance, self.bidirectional = num_buckets, max_distance, bidirectional
        self.per_layer = num_layers is not None
        shape = (num_buckets, num_heads) if num_layers is None else (num_layers, num_buckets, num_heads)
        self.weight = nn.Parameter(torch.empty(shape))  # (buckets, H) or per layer (L, buckets, H)

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
        # truncated before max_exact is added, as in Mesh TensorFlow and transformers: the same bucket even
        # where the scaled log is negative (a max_distance below max_exact) or a hair under an integer
        large = (max_exact + (log_ratio * (num_buckets - max_exact)).long()).clamp(max=num_buckets - 1)
        return buckets + torch.where(distance < max_exact, distance, large)

    def forward(self, q_len: int, k_len: int, *, layer: int | None = None) -> torch.Tensor:
        """(1, H, Tq, Tk) bias for the last ``q_len`` of ``k_len`` positions; per-layer tables need ``layer``."""
        if self.per_layer == (layer is None):
            raise ValueError(f"a {'per-layer' if self.per_layer else 'shared'} bias table: layer={layer}")
        q_pos = torch.arange(k_len - q_len, k_len, device=self.weight.device)[:, None]
        k_pos = torch.arange(k_len, device=self.weight.device)[None, :]
        table = self.weight if layer is None else self.weight[layer]  # (buckets, H)
        values = table[self.bucket(k_pos - q_pos)]  # (Tq, Tk, H)
        return values.permute(2, 0, 1)[None]  # (1, H, Tq, Tk)


class AlibiBias(FixedTables):
    """ALiBi (Press et al. 2022): logit penalty slope_h * distance, slopes a geometric sequence per head."""

    role = "bias"
    per_layer = False  # one bias for every layer
    slopes: torch.Tensor  # buffer (H,)

    def __init__(self, *, num_heads: int, bidirectional: bool) -> None:
        super().__init__()
        self.num_heads, self.bidirectional = num_heads, bidirectional
        self.register_buffer("slopes", torch.empty(num_heads), persistent=False)
        self._fill_tables()

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


def build_position_bias(spec: PositionSpec, *, num_heads: int, causal: bool) -> RelativeBias | None:
    """The relative bias an absolute position kind carries beside its table (MPNet's), or None."""
    bias = getattr(spec, "relative_bias", None)
    if bias is None:
        return None
    return RelativeBias(
        num_buckets=bias.num_buckets,
        max_distance=bias.max_distance,
        num_heads=num_heads,
        bidirectional=not causal,
    )


def build_positions(
    spec: PositionSpec,
    *,
    max_positions: int,
    dim: int,
    head_dim: int,
    num_heads: int,
    causal: bool,
    num_layers: int = 1,
) -> nn.Module:
    """The position module for ``spec`` (one registry from kind to class, no name-based switches);
    ``num_layers``: the stack's depth, for tables kept per layer."""
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
            head_dim=spec.rotary_dims(head_dim),
            scaling=spec.scaling,
            local_theta=spec.local_theta,
        )
    if spec.kind == "relative_bias":
        return RelativeBias(
            num_buckets=spec.num_buckets,
            max_distance=spec.max_distance,
            num_heads=num_heads,
            bidirectional=not causal,
            num_layers=num_layers if spec.per_layer else None,
        )
    if spec.kind == "alibi":
        return AlibiBias(num_heads=num_heads, bidirectional=not causal)
    return NoPositions()
