"""The heads of a dual encoder (CLIP, SigLIP): how each tower is pooled to one vector, the projections into
the shared space, the learned logit scale (and bias), and the loss.

    image ──vision tower──> (B, P, C_v) ──image_pooling──> (B, C_v) ──[projection]──> image_embeds (B, E)
    text  ──text tower────> (B, T, C_t) ──text_pooling───> (B, C_t) ──[text_head]──[projection]──> text_embeds
    logits_per_text = normalize(text_embeds) @ normalize(image_embeds).T * exp(logit_scale) [+ logit_bias]

Radford et al. 2021 (CLIP: the class token, the end-of-text token, bias-free projections, a softmax
contrastive loss both ways); Zhai et al. 2023 (SigLIP: a multihead-attention pooling "MAP" head on the image
side, the last token and a linear head on the text side, no projections, a pairwise sigmoid loss with a
learned bias).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, PositiveInt

from zoo.spec.blocks import Activation, Spec


class FirstTokenPooling(Spec):
    """The first position's state: the class token (CLIP's vision tower; ``embedding.class_token``)."""

    kind: Literal["first_token"] = "first_token"


class AttentionPooling(Spec):
    """SigLIP's multihead-attention pooling head ("MAP", Zhai et al. 2022): one learned probe query
    cross-attends to every patch, then a pre-norm MLP on it with a residual:

        h = attention(probe, patches);  h = h + mlp(norm(h))       -> (B, C)

    The attention, norm and MLP sizes default to the vision tower's own."""

    kind: Literal["attention"] = "attention"
    num_heads: PositiveInt | None = Field(
        None, description="Heads of the probe's attention; default: the tower's."
    )
    d_ff: PositiveInt | None = Field(
        None, description="Hidden width of the MLP; default: the tower's ffn.d_ff."
    )
    activation: Activation | None = Field(None, description="The MLP's activation; default: the tower's.")


ImagePoolingSpec = Annotated[FirstTokenPooling | AttentionPooling, Field(discriminator="kind")]


class EosTokenPooling(Spec):
    """The first position holding ``eos_token_id`` (CLIP, as transformers reads a current config)."""

    kind: Literal["eos_token"] = "eos_token"


class MaxTokenPooling(Spec):
    """The position of the row's largest token id (CLIP's original pooling: its end-of-text token is the last
    id of the vocabulary; transformers does this for a config whose eos_token_id is the old 2)."""

    kind: Literal["max_token_id"] = "max_token_id"


class LastTokenPooling(Spec):
    """The row's last position, padding or not (SigLIP pads to a fixed length and reads the last slot)."""

    kind: Literal["last_token"] = "last_token"


TextPoolingSpec = Annotated[EosTokenPooling | MaxTokenPooling | LastTokenPooling, Field(discriminator="kind")]


class ProjectionSpec(Spec):
    """A linear map of each tower's pooled vector into the shared embedding space (CLIP's
    visual_projection and text_projection)."""

    dim: PositiveInt = Field(512, description="Width of the shared space (projection_dim).")
    bias: bool = Field(False, description="A bias on both projections (CLIP has none).")


class DualEncoderHeadsSpec(Spec):
    """What turns the two towers' states into ``image_embeds``, ``text_embeds`` and the logits."""

    image_pooling: ImagePoolingSpec = Field(
        FirstTokenPooling(), description="first_token: the class token (CLIP); attention: SigLIP's MAP head."
    )
    text_pooling: TextPoolingSpec = Field(
        EosTokenPooling(),
        description="eos_token: the first eos_token_id; max_token_id: the largest id (older CLIP configs); "
        "last_token: the last position (SigLIP).",
    )
    text_head_dim: PositiveInt | None = Field(
        None,
        description="SigLIP: a linear layer (with bias) on the pooled text state, to this width; null: none.",
    )
    projection: ProjectionSpec | None = Field(
        ProjectionSpec(),
        description="Projections of both towers into a shared space (CLIP); null: none (SigLIP).",
    )
    logit_scale_init: float = Field(
        2.6592,
        description="The learned log temperature's first value (CLIP: log(1 / 0.07)); exp() scales the logits.",
    )
    logit_bias_init: float | None = Field(
        None, description="SigLIP: a learned logit bias, starting here (-10 in the paper); null: no bias."
    )
    loss: Literal["contrastive", "sigmoid"] = Field(
        "contrastive",
        description="contrastive: cross-entropy over texts and over images, averaged (CLIP); sigmoid: "
        "binary log-likelihood of every image-text pair, summed per text and averaged (SigLIP).",
    )
