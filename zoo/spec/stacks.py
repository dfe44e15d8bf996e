"""Stack specs: a pile of identical layers, and the per-stack overrides of the model-level blocks.

A model spec says ``attention``, ``ffn``, ``norm`` and ``position`` once at the top; a stack (``encoder``
or ``decoder``) may override any of them. `StackSpec` holds the overrides as written, `ResolvedStack` the
values the builder uses, every field filled. ``pattern`` / ``layer_patterns`` say which keys self-attention
may see (`zoo.spec.patterns`); unset, a causal stack is ``causal`` and any other ``full``.
"""

from __future__ import annotations

from pydantic import Field, PositiveInt

from zoo.spec.blocks import AttentionSpec, FeedForwardSpec, NormSpec, PositionSpec, Spec
from zoo.spec.frontends import InputSpec
from zoo.spec.patterns import AttentionPattern


class StackSpec(Spec):
    """Overrides for one stack; every unset field falls back to the model-level value."""

    num_layers: PositiveInt | None = None
    attention: AttentionSpec | None = None
    ffn: FeedForwardSpec | None = None
    norm: NormSpec | None = None
    position: PositionSpec | None = None
    cross_attention: AttentionSpec | None = Field(
        None,
        description="Decoder of an encoder-decoder only: cross-attention; default: same as self-attention.",
    )
    share_layers: bool = Field(
        False, description="ALBERT: one layer's weights reused num_layers times (cross-layer sharing)."
    )
    pattern: AttentionPattern | None = Field(
        None,
        description="Which keys self-attention may see (full, causal, sliding_window, prefix_lm, "
        "block_sparse); default: causal in a causal stack, full otherwise.",
    )
    layer_patterns: list[AttentionPattern] | None = Field(
        None,
        description="One pattern per layer, overriding pattern (e.g. local and global layers alternating); "
        "as many as the stack has layers.",
    )
    embedding: InputSpec | None = Field(
        None,
        description="The encoder of an encoder-decoder only: a front-end for another modality instead of token "
        "embeddings ({kind: audio, num_mel_bins, max_positions}: Whisper's); default: tokens.",
    )


class ResolvedStack(Spec):
    """A stack with every field filled: what `zoo.stacks.Stack` is built from."""

    name: str
    num_layers: PositiveInt
    attention: AttentionSpec
    ffn: FeedForwardSpec
    norm: NormSpec
    position: PositionSpec
    cross_attention: AttentionSpec | None
    share_layers: bool
    causal: bool
    pattern: AttentionPattern
    layer_patterns: list[AttentionPattern] | None = None
    embedding: InputSpec | None = None
    sources: dict[str, str] = Field(
        default_factory=dict, description="Where each block spec came from, as a dotted path, for messages."
    )

    def layer_pattern(self, index: int) -> AttentionPattern:
        """The pattern of layer ``index`` (its own from ``layer_patterns``, else the stack's)."""
        return self.layer_patterns[index] if self.layer_patterns is not None else self.pattern

    def pattern_path(self, index: int | None = None) -> str:
        """The dotted field a layer's pattern came from, for messages: ``encoder.layer_patterns[3]``."""
        if index is not None and self.layer_patterns is not None:
            return f"{self.name}.layer_patterns[{index}]"
        return self.sources.get("pattern", f"{self.name}.pattern")
