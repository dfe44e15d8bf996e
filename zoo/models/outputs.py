"""What every model's forward returns.

`ModelOutput` is registered as a pytree node (`torch.export.register_dataclass`), so ``torch.export.export``,
``torch.compile`` and ``torch.utils._pytree`` see its tensors: an exported program returns a `ModelOutput`
whose unset fields stay None (the treespec records which; `zoo.export`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class ModelOutput:
    """Hugging Face names, so code written against `transformers` outputs reads the same.

    For an encoder-decoder, ``last_hidden_state`` and ``attentions`` are the decoder's; the encoder's are
    in ``encoder_last_hidden_state`` and ``encoder_attentions``.
    """

    # (B, T, V) from an LM/MLM head; (B, L) from a sequence classifier, (B, T, L) from a token classifier
    # (L = num_labels); (N, V) / (N, L) for the N positions a ``logits_mask`` selects
    logits: torch.Tensor | None = None
    last_hidden_state: torch.Tensor | None = None  # (B, T, C)
    loss: torch.Tensor | None = None  # scalar, when labels are given (mean over the scored positions/rows)
    attentions: tuple[torch.Tensor, ...] | None = None  # per layer (B, H, T, T)
    cross_attentions: tuple[torch.Tensor, ...] | None = None  # per decoder layer (B, H, T, S)
    encoder_last_hidden_state: torch.Tensor | None = None  # (B, S, C)
    encoder_attentions: tuple[torch.Tensor, ...] | None = None  # per encoder layer (B, H, S, S)
    pooler_output: torch.Tensor | None = None  # (B, C)
    # scalar: the load-balancing loss of the Mixture-of-Experts layers (`zoo.losses.load_balancing_loss`),
    # over every stack, not added to ``loss`` (the trainer adds it times ``loss.router_aux_coef``)
    aux_loss: torch.Tensor | None = None
    # (N,) float32: each scored position's loss, from a forward given ``chunked_loss`` (logits then None)
    token_losses: torch.Tensor | None = None


# The serialized name keeps a saved ``.pt2`` loadable (`torch.export.load`) wherever zoo is importable.
torch.export.register_dataclass(ModelOutput, serialized_type_name="zoo.models.outputs.ModelOutput")


@dataclass
class DualEncoderOutput:
    """A dual encoder's scores (CLIP, SigLIP), under transformers' CLIPOutput / SiglipOutput names.

    ``logits_per_text`` (N_text, N_image) and ``logits_per_image`` its transpose; ``text_embeds`` (N_text, E)
    and ``image_embeds`` (N_image, E) unit length; ``loss`` a scalar with ``return_loss=True``."""

    loss: torch.Tensor | None = None
    logits_per_image: torch.Tensor | None = None
    logits_per_text: torch.Tensor | None = None
    text_embeds: torch.Tensor | None = None
    image_embeds: torch.Tensor | None = None


torch.export.register_dataclass(
    DualEncoderOutput, serialized_type_name="zoo.models.outputs.DualEncoderOutput"
)
