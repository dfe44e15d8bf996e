"""MXFP4 expert weights (OCP Microscaling, FP4 E2M1 with an E8M0 block scale), read by dequantising.

gpt-oss's published checkpoints store each expert projection as two tensors (transformers'
``integrations/mxfp4.py`` reads the same):

    {name}_blocks  uint8 (..., R, G, 16)   two 4-bit E2M1 codes a byte, low nibble first: 32 values a block
    {name}_scales  uint8 (..., R, G)        one E8M0 exponent a block, biased by 127

Value ``j`` of block ``g`` in row ``r`` is ``E2M1[code] * 2 ** (scale - 127)``, and a row is its G blocks in
order: ``(..., R, G * 32)``. E2M1 codes 0-7 are 0, 0.5, 1, 1.5, 2, 3, 4, 6 and 8-15 the same negated.
Every product is exact in bfloat16 and float32 (three significant bits times a power of two).
"""

from __future__ import annotations

import torch

from zoo.io.hf.common import HFError

E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
BLOCK = 32  # values a scale covers
CHUNK = 1 << 20  # blocks dequantised at a time


def dequantize_mxfp4(
    blocks: torch.Tensor, scales: torch.Tensor, *, dtype: torch.dtype, name: str = "MXFP4 tensor"
) -> torch.Tensor:
    """blocks (..., R, G, 16) uint8 and scales (..., R, G) uint8 -> (..., R, G * 32) in ``dtype``, vectorised:
    one table lookup per nibble and one ``ldexp``, over `CHUNK` blocks at a time (the int64 codes of a whole
    gpt-oss-120b layer would take gigabytes). ``name`` is for messages."""
    if blocks.dtype != torch.uint8 or scales.dtype != torch.uint8:
        raise HFError(
            f"{name}_blocks / {name}_scales are {blocks.dtype} / {scales.dtype}: MXFP4 stores both as uint8"
        )
    if blocks.dim() < 2 or blocks.shape[-1] != BLOCK // 2 or blocks.shape[:-1] != scales.shape:
        raise HFError(
            f"{name}_blocks {tuple(blocks.shape)} and {name}_scales {tuple(scales.shape)}: expected "
            f"(..., G, {BLOCK // 2}) blocks and (..., G) scales"
        )
    table = torch.tensor(E2M1, dtype=torch.float32, device=blocks.device)  # (16,)
    flat_blocks, flat_scales = blocks.reshape(-1, BLOCK // 2), scales.reshape(-1)  # (N, 16), (N,)
    out = torch.empty(flat_scales.shape[0], BLOCK, dtype=dtype, device=blocks.device)  # (N, 32)
    for start in range(0, out.shape[0], CHUNK):
        part, scale = flat_blocks[start : start + CHUNK], flat_scales[start : start + CHUNK]
        codes = torch.stack([part & 0x0F, part >> 4], dim=-1).long()  # (n, 16, 2): low nibble first
        values = table[codes].flatten(-2)  # (n, 32)
        exponent = scale.to(torch.float32).sub(127).unsqueeze(-1)  # (n, 1)
        out[start : start + CHUNK] = torch.ldexp(values, exponent)  # exact: 3 significant bits x 2**e
    return out.reshape(*scales.shape[:-1], scales.shape[-1] * BLOCK)  # (..., R, G * 32)
