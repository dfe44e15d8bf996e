"""Sub-specs for the shared blocks: attention, feed-forward, norm, positions, embeddings.

Each block module in `zoo.blocks` is built from exactly one of these. They hold only what the block
itself needs; context the parent owns (``d_model``, whether the stack is causal) is passed to the block
as keyword arguments, never stored here twice.

This module imports no torch: specs, presets and the JSON Schema load in a bare environment.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, PositiveFloat, PositiveInt

Probability = Annotated[float, Field(ge=0.0, lt=1.0)]

Activation = Literal["relu", "gelu", "gelu_tanh", "silu"]
"""FFN nonlinearities. ``gelu_tanh`` is GPT-2's ``gelu_new``; ``silu`` is also called swish."""


class Spec(BaseModel):
    """Base for every spec: unknown fields are errors, instances are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class AttentionSpec(Spec):
    """Multi-head attention (MHA), grouped-query (GQA, ``num_kv_heads < num_heads``) or multi-query (1)."""

    num_heads: PositiveInt = 8
    num_kv_heads: PositiveInt | None = Field(
        None, description="Key/value heads for grouped-query attention; default: num_heads (plain MHA)."
    )
    head_dim: PositiveInt | None = Field(
        None, description="Width of one head; default d_model // num_heads. T5 sets it freely (d_kv)."
    )
    bias: bool = Field(True, description="Biases on the q/k/v and output projections.")
    scaled: bool = Field(True, description="Divide logits by sqrt(head_dim). T5 folds this into its init.")
    qk_norm: bool = Field(False, description="RMS-normalise queries and keys per head before the product.")
    dropout: Probability = Field(0.0, description="Dropout on the attention weights (training only).")

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_heads

    def resolved_head_dim(self, d_model: int) -> int:
        return self.head_dim or d_model // self.num_heads


class FFNSpec(Spec):
    """Position-wise feed-forward: ``down(act(up(x)))``, or gated ``down(act(gate(x)) * up(x))``."""

    d_ff: PositiveInt = 2048
    activation: Activation = "relu"
    gated: bool = Field(False, description="Gated linear unit: silu -> SwiGLU, gelu/gelu_tanh -> GeGLU.")
    bias: bool = True
    dropout: Probability = Field(0.0, description="Dropout after the activation (BART's activation_dropout).")


class NormSpec(Spec):
    """Normalisation kind and where it sits around each residual sub-layer."""

    kind: Literal["layernorm", "rmsnorm"] = "layernorm"
    eps: PositiveFloat = 1e-5
    bias: bool = Field(True, description="LayerNorm has a bias; ignored by RMSNorm, which never has one.")
    placement: Literal["pre", "post"] = Field(
        "post",
        description="post: x = norm(x + f(x)) as in the paper; pre: x = x + f(norm(x)) as in GPT-2/T5.",
    )
    final: bool | None = Field(None, description="A norm after the last layer; default: yes for pre-norm.")

    @property
    def has_final(self) -> bool:
        return self.placement == "pre" if self.final is None else self.final


class SinusoidalPositions(Spec):
    """Fixed sin/cos table added to the embeddings (Vaswani et al. 2017, section 3.5)."""

    kind: Literal["sinusoidal"] = "sinusoidal"
    layout: Literal["interleaved", "half"] = Field(
        "interleaved",
        description="interleaved: PE[2i]=sin, PE[2i+1]=cos as in the paper; half: all sines then all cosines (Marian).",
    )


class LearnedPositions(Spec):
    """A trained position table added to the embeddings (BERT, GPT-2, BART)."""

    kind: Literal["learned"] = "learned"
    offset: NonNegativeInt = Field(0, description="Rows reserved before position 0 (BART and RoBERTa use 2).")


class RotaryPositions(Spec):
    """Rotary embeddings applied to queries and keys (Su et al. 2021), rotate-half layout as in Llama."""

    kind: Literal["rotary"] = "rotary"
    theta: PositiveFloat = 10000.0


class RelativeBiasPositions(Spec):
    """T5's bucketed relative position bias, one table per stack, added to every layer's logits.

    Bidirectional in an encoder, unidirectional in a causal decoder: that follows from the stack.
    """

    kind: Literal["relative_bias"] = "relative_bias"
    num_buckets: PositiveInt = 32
    max_distance: PositiveInt = 128


class AlibiPositions(Spec):
    """Attention with linear biases (Press et al. 2022): a per-head linear penalty on distance."""

    kind: Literal["alibi"] = "alibi"


class NoPositions(Spec):
    """No position information at all (a bag-of-tokens ablation)."""

    kind: Literal["none"] = "none"


PositionSpec = Annotated[
    SinusoidalPositions
    | LearnedPositions
    | RotaryPositions
    | RelativeBiasPositions
    | AlibiPositions
    | NoPositions,
    Field(discriminator="kind"),
]
ABSOLUTE_POSITION_KINDS = ("sinusoidal", "learned")


class EmbeddingSpec(Spec):
    """Token embeddings and what happens to them before the first layer."""

    scale: bool = Field(False, description="Multiply token embeddings by sqrt(d_model), as in the paper.")
    segment_vocab_size: NonNegativeInt = Field(0, description="Token-type (segment) embeddings; 0 = none.")
    norm: bool = Field(False, description="A norm over the summed embeddings (BERT, BART).")
    factorized_dim: PositiveInt | None = Field(
        None, description="ALBERT: embeddings of this width, projected up to d_model before the first layer."
    )
