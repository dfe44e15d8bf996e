"""Dual encoders (CLIP, Radford et al. 2021; SigLIP, Zhai et al. 2023): an image tower and a text tower
whose pooled, projected and normalised vectors are scored against each other.

    pixel_values (B_i, 3, H, W) ──vision: an EncoderModel over patches──> (B_i, P, C_v)
        ──image_pool (class token | MAP head)──> (B_i, C_v) ──visual_projection──> image_embeds (B_i, E)
    input_ids (B_t, T) ──embed──> text stack (causal in CLIP) ──> (B_t, T, C_t)
        ──pool (eos | max id | last)──> [text_head] ──text_projection──> text_embeds (B_t, E)
    logits_per_text = norm(text_embeds) @ norm(image_embeds).T * exp(logit_scale) [+ logit_bias]

CLIP's ``post_layernorm`` is the vision stack's final norm here: transformers applies it to the pooled class
token only, zoo to every position (the same pooled vector; the vision tower's other positions differ).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from zoo.losses.image_text import contrastive_image_text_loss, sigmoid_image_text_loss
from zoo.models.base import ZooModel, build_embedding, build_stack
from zoo.models.dual_heads import AttentionPoolingHead, pool_text
from zoo.models.encoder import EncoderModel
from zoo.models.inputs import check_devices, check_tokens, model_device
from zoo.models.outputs import DualEncoderOutput
from zoo.spec import DualEncoderSpec


class DualEncoderModel(ZooModel):
    spec: DualEncoderSpec

    def __init__(self, spec: DualEncoderSpec) -> None:
        super().__init__()
        self.spec = spec
        heads, vision = spec.heads, spec.vision
        self.embed = build_embedding(spec)
        self.text = build_stack(spec, "text")
        self.text_head = nn.Linear(spec.d_model, spec.text_dim) if heads.text_head_dim is not None else None
        self.vision = EncoderModel(vision)
        pooling = heads.image_pooling
        self.image_pool = (
            AttentionPoolingHead(
                pooling,
                d_model=vision.d_model,
                num_heads=vision.attention.num_heads,
                d_ff=getattr(vision.ffn, "d_ff", 4 * vision.d_model),
                activation=getattr(vision.ffn, "activation", "gelu"),
                norm=vision.norm,
            )
            if pooling.kind == "attention"
            else None
        )
        projection = heads.projection
        self.visual_projection = (
            nn.Linear(vision.d_model, projection.dim, bias=projection.bias)
            if projection is not None
            else None
        )
        self.text_projection = (
            nn.Linear(spec.text_dim, projection.dim, bias=projection.bias) if projection is not None else None
        )
        self.logit_scale = nn.Parameter(torch.tensor(heads.logit_scale_init))  # () log temperature
        bias = heads.logit_bias_init
        self.logit_bias = nn.Parameter(torch.tensor(bias)) if bias is not None else None  # ()

    def get_image_features(
        self, pixel_values: torch.Tensor, interpolate_pos_encoding: bool = False
    ) -> torch.Tensor:
        """pixel_values (B, channels, H, W) -> (B, E): pooled and projected, not normalised (as transformers
        4.x's ``get_image_features``). H = W = ``vision.embedding.image_size``, or with
        ``interpolate_pos_encoding`` any multiples of the patch size (the position table resized, as
        transformers resizes it)."""
        hidden = self.vision(
            pixel_values=pixel_values, interpolate_pos_encoding=interpolate_pos_encoding
        ).last_hidden_state  # (B, P, C_v)
        pooled = self.image_pool(hidden) if self.image_pool is not None else hidden[:, 0]  # (B, C_v)
        return self.visual_projection(pooled) if self.visual_projection is not None else pooled

    def get_text_features(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """input_ids (B, T), attention_mask (B, T) 1 = token -> (B, E): pooled, projected, not normalised.

        Positions are 0 .. T - 1 whatever the padding (transformers' CLIP and SigLIP count so): pad on the
        right."""
        self._check_text(input_ids, attention_mask)
        T = input_ids.shape[1]
        if position_ids is None:
            position_ids = torch.arange(T, device=input_ids.device)[None]  # (1, T)
        hidden = self.text(
            self.embed(input_ids), attention_mask=attention_mask, position_ids=position_ids
        ).hidden  # (B, T, C_t)
        pooled = pool_text(
            hidden, input_ids, self.spec.heads.text_pooling, eos_token_id=self.spec.eos_token_id
        )
        if self.text_head is not None:
            pooled = self.text_head(pooled)  # (B, C_t')
        return self.text_projection(pooled) if self.text_projection is not None else pooled

    def forward(
        self,
        input_ids: torch.Tensor,
        pixel_values: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        return_loss: bool = False,
        interpolate_pos_encoding: bool = False,
    ) -> DualEncoderOutput:
        """input_ids (N_t, T), pixel_values (N_i, channels, H, W), attention_mask (N_t, T) -> the scores of
        every text against every image (`DualEncoderOutput`); with ``return_loss``, text i and image i are
        the matching pairs (N_t == N_i) and ``loss`` the spec's (contrastive or sigmoid)."""
        image = self.get_image_features(pixel_values, interpolate_pos_encoding)
        image_embeds = F.normalize(image, dim=-1)  # (N_i, E)
        text_embeds = F.normalize(self.get_text_features(input_ids, attention_mask, position_ids), dim=-1)
        logits_per_text = text_embeds @ image_embeds.t() * self.logit_scale.exp()  # (N_t, N_i)
        if self.logit_bias is not None:
            logits_per_text = logits_per_text + self.logit_bias
        loss = None
        if return_loss:
            if logits_per_text.shape[0] != logits_per_text.shape[1]:
                raise ValueError(
                    f"DualEncoderModel.forward: return_loss needs as many texts as images (pair i = text i, "
                    f"image i); got {logits_per_text.shape[0]} texts and {logits_per_text.shape[1]} images"
                )
            losses = {"contrastive": contrastive_image_text_loss, "sigmoid": sigmoid_image_text_loss}
            loss = losses[self.spec.heads.loss](logits_per_text)
        return DualEncoderOutput(
            loss=loss,
            logits_per_image=logits_per_text.t(),
            logits_per_text=logits_per_text,
            text_embeds=text_embeds,
            image_embeds=image_embeds,
        )

    def _check_text(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> None:
        where, spec = "DualEncoderModel", self.spec
        check_devices(where, model_device(self), input_ids=input_ids, attention_mask=attention_mask)
        check_tokens(
            input_ids,
            attention_mask,
            where=where,
            vocab_size=spec.vocab_size,
            max_positions=spec.max_positions,
        )
