"""Input front-ends a stack may take instead of token embeddings: what turns another modality into the
(B, S, C) rows its first layer reads.

``encoder.embedding: {kind: audio, num_mel_bins: 80, max_positions: 1500}`` is Whisper's (Radford et al.
2022, section 2.2; transformers' ``WhisperEncoder``): log-mel frames (B, num_mel_bins, 2 * max_positions)
-> Conv1d (kernel 3) -> GELU -> Conv1d (kernel 3, stride 2) -> GELU -> (B, max_positions, C), plus a fixed
table of sinusoids (`zoo.blocks.audio`). The model's own ``embedding`` still embeds the decoder's tokens.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, PositiveInt

from zoo.spec.blocks import Spec


class AudioEmbeddingSpec(Spec):
    """Whisper's audio front-end for an encoder stack: two convolutions over log-mel frames (the second with
    stride 2, each followed by GELU) and a fixed sinusoid table (Whisper's ``sinusoids``: all sines, then
    all cosines, rates exp(-k ln 10000 / (C/2 - 1))). The table is stored with the weights, frozen, as
    transformers stores it (``embed_positions``, ``requires_grad=False``)."""

    kind: Literal["audio"] = "audio"
    num_mel_bins: PositiveInt = Field(
        80, description="Mel channels of input_features (80; 128 from large-v3)."
    )
    max_positions: PositiveInt = Field(
        1500,
        description="Encoder positions after the stride-2 convolution (max_source_positions): input_features "
        "hold exactly twice as many frames (3000 = 30 s of 10 ms frames).",
    )

    @property
    def frames(self) -> int:
        """Frames of input_features the encoder takes: 2 * max_positions (the second convolution halves them)."""
        return 2 * self.max_positions


InputSpec = AudioEmbeddingSpec
"""What a stack's ``embedding`` may be (a union tagged by ``kind`` once there is more than one front-end)."""
