"""Image patches as tokens: ViT's front-end (Dosovitskiy et al. 2021, section 3.1; Hugging Face's
``ViTEmbeddings``).

    pixel_values (B, Ch, H, W) ──conv p x p, stride p──> (B, C, h, w) ──flatten──> (B, h·w, C)
        ──[class token in front]──> (B, N, C) ──(+ learned 2-D positions)──> the stack

Legend: ``Ch`` image channels, ``p`` patch_size, ``h = H / p`` and ``w = W / p`` the patch grid, ``C``
d_model, ``N = h·w`` (+ 1 with a class token). The position table covers the training grid (image_size / p
on each side); for another grid it is resized bicubically, as Hugging Face's ``interpolate_pos_encoding``
does (the class token's row is kept as it is). Dropout, an embedding norm and the stack's own positions
come after, in the stack (`zoo.stacks.Stack`).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from zoo.spec import PatchEmbeddingSpec


class PatchEmbedding(nn.Module):
    """pixel_values (B, Ch, H, W) -> (B, N, C): one token per patch (+ the class token first)."""

    def __init__(self, spec: PatchEmbeddingSpec, *, d_model: int) -> None:
        super().__init__()
        p = spec.patch_size
        self.patch_size, self.grid = p, spec.grid
        self.proj = nn.Conv2d(spec.channels, d_model, kernel_size=p, stride=p, bias=spec.bias)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, d_model)) if spec.class_token else None
        self.positions = (
            nn.Parameter(torch.zeros(1, spec.num_tokens, d_model)) if spec.positions == "learned" else None
        )

    @torch.no_grad()
    def init_weights(self, *, std: float) -> None:
        """N(0, std) for the projection, the class token and the positions; a zero bias (Hugging Face's
        ViT draws from a truncated normal of the same std)."""
        self.proj.weight.normal_(0.0, std)
        if self.proj.bias is not None:
            self.proj.bias.zero_()
        for table in (self.cls_token, self.positions):
            if table is not None:
                table.normal_(0.0, std)

    def forward(self, pixel_values: torch.Tensor, *, interpolate_pos_encoding: bool = False) -> torch.Tensor:
        """pixel_values (B, Ch, H, W), H and W multiples of patch_size (checked by the model) -> (B, N, C).
        A size other than image_size needs ``interpolate_pos_encoding`` (the model checks that too)."""
        x = self.proj(pixel_values.to(self.proj.weight.dtype))  # (B, C, h, w)
        B, _, h, w = x.shape
        x = x.flatten(2).transpose(1, 2)  # (B, h·w, C)
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(B, -1, -1), x], dim=1)  # (B, 1 + h·w, C)
        if self.positions is not None:
            x = x + self.position_table(h, w)
        return x

    def position_table(self, h: int, w: int) -> torch.Tensor:
        """The (1, N, C) positions for an h x w patch grid: the learned table, resized when the grid differs."""
        assert self.positions is not None
        if (h, w) == (self.grid, self.grid):
            return self.positions
        first = 1 if self.cls_token is not None else 0
        cls, table = self.positions[:, :first], self.positions[:, first:]  # (1, 0|1, C), (1, g·g, C)
        C = table.shape[-1]
        table = table.reshape(1, self.grid, self.grid, C).permute(0, 3, 1, 2)  # (1, C, g, g)
        table = F.interpolate(table, size=(h, w), mode="bicubic", align_corners=False)  # (1, C, h, w)
        table = table.permute(0, 2, 3, 1).reshape(1, h * w, C)  # (1, h·w, C)
        return torch.cat([cls, table], dim=1)
