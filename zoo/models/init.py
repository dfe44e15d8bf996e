"""Parameter initialisation, driven by `InitSpec` and the module kinds, never by a model's name.

normal   N(0, std) matrices and embeddings, zero biases, unit norm weights (BERT, GPT-2, BART);
         ``scaled_residual`` shrinks the projections that write into the residual stream by
         1/sqrt(2 * num_layers) (GPT-2, section 2.3).
xavier   Glorot-uniform matrices, N(0, d_model**-0.5) embeddings: the Annotated Transformer and
         tensor2tensor, which pair well with embeddings scaled by sqrt(d_model).
t5       Mesh-TensorFlow's fan-in scaled normals; queries get an extra head_dim**-0.5 because T5
         does not scale its attention logits.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from zoo.blocks import Attention, FeedForward, MoEFeedForward, PatchEmbedding, RMSNorm
from zoo.blocks.position import LearnedPositions, RelativeBias
from zoo.models.heads import LMHead, MLMHead
from zoo.spec import InitSpec


@torch.no_grad()
def initialize(model: nn.Module, spec: InitSpec, *, d_model: int, num_layers: int) -> None:
    """Initialise every parameter of ``model`` in place."""
    residual_std = spec.std / math.sqrt(2 * num_layers) if spec.scaled_residual else None
    for module in model.modules():
        if isinstance(module, nn.Linear):
            _init_matrix(module.weight, spec, std=spec.std)
            if module.bias is not None:
                module.bias.zero_()
        elif isinstance(module, nn.Conv1d):  # an audio front-end's convolutions (`zoo.blocks.audio`)
            module.weight.normal_(0.0, spec.std)
            if module.bias is not None:
                module.bias.zero_()
        elif isinstance(module, nn.Embedding):
            std = {"normal": spec.std, "xavier": d_model**-0.5, "t5": 1.0}[spec.scheme]
            module.weight.normal_(0.0, std)
        elif isinstance(module, nn.LayerNorm | RMSNorm) and module.weight is not None:  # weightless q/k norms
            identity = 0.0 if getattr(module, "unit_offset", False) else 1.0  # Gemma's norms scale by 1 + w
            module.weight.fill_(identity)
            if isinstance(module, nn.LayerNorm) and module.bias is not None:  # RMSNorm has no bias
                module.bias.zero_()
        elif isinstance(module, LearnedPositions | RelativeBias):
            module.weight.normal_(0.0, spec.std if spec.scheme != "t5" else d_model**-0.5)
        elif isinstance(module, LMHead | MLMHead) and module.weight is not None:
            module.weight.normal_(0.0, spec.std if spec.scheme != "t5" else module.weight.shape[1] ** -0.5)
    for module in model.modules():  # second pass: each block's own changes on top of the defaults
        if isinstance(module, Attention):
            module.init_weights(residual_std=residual_std, fold_scale_into_query=spec.scheme == "t5")
        elif isinstance(module, FeedForward):
            module.init_weights(residual_std=residual_std)
        elif isinstance(module, PatchEmbedding):  # a convolution and raw tables
            module.init_weights(std=spec.std if spec.scheme == "normal" else d_model**-0.5)
        elif isinstance(module, MoEFeedForward):  # stacked expert weights are not nn.Linear
            module.init_weights(
                std=spec.std if spec.scheme == "normal" else d_model**-0.5, residual_std=residual_std
            )


def _init_matrix(weight: torch.Tensor, spec: InitSpec, *, std: float) -> None:
    if spec.scheme == "xavier":
        nn.init.xavier_uniform_(weight)
    elif spec.scheme == "t5":
        weight.normal_(0.0, weight.shape[1] ** -0.5)  # fan-in
    else:
        weight.normal_(0.0, std)
