"""Encoder-only models (BERT, RoBERTa, ALBERT, MiniLM, DistilBERT, ELECTRA, MPNet; Devlin et al. 2019):
bidirectional self-attention over a padding mask, with an optional pooler, and a masked-LM head, a sequence-
or token-classification head (`zoo.models.heads.ClassificationHead`) or ELECTRA's replaced-token detector.

With an image front-end (``embedding.kind: patches``, ViT) the same stack reads ``pixel_values`` instead of
token ids (`zoo.blocks.patches`), under an image-classification head or none."""

from __future__ import annotations

import torch

from zoo.blocks import PatchEmbedding, TokenEmbedding
from zoo.models.base import ZooModel, aux_loss, build_front_end, build_stack
from zoo.models.encoder_heads import (
    EncoderHead,
    NoScores,
    ReplacedTokenScores,
    SequenceScores,
    TokenScores,
)
from zoo.models.heads import (
    ClassificationHead,
    ImageClassificationHead,
    MLMHead,
    Pooler,
    ReplacedTokenHead,
)
from zoo.models.inputs import (
    check_devices,
    check_logits_mask,
    check_pixels,
    check_positions,
    check_token_types,
    check_tokens,
    model_device,
)
from zoo.models.outputs import ModelOutput
from zoo.spec import EncoderSpec, PatchEmbeddingSpec
from zoo.spec.model import ImageClassifierSpec, SequenceClassifierSpec


