"""Stack specs: a pile of identical layers, and the per-stack overrides of the model-level blocks.

A model spec says ``attention``, ``ffn``, ``norm`` and ``position`` once at the top; a stack (``encoder``
or ``decoder``) may override any of them. `StackSpec` holds the overrides as written, `ResolvedStack` the
values the builder uses, every field filled.
"""

from __future__ import annotations

from pydantic import Field, PositiveInt

from zoo.spec.blocks import AttentionSpec, FFNSpec, NormSpec, PositionSpec, Spec


class StackSpec(Spec):
    """Overrides for one stack; every unset field falls back to the model-level value."""

    num_layers: PositiveInt | None = None
    attention: AttentionSpec | None = None
    ffn: FFNSpec | None = None
    norm: NormSpec | None = None
    position: PositionSpec | None = None
    cross_attention: AttentionSpec | None = Field(
        None,
        description="Decoder of an encoder-decoder only: cross-attention; default: same as self-attention.",
    )
    share_layers: bool = Field(
        False, description="ALBERT: one layer's weights reused num_layers times (cross-layer sharing)."
    )


class ResolvedStack(Spec):
    """A stack with every field filled: what `zoo.stacks.Stack` is built from."""

    name: str
    num_layers: PositiveInt
    attention: AttentionSpec
    ffn: FFNSpec
    norm: NormSpec
    position: PositionSpec
    cross_attention: AttentionSpec | None
    share_layers: bool
    causal: bool
    sources: dict[str, str] = Field(
        default_factory=dict, description="Where each block spec came from, as a dotted path, for messages."
    )
