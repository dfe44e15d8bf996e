"""A frozen base stored NF4 (QLoRA, Dettmers et al. 2023, arXiv:2305.14314), through torchao.

NF4 keeps 4 bits per weight in blocks of 64 that share one absmax scale, the scales themselves quantised
to 8 bits in blocks of up to 256 ("double quantisation"): about 0.52 bytes per weight against bfloat16's 2.
A matmul dequantises the weight to the input's dtype and gives the input its gradient, the weight none (as
torchao's ``linear_nf4``), dequantising in chunks of 2**20 codes: torchao's own dequantisation holds about
seven bytes of temporaries per weight (a 16384 x 2048 FFN matrix: ~470 MB), this one the dense matrix and a
few MB (the same values, bit for bit). Quantising is deterministic: the same dense weight
gives the same NF4 tensor, bit for bit, which is what an exact resume rebuilds.

    quantize(weight)   dense (O, I) -> torchao's NF4Tensor (same shape and dtype; 4-bit storage)
    dense(weight)      NF4 -> the dense tensor it stands for (a dense weight comes back as it is)
    linear(x, w, b)    x (N, I) -> (N, O), whichever storage ``w`` has
    Nf4Linear          a frozen projection the adapters do not wrap, stored NF4 (``weight``, ``bias``)

torchao is the ``quant`` extra; without it `quantize` raises one line saying how to install it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from zoo._extras import install_hint
from zoo.lora.errors import LoraError
from zoo.lora.fingerprint import WeightSample, weight_sample
from zoo.quant.library import TorchaoMissingError, import_torchao

BLOCK = 64  # weights per absmax scale (QLoRA's and torchao's default)
SCALER_BLOCK = 256  # scales per 8-bit scale block at most (torchao's default)
KINDS = ("nf4",)  # what ``quantize_base`` accepts


def quantize(weight: torch.Tensor, *, name: str = "weight") -> torch.Tensor:
    """``weight`` (O, I) as torchao's NF4Tensor, in blocks of 64 (the scales in blocks of the largest power
    of two up to 256 that divides their count: 256 for every real model). Refuses (LoraError, naming
    ``name``) a weight whose element count is not a multiple of 64."""
    try:
        torchao = import_torchao("torchao.quantization")
    except TorchaoMissingError:
        raise LoraError(f"lora quantize_base nf4 (QLoRA) needs torchao: {install_hint('quant')}") from None
    numel = weight.numel()
    if weight.dim() != 2 or numel % BLOCK:
        raise LoraError(
            f"lora quantize_base nf4: {name} ({list(weight.shape)}) cannot be stored NF4: it needs a matrix "
            f"whose element count is a multiple of {BLOCK}"
        )
    blocks, scaler_block = numel // BLOCK, SCALER_BLOCK
    while blocks % scaler_block:
        scaler_block //= 2
    return torchao.to_nf4(weight.detach().contiguous(), BLOCK, scaler_block)


def is_nf4(tensor: torch.Tensor | None) -> bool:
    """``tensor`` is torchao's NF4Tensor (without importing torchao: none exists unless it was imported)."""
    return type(tensor).__name__ == "NF4Tensor"


_CHUNK = 2**20  # codes (bytes: two weights each) dequantised at a time


def dense(weight: torch.Tensor) -> torch.Tensor:
    """The dense tensor an NF4 weight stands for, in its dtype (a dense weight is returned as it is): torchao's
    dequantisation (``weight.to(weight.dtype)``) computed a chunk of codes at a time."""
    if not is_nf4(weight):
        return weight
    w: Any = weight
    scales = w.dequantize_scalers(
        w.quantized_scalers, w.quantization_factor, w.scaler_block_size
    )  # (blocks,)
    codes = w.quantized_data  # (numel / 2,) uint8: two 4-bit codes a byte
    per_block = w.block_size // 2  # bytes of one block
    step = max(_CHUNK // per_block, 1) * per_block
    out = torch.empty(2 * codes.numel(), dtype=w.dtype, device=codes.device)
    for start in range(0, codes.numel(), step):
        chunk = codes[start : start + step]
        scale = scales[start // per_block : (start + chunk.numel()) // per_block]
        scale = scale.unsqueeze(-1).expand(-1, per_block).reshape(-1)  # one per byte
        first = w.nf4[(chunk >> 4).long()] * scale  # as torchao: nf4[code] * block scale
        second = w.nf4[(chunk & 0b1111).long()] * scale
        out[2 * start : 2 * (start + chunk.numel())] = torch.stack([first, second], dim=-1).reshape(-1)
    return out.view(weight.shape)


class _LinearNf4(torch.autograd.Function):
    """x W^T with W NF4: dequantised for the forward and again for the input's gradient; W gets none."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        ctx.weight = weight  # the NF4 tensor itself: a quarter of the dense bytes, kept for backward
        return F.linear(x, dense(weight).to(x.dtype))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad @ dense(ctx.weight).to(grad.dtype), None


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x (N, I) -> (N, O): ``F.linear``, the weight dequantised for this matmul when it is NF4."""
    if not is_nf4(weight):
        return F.linear(x, weight, bias)
    out: torch.Tensor = _LinearNf4.apply(x, weight)  # (N, O)
    return out + bias if bias is not None else out


def frozen(weight: torch.Tensor) -> nn.Parameter:
    """A parameter that never learns, holding ``weight`` (NF4 or dense)."""
    return nn.Parameter(weight, requires_grad=False)


class Nf4Linear(nn.Module):
    """A frozen projection stored NF4: ``weight`` (O, I) an NF4Tensor, ``bias`` (O,) dense or None.

    The state-dict names stay the ``nn.Linear``'s (``...up_proj.weight``). ``base_sample``: what the
    adapter fingerprint reads from the dense weight, taken before it was quantised (`zoo.lora.fingerprint`).
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, *, base_sample: WeightSample) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.weight = frozen(weight)
        self.bias: nn.Parameter | None
        self.register_parameter("bias", frozen(bias.detach()) if bias is not None else None)
        self.base_sample = base_sample

    @classmethod
    def from_linear(cls, linear: nn.Linear, *, name: str = "weight") -> Nf4Linear:
        """``linear``'s weight quantised (its dense weight is released once nothing else holds it)."""
        sample = weight_sample(linear.weight, name=name)
        return cls(quantize(linear.weight, name=name), linear.bias, base_sample=sample)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, nf4"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (N, I) -> (N, O)."""
        return linear(x, self.weight, self.bias)

    def to_linear(self) -> nn.Linear:
        """A plain ``nn.Linear`` holding the dequantised weight (the compute dtype) and the same bias."""
        linear = nn.Linear(self.in_features, self.out_features, bias=self.bias is not None, device="meta")
        linear.weight = frozen(dense(self.weight.detach()))
        linear.register_parameter("bias", self.bias)
        return linear
