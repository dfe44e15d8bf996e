"""Token embeddings: the lookup table, the optional sqrt(d_model) scale and segment (token-type) rows.

Vaswani et al. 2017, 3.4: "we multiply those weights by sqrt(d_model)" when the table is shared with the
output projection. Positions, the embedding norm and ALBERT's up-projection belong to each stack
(`zoo.stacks.Stack`), because BART and T5 give the encoder and decoder their own.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from zoo.spec import EmbeddingSpec


class TokenEmbedding(nn.Module):
    """input_ids (B, T) [+ token_type_ids (B, T)] -> (B, T, E), E = `EmbeddingSpec.token_dim`."""

    def __init__(self, spec: EmbeddingSpec, *, vocab_size: int, d_model: int) -> None:
        super().__init__()
        dim = spec.token_dim(d_model)
        self.tokens = nn.Embedding(vocab_size, dim)
        self.segments = nn.Embedding(spec.segment_vocab_size, dim) if spec.segment_vocab_size else None
        self.scale = math.sqrt(d_model) if spec.scale else 1.0

    @property
    def weight(self) -> torch.Tensor:
        """The token table, (V, E): what a tied output head reuses."""
        return self.tokens.weight

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        x = self.tokens(input_ids)
        if self.scale != 1.0:
            x = x * self.scale
        if self.segments is not None:
            x = x + self.segments(
                token_type_ids if token_type_ids is not None else torch.zeros_like(input_ids)
            )
        return x
