"""Whisper's audio front-end (Radford et al. 2022, section 2.2; transformers' ``WhisperEncoder``).

Shapes: B batch, M mel bins, F frames (2 * P), P encoder positions, C model width.

    input_features (B, M, F) ─> conv1 (k 3, pad 1) ─> GELU ─> conv2 (k 3, stride 2, pad 1) ─> GELU
        ─> (B, C, P) ─> transpose ─> (B, P, C) ─> + positions (P, C) ─> the encoder stack

The position table is Whisper's ``sinusoids`` (`zoo.blocks.position.sinusoidal_table` with ``layout="half"``,
``frequencies="fairseq"``), held as a frozen parameter: transformers stores it with the weights
(``embed_positions.weight``, ``requires_grad=False``), so a checkpoint's table is used as stored and the
parameter counts agree. The stack after it adds no positions of its own (``encoder.position: none``).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from zoo.blocks.position import sinusoidal_table
from zoo.spec import AudioEmbeddingSpec


class AudioEmbedding(nn.Module):
    """input_features (B, num_mel_bins, 2 * max_positions) -> (B, max_positions, C)."""

    def __init__(self, spec: AudioEmbeddingSpec, *, d_model: int) -> None:
        super().__init__()
        self.num_mel_bins, self.frames = spec.num_mel_bins, spec.frames
        self.conv1 = nn.Conv1d(spec.num_mel_bins, d_model, kernel_size=3, padding=1)
        self.conv2 = nn.Conv1d(d_model, d_model, kernel_size=3, stride=2, padding=1)
        self.positions = nn.Parameter(torch.empty(spec.max_positions, d_model), requires_grad=False)  # (P, C)
        if not self.positions.is_meta:  # a meta build (sizes, before a load) has no values to compute
            with torch.no_grad():
                table = sinusoidal_table(spec.max_positions, d_model, layout="half", frequencies="fairseq")
                self.positions.copy_(table)

    def forward(self, input_features: torch.Tensor) -> torch.Tensor:
        x = input_features.to(self.conv1.weight.dtype)
        x = F.gelu(self.conv1(x))  # (B, C, F)
        x = F.gelu(self.conv2(x))  # (B, C, P)
        return x.transpose(1, 2) + self.positions.to(x.dtype)  # (B, P, C)
