"""A stack: positions + embedding norm + N layers (+ a final norm), built from a `ResolvedStack`.

    embeddings (B, T, E) ──(+ absolute positions)──> embed_norm ──> dropout ──> embed_proj (E -> C)
        ──> layer 0 ──> ... ──> layer N-1 ──> final_norm ──> (B, T, C)

The stack owns everything computed once per forward and shared by its layers: the self-attention masks
(one per distinct attention pattern, `zoo.blocks.layer_masks`), the cross-attention mask, rotary angles or
the relative/ALiBi bias (umT5's per-layer tables: each layer's, as it runs). With ``share_layers`` (ALBERT)
one layer's weights run ``num_layers`` times. With ``position.local_theta`` (Gemma 3, ModernBERT) the
sliding-window layers rotate by their own tables; the layers of ``position.nope_layers`` (SmolLM3) rotate
nothing.
Causality is a property of the stack, not of its layers.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn

from zoo.blocks import Attention, RouterOutput, build_norm, build_positions, layer_ffn
from zoo.blocks.dropout import Dropout
from zoo.blocks.layer_masks import (
    LayerMask,
    StackPatterns,
    cross_attention_mask,
    self_attention_masks,
    with_position_bias,
)
from zoo.blocks.position import build_position_bias
from zoo.layers import Layer
from zoo.spec import AttentionSpec, InputEmbeddingSpec, ResolvedStack

Rotary = tuple[torch.Tensor, torch.Tensor]  # (cos, sin), each (B, 1, T, R): R rotating dims per head


class StackCache(Protocol):
    """What a stack needs from a KV cache (see `zoo.generation.cache`); it only reads ``length`` and
    ``layers`` (read-only properties, so a cache may hold them as a plain int and list)."""

    @property
    def length(self) -> int:
        """Keys already cached, before this forward."""
        ...

    @property
    def layers(self) -> Sequence[Any]:
        """Per layer: .self_attn and .cross_attn slots (`zoo.blocks.attention.KVSlot`)."""
        ...

    def advance(self, steps: int) -> None: ...

    def key_positions(self, new: int) -> torch.Tensor | None:
        """Where the keys attention sees this forward sit, in the order it sees them ((Tk,), -1 = an empty
        slot), for ``new`` new tokens; None when they are simply 0 .. length + new - 1 (a full cache)."""
        ...


@dataclass
class StackOutput:
    hidden: torch.Tensor  # (B, T, C)
    attentions: tuple[torch.Tensor, ...] | None = None  # per layer (B, H, T, T)
    cross_attentions: tuple[torch.Tensor, ...] | None = None  # per layer (B, H, T, S)
    routers: tuple[RouterOutput, ...] = ()  # per Mixture-of-Experts layer, in order


def plain_sdpa(spec: AttentionSpec) -> bool:
    """Whether attention of this spec runs as plain SDPA: no soft-capped logits, no sinks."""
    return spec.softcap is None and not spec.sinks


def position_ids_from_mask(
    attention_mask: torch.Tensor | None, *, offset: int, length: int, device: Any
) -> torch.Tensor:
    """Positions of the last ``length`` tokens: counted over real tokens only, so left padding is skipped.

    attention_mask (B, offset + length) -> (B, length); without a mask, ``offset .. offset + length - 1``.
    """
    if attention_mask is None:
        return torch.arange(offset, offset + length, device=device)[None]
    positions = attention_mask.long().cumsum(dim=-1) - 1
    return positions.clamp(min=0)[:, -length:]


def position_ids_from_documents(document_ids: torch.Tensor) -> torch.Tensor:
    """(B, T) document ids of packed rows -> (B, T) positions that restart at 0 where each document starts,
    so every document sits where it would alone."""
    T = document_ids.shape[1]
    index = torch.arange(T, device=document_ids.device).expand_as(document_ids)  # (B, T)
    starts = torch.ones_like(document_ids, dtype=torch.bool)
    starts[:, 1:] = document_ids[:, 1:] != document_ids[:, :-1]
    first = torch.where(starts, index, torch.zeros_like(index)).cummax(dim=1).values  # (B, T)
    return index - first


# Set while a model is built only to be sized (`zoo.models.sizes`): see `sizing_build`.
_SIZING: ContextVar[bool] = ContextVar("zoo_stack_sizing", default=False)


@contextmanager
def sizing_build() -> Iterator[None]:
    """Within it, a stack builds each distinct layer once and puts that one object at every place it holds
    (`build_layers`): a 10,000-layer spec is built in milliseconds, for `zoo.models.sizes` to count each
    place. Such a model shares weights between its layers: it is for counting, never for running."""
    token = _SIZING.set(True)
    try:
        yield
    finally:
        _SIZING.reset(token)


def build_layers(spec: ResolvedStack, *, d_model: int, dropout: float) -> list[Layer]:
    """The layers a stack stores: ``num_layers`` of them, or ALBERT's one shared layer (``share_layers``).

    Layers differ only by the arguments below that depend on ``i``; under `sizing_build`, layers built from
    the same arguments are one object."""
    sizing = _SIZING.get()
    built: dict[tuple[str, bool], Layer] = {}
    layers = []
    for i in range(1 if spec.share_layers else spec.num_layers):
        ffn, attention_norm = layer_ffn(spec.ffn, i), i > 0 or spec.norm.first_attention_norm
        key = (ffn.model_dump_json(), attention_norm)  # every argument that varies from layer to layer
        if not sizing or key not in built:
            built[key] = Layer(
                attention=spec.attention,
                ffn=ffn,
                norm=spec.norm,
                cross_attention=spec.cross_attention,
                d_model=d_model,
                dropout=dropout,
                attention_norm=attention_norm,
            )
        layers.append(built[key])
    return layers


class Stack(nn.Module):
    def __init__(
        self,
        spec: ResolvedStack,
        *,
        embedding: InputEmbeddingSpec,
        d_model: int,
        max_positions: int,
        dropout: float,
    ) -> None:
        super().__init__()
        self.causal = spec.causal
        self.patterns = StackPatterns.of([spec.layer_pattern(i) for i in range(spec.num_layers)])
        self.attention_dropout = spec.attention.dropout > 0
        self.cross_attention_dropout = spec.cross_attention is not None and spec.cross_attention.dropout > 0
        self.attention_sinks = spec.attention.sinks  # flex on a CPU returns no log-sum-exp: dense there
        self.num_layers = spec.num_layers
        embed_dim = embedding.stack_dim(d_model)
        self.positions = build_positions(
            spec.position,
            max_positions=max_positions,
            dim=embed_dim,
            head_dim=spec.attention.rotary_head_dim(d_model),
            num_heads=spec.attention.num_heads,
            causal=spec.causal,
            num_layers=spec.num_layers,
        )
        # A relative bias beside absolute positions (MPNet), or None
        self.position_bias = build_position_bias(
            spec.position, num_heads=spec.attention.num_heads, causal=spec.causal
        )
        # umT5: every layer its own relative bias table, else one bias for all layers
        self.bias_per_layer = bool(getattr(self.positions, "per_layer", False))
        self.embed_norm = build_norm(spec.norm, dim=embed_dim) if embedding.norm else None
        self.dropout = Dropout(dropout)
        self.embed_proj = nn.Linear(embed_dim, d_model) if embedding.factorized_dim else None
        self.layers = nn.ModuleList(build_layers(spec, d_model=d_model, dropout=dropout))
        # Packed rows may attend per document (`zoo.blocks.segments`): SDPA without soft-capping or sinks
        cross = spec.cross_attention
        self.segmentable = plain_sdpa(spec.attention) and all(
            type(layer.self_attn) is Attention for layer in self.layers
        )
        self.cross_segmentable = cross is not None and plain_sdpa(cross)
        # Per layer application: rotate by the local tables (a sliding layer with position.local_theta), or
        # not at all (position.nope_layers)
        local = getattr(spec.position, "local_theta", None) is not None
        self.local_rotary = tuple(local and p.kind == "sliding_window" for p in self.patterns.all)
        nope = set(getattr(spec.position, "nope_layers", ()))
        self.unrotated = tuple(i in nope for i in range(spec.num_layers))
        tuning = getattr(spec.attention, "temperature_tuning", None)
        self.temperature_tuning = None if tuning is None else tuning.count
        self.final_norm = build_norm(spec.norm, dim=d_model) if spec.norm.has_final else None

    def forward(
        self,
        x: torch.Tensor,
        *,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        memory: torch.Tensor | None = None,
        memory_mask: torch.Tensor | None = None,
        cache: StackCache | None = None,
        output_attentions: bool = False,
        prefix_lengths: torch.Tensor | None = None,
        document_ids: torch.Tensor | None = None,
        memory_document_ids: torch.Tensor | None = None,
    ) -> StackOutput:
        """x: token embeddings (B, T, E). attention_mask: (B, cached + T) 1 = token, 0 = padding, or a
        (B, T, cached + T) bool mask, True = may attend (ANDed with the stack's patterns; positions then
        count 0 .. T - 1 after the cache unless ``position_ids`` are given).
        memory / memory_mask: the encoder output (B, S, C) and its padding mask (B, S), for cross-attention.
        prefix_lengths: (B,) real tokens of each row's prefix, for prefix_lm layers.
        document_ids: (B, T) the document of each token of packed rows (no cache): attention stays inside
        each document, and positions restart at each document's start unless ``position_ids`` are given.
        memory_document_ids: (B, S) with ``document_ids``, packed (source, target) pairs: a pair id per
        source token; each token's cross-attention reads only the source of its own pair."""
        T, offset = x.shape[1], cache.length if cache is not None else 0
        padding = attention_mask if attention_mask is None or attention_mask.dim() == 2 else None
        if position_ids is None and document_ids is not None:
            position_ids = position_ids_from_documents(document_ids)
        elif position_ids is None:
            position_ids = position_ids_from_mask(padding, offset=offset, length=T, device=x.device)
        x = self._embed(x, position_ids)  # (B, T, C)
        self_masks = self._self_masks(
            x,
            attention_mask=attention_mask,
            offset=offset,
            cache=cache,
            prefix_lengths=prefix_lengths,
            document_ids=document_ids,
            output_attentions=output_attentions,
        )
        rotary, rotary_local = self._rotary(position_ids, dtype=x.dtype)
        cross_mask = None
        if memory is not None:
            cross_mask = cross_attention_mask(
                memory_mask,
                document_ids=document_ids,
                memory_document_ids=memory_document_ids,
                q_len=T,
                padding=padding,
                dense_only=output_attentions or (self.training and self.cross_attention_dropout),
                grad=x.requires_grad,
                segmentable=self.cross_segmentable and not output_attentions and cache is None,
                device=x.device,
            )

        # Temperature tuning scales queries by their slot in the row (cached ones counted, padding too, as
        # transformers counts) or by their position; in a packed row by their position in their document
        slots = None
        if self.temperature_tuning == "slot" and document_ids is None:
            slots = torch.arange(offset, offset + T, device=x.device)  # (T,)
        elif self.temperature_tuning is not None:
            slots = position_ids  # (B, T)
        self_weights, cross_weights, routers = [], [], []
        for i in range(self.num_layers):
            layer = self.layers[i % len(self.layers)]
            self_mask = self_masks[i]
            if self.bias_per_layer:  # umT5: this layer's own table, folded as it runs (one held at a time)
                bias = self.positions(T, offset + T, layer=i)
                self_mask = with_position_bias([self_mask], bias, q_len=T, k_len=offset + T, dtype=x.dtype)[0]
            out = layer(
                x,
                self_mask=self_mask[0],
                is_causal=self_mask[1],
                rotary=None if self.unrotated[i] else rotary_local if self.local_rotary[i] else rotary,
                memory=memory,
                cross_mask=cross_mask,
                cache=cache.layers[i] if cache is not None else None,
                output_attentions=output_attentions,
                slots=slots,
            )
            x = out.hidden
            self_weights.append(out.self_weights)
            cross_weights.append(out.cross_weights)
            if out.router is not None:
                routers.append(out.router)
        if cache is not None:
            cache.advance(T)
        if self.final_norm is not None:
            x = self.final_norm(x)
        if not output_attentions:
            return StackOutput(x, routers=tuple(routers))
        return StackOutput(
            x, tuple(self_weights), tuple(cross_weights) if memory is not None else None, tuple(routers)
        )

    def _embed(self, x: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        """Token embeddings (B, T, E) -> the first layer's input (B, T, C): absolute positions added, then
        the embedding norm, dropout and ALBERT's E -> C projection, where the spec has them."""
        if self.positions.role == "absolute":
            x = x + self.positions(position_ids).to(x.dtype)
        if self.embed_norm is not None:
            x = self.embed_norm(x)
        x = self.dropout(x)
        return self.embed_proj(x) if self.embed_proj is not None else x

    def _self_masks(
        self,
        x: torch.Tensor,
        *,
        attention_mask: torch.Tensor | None,
        offset: int,
        cache: StackCache | None,
        prefix_lengths: torch.Tensor | None,
        document_ids: torch.Tensor | None,
        output_attentions: bool,
    ) -> list[LayerMask]:
        """Per layer application, its self-attention (mask, is_causal): one mask per distinct pattern
        (`zoo.blocks.layer_masks`), with the position bias (relative, ALiBi, MPNet's) folded in once when one
        bias serves every layer (umT5's per-layer tables are folded as each layer runs)."""
        T, role = x.shape[1], self.positions.role
        biased = role == "bias" or self.position_bias is not None
        self_masks = self_attention_masks(
            self.patterns,
            causal=self.causal,
            attention_mask=attention_mask,
            q_len=T,
            offset=offset,
            key_positions=cache.key_positions(T) if cache is not None else None,
            prefix_lengths=prefix_lengths,
            document_ids=document_ids,
            dense_only=output_attentions
            or biased
            or (self.training and self.attention_dropout)
            or (self.attention_sinks and x.device.type == "cpu"),
            grad=x.requires_grad,
            segmentable=self.segmentable and not output_attentions and not biased,
            device=x.device,
        )
        bias_module = self.positions if role == "bias" and not self.bias_per_layer else self.position_bias
        if bias_module is None:
            return self_masks
        bias = bias_module(T, offset + T)  # (1, H, T, offset + T)
        return with_position_bias(self_masks, bias, q_len=T, k_len=offset + T, dtype=x.dtype)

    def _rotary(
        self, position_ids: torch.Tensor, *, dtype: torch.dtype
    ) -> tuple[Rotary | None, Rotary | None]:
        """(cos, sin) for the rotary layers and for the sliding-window layers with their own local tables,
        (None, None) without rotary positions. The tables are float32 (`zoo.blocks.position`), cast once here
        rather than per layer."""
        if self.positions.role != "rotary":
            return None, None
        cos, sin = self.positions(position_ids)
        rotary = cos.to(dtype), sin.to(dtype)
        if not any(self.local_rotary):
            return rotary, None
        cos, sin = self.positions(position_ids, local=True)
        return rotary, (cos.to(dtype), sin.to(dtype))