class EncoderModel(ZooModel):
    spec: EncoderSpec

    def __init__(self, spec: EncoderSpec) -> None:
        super().__init__()
        self.spec = spec
        self.embed = build_front_end(spec)
        self.encoder = build_stack(spec, "encoder")
        heads = spec.heads
        self.pooler = Pooler(d_model=spec.d_model) if heads.pooler else None
        self.mlm_head = (
            MLMHead(
                heads.mlm,
                norm=spec.norm,
                d_model=spec.d_model,
                embed_dim=spec.embedding_dim,
                vocab_size=spec.vocab_size,
                tied_to=self.embed.tokens
                if heads.mlm.tied and isinstance(self.embed, TokenEmbedding)
                else None,
            )
            if heads.mlm
            else None
        )
        self.classifier: ClassificationHead | ImageClassificationHead | None = None
        if isinstance(heads.classifier, ImageClassifierSpec) and isinstance(
            spec.embedding, PatchEmbeddingSpec
        ):
            self.classifier = ImageClassificationHead(
                heads.classifier,
                d_model=spec.d_model,
                dropout=spec.dropout,
                class_token=spec.embedding.class_token,
            )
        elif heads.classifier is not None:
            self.classifier = ClassificationHead(
                heads.classifier, d_model=spec.d_model, dropout=spec.dropout, norm=spec.norm
            )
        self.replaced_token_head = (
            ReplacedTokenHead(heads.replaced_token, d_model=spec.d_model)
            if heads.replaced_token is not None
            else None
        )
        # The one output head the spec allows, behind the interface forward calls (not a module of its own:
        # the head modules above hold the weights, under their state-dict names).
        self.output_head = self._output_head()

    def _output_head(self) -> EncoderHead:
        classifier = self.spec.heads.classifier
        if self.mlm_head is not None:
            return TokenScores(self.mlm_head, name="MLM head", num_classes=self.spec.vocab_size)
        if self.classifier is not None and isinstance(
            classifier, SequenceClassifierSpec | ImageClassifierSpec
        ):
            return SequenceScores(self.classifier, classifier)
        if self.classifier is not None and classifier is not None:
            return TokenScores(self.classifier, name="token classifier", num_classes=classifier.num_labels)
        if self.replaced_token_head is not None:
            return ReplacedTokenScores(self.replaced_token_head)
        return NoScores()

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        *,
        pixel_values: torch.Tensor | None = None,
        interpolate_pos_encoding: bool = False,
        logits_mask: torch.Tensor | None = None,
        output_attentions: bool = False,
        position_ids: torch.Tensor | None = None,
        document_ids: torch.Tensor | None = None,
    ) -> ModelOutput:
        """input_ids (B, T); attention_mask (B, T) 1 = token, or a (B, T, T) bool mask (True = may attend,
        ANDed with the encoder's attention patterns); labels (B, T) for MLM or token
        classification (-100 = ignore), (B,) class ids for sequence classification ((B, L) floats for
        multi-label, (B,) or (B, L) floats for regression), (B, T) 0/1 for the replaced-token head (1 =
        replaced; its loss counts the real tokens of a (B, T) mask, as ELECTRA's). logits: (B, T, V) from
        the MLM head, (B, T, L) from a token classifier, (B, L) from a sequence classifier (L = num_labels),
        (B, T) from the replaced-token head (`zoo.models.encoder_heads`).

        ``logits_mask`` (B, T) bool runs a token-level head (MLM, token classifier) only where it is True
        (e.g. ``labels != -100``): logits are then (N, V) or (N, L) for those N positions and the loss counts
        only them. MLM labels ~15% of the positions, so this skips most of the vocabulary-wide projection.

        ``document_ids`` (B, T): packed rows, a document id per token: each token attends only within its
        document, and positions (``position_ids`` (B, T), default 0 .. T - 1) restart at each document's start.

        ``pixel_values`` (B, channels, H, W) floats: the input of an image front-end (``embedding.kind:
        patches``), which takes no token arguments; labels (B,) class ids, logits (B, L) from an image
        classifier. H = W = ``embedding.image_size``, or with ``interpolate_pos_encoding`` any multiples of
        patch_size (the position table resized, as Hugging Face's ViT).

        Every argument is checked first (`zoo.models.inputs`): a bad one is a ValueError, before any compute.
        """
        if isinstance(self.embed, PatchEmbedding):
            self._check_images(
                pixel_values,
                labels,
                interpolate_pos_encoding=interpolate_pos_encoding,
                tokens={
                    "input_ids": input_ids,
                    "attention_mask": attention_mask,
                    "token_type_ids": token_type_ids,
                    "logits_mask": logits_mask,
                    "position_ids": position_ids,
                    "document_ids": document_ids,
                },
            )
            assert pixel_values is not None
            x = self.embed(pixel_values, interpolate_pos_encoding=interpolate_pos_encoding)  # (B, N, C)
        else:
            if pixel_values is not None or interpolate_pos_encoding:
                given = "pixel_values" if pixel_values is not None else "interpolate_pos_encoding"
                raise ValueError(
                    f"EncoderModel.forward: {given} is for an image front-end (embedding.kind: patches); "
                    "this model reads input_ids"
                )
            self._check_inputs(
                input_ids,
                attention_mask,
                token_type_ids,
                labels,
                logits_mask=logits_mask,
                position_ids=position_ids,
                document_ids=document_ids,
            )
            assert input_ids is not None
            x = self.embed(input_ids, token_type_ids)  # (B, T, E)
        out = self.encoder(
            x,
            attention_mask=attention_mask,
            position_ids=position_ids,
            output_attentions=output_attentions,
            document_ids=document_ids,
        )
        pooled = self.pooler(out.hidden) if self.pooler is not None else None  # (B, C)
        padding = attention_mask if attention_mask is not None and attention_mask.dim() == 2 else None
        logits, loss = self.output_head(
            out.hidden, pooled=pooled, padding=padding, labels=labels, logits_mask=logits_mask
        )
        return ModelOutput(
            logits=logits,
            last_hidden_state=out.hidden,
            loss=loss,
            attentions=out.attentions,
            pooler_output=pooled,
            aux_loss=aux_loss((out, attention_mask)),
        )

    def _check_images(
        self,
        pixel_values: torch.Tensor | None,
        labels: torch.Tensor | None,
        *,
        interpolate_pos_encoding: bool,
        tokens: dict[str, torch.Tensor | None],
    ) -> None:
        """`forward`'s arguments for an image front-end: pixel_values (`check_pixels`), labels by the head,
        and none of the token arguments."""
        where, spec = "EncoderModel.forward", self.spec
        assert isinstance(spec.embedding, PatchEmbeddingSpec)
        given = [name for name, value in tokens.items() if value is not None]
        if given:
            raise ValueError(
                f"{where}: {given[0]} is for token inputs; this model reads images (embedding.kind: patches): "
                "pass pixel_values"
            )
        if pixel_values is None:
            raise ValueError(f"{where}: pixel_values (batch, channels, height, width) is required")
        check_devices(where, model_device(self), pixel_values=pixel_values, labels=labels)
        B, N = check_pixels(
            pixel_values,
            where=where,
            channels=spec.embedding.channels,
            image_size=spec.embedding.image_size,
            patch_size=spec.embedding.patch_size,
            interpolate=interpolate_pos_encoding,
        )
        T = N + int(spec.embedding.class_token)
        if self.encoder.positions.role == "absolute" and spec.max_positions < T:
            raise ValueError(
                f"{where}: pixel_values make {T} tokens, more than the model's max_positions ({spec.max_positions})"
            )
        self.output_head.check_labels(labels, where=where, shape=(B, T))

    def _check_inputs(
        self,
        input_ids: torch.Tensor | None,
        attention_mask: torch.Tensor | None,
        token_type_ids: torch.Tensor | None,
        labels: torch.Tensor | None,
        *,
        logits_mask: torch.Tensor | None,
        position_ids: torch.Tensor | None,
        document_ids: torch.Tensor | None,
    ) -> None:
        """Every argument of `forward`, before any compute (`zoo.models.inputs`); the labels by the head."""
        where, spec, head = "EncoderModel.forward", self.spec, self.output_head
        check_devices(
            where,
            model_device(self),
            input_ids=input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            labels=labels,
            position_ids=position_ids,
            document_ids=document_ids,
        )
        B, T = check_tokens(
            input_ids,
            attention_mask,
            where=where,
            vocab_size=spec.vocab_size,
            max_positions=spec.max_positions,
            user_masks=True,
        )
        check_token_types(
            token_type_ids, where=where, shape=(B, T), segment_vocab_size=spec.embedding.segment_vocab_size
        )
        check_positions(
            position_ids, document_ids, where=where, shape=(B, T), max_positions=spec.max_positions
        )
        head.check_labels(labels, where=where, shape=(B, T))
        assert input_ids is not None  # check_tokens refused anything else
        check_logits_mask(logits_mask, input_ids, where=where, head=head.name, has_head=head.per_token)
