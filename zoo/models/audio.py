"""An encoder-decoder whose encoder reads audio: Whisper (Radford et al. 2022) and any spec with
``encoder.embedding: {kind: audio, ...}``.

    input_features (B, M, 2P) ─> audio front-end (`zoo.blocks.audio`) ─> encoder ─> memory (B, P, C)
    decoder_input_ids (B, T) ─> embed + learned positions ─> decoder (cross-attends) ─> lm_head ─> (B, T, V)

Everything but the encoder's input is `EncoderDecoderModel`'s (decode, the LM head, the loss, generation);
this class only takes Hugging Face's input name (``input_features``) and checks it. As in transformers, the
features are exactly 2 * max_positions frames (30 s, padded with silence by the feature extractor) and the
encoder attends to all of them: there is no source attention mask.
"""

from __future__ import annotations

import torch

from zoo.models.encoder_decoder import EncoderDecoderModel
from zoo.models.outputs import ModelOutput
from zoo.spec import AudioEmbeddingSpec, EncoderDecoderSpec
from zoo.stacks import StackOutput


class AudioEncoderDecoderModel(EncoderDecoderModel):
    """`EncoderDecoderModel` over log-mel ``input_features`` (B, num_mel_bins, frames) instead of ids."""

    def __init__(self, spec: EncoderDecoderSpec) -> None:
        super().__init__(spec)
        assert isinstance(spec.encoder.embedding, AudioEmbeddingSpec)  # `zoo.models.build` dispatches on it
        self.front_end: AudioEmbeddingSpec = spec.encoder.embedding

    def check_source(self, input_features: object, attention_mask: object, *, where: str) -> tuple[int, int]:
        """(B, S) encoder rows and positions of valid ``input_features``; else one ValueError naming the
        expected shape. Generation calls it too (`zoo.generation.config.check_inputs`)."""
        front = self.front_end
        expected = f"(batch, {front.num_mel_bins}, {front.frames})"
        if (
            not isinstance(input_features, torch.Tensor)
            or input_features.dim() != 3
            or tuple(input_features.shape[1:]) != (front.num_mel_bins, front.frames)
            or input_features.shape[0] == 0
        ):
            got = tuple(input_features.shape) if isinstance(input_features, torch.Tensor) else None
            raise ValueError(
                f"{where}: input_features must be log-mel features of shape {expected} (WhisperFeatureExtractor's "
                f"output: {front.num_mel_bins} mel bins x {front.frames} frames, padded to 30 s), got "
                f"{got if got is not None else type(input_features).__name__}"
            )
        if not input_features.is_floating_point():
            raise ValueError(f"{where}: input_features must be floating point, got {input_features.dtype}")
        if attention_mask is not None:
            raise ValueError(
                f"{where}: input_features take no attention_mask: the encoder attends to all {front.frames} "
                "frames (shorter audio is padded with silence, as Whisper was trained)"
            )
        return input_features.shape[0], front.max_positions

    def _check_source(self, input_ids: object, attention_mask: object, *, where: str) -> tuple[int, int]:
        # the shared checks name the base class's methods: name this one's
        where = where.replace("EncoderDecoderModel.", "AudioEncoderDecoderModel.", 1)
        return self.check_source(input_ids, attention_mask, where=where)

    def encode(
        self,
        input_features: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        *,
        output_attentions: bool = False,
    ) -> StackOutput:
        """input_features (B, M, 2P) -> the encoder output (B, P, C); checked first."""
        return super().encode(input_features, attention_mask, output_attentions=output_attentions)

    def forward(
        self,
        input_features: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.Tensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        *,
        logits_mask: torch.Tensor | None = None,
        output_attentions: bool = False,
        document_ids: torch.Tensor | None = None,
        decoder_document_ids: torch.Tensor | None = None,
    ) -> ModelOutput:
        """input_features (B, num_mel_bins, 2 * max_positions) log-mel frames (Hugging Face's name);
        decoder_input_ids (B, T), or labels (B, T) shifted right behind the decoder start token. Returns
        logits (B, T, V) and, with labels, the loss. Every other argument is `EncoderDecoderModel.forward`'s;
        packed pairs (``document_ids``) are for token sources only."""
        if document_ids is not None or decoder_document_ids is not None:
            raise ValueError(
                "AudioEncoderDecoderModel.forward: document_ids / decoder_document_ids (packed pairs) need a "
                "token source; input_features are one clip per row"
            )
        return super().forward(
            input_features,
            attention_mask,
            decoder_input_ids,
            decoder_attention_mask,
            labels,
            logits_mask=logits_mask,
            output_attentions=output_attentions,
        )
