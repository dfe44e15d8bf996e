"""Where a model's weight matrices sit in memory while it decodes on a CPU.

A decode step multiplies one row per sequence by every weight matrix: ``F.linear(x, W)`` with x (R, in)
and W (out, in), a matrix-vector product bound by reading W. For a few rows, the CPU BLAS kernels read W
faster when it is stored column-major — the same (out, in) tensor, strides (1, out), i.e. Wᵀ contiguous:

    rows per step                      1      2      4      8     32+
    float32, row-major (ms)          7.6   15.2   12.4   10.1   equal
    float32, column-major (ms)       6.0    9.9   13.0   11.0   equal
    bfloat16                     within 6% either way

(the 25 weight matrices of the bench's GPT-shaped decode step, ``python -m bench``'s shapes, 2-core AMD
EPYC, torch 2.13 MKL.) So float32 decoding of at most `COLUMN_MAJOR_ROWS` rows per step on the CPU keeps
every 2-D floating-point weight column-major, and any other decoding keeps them row-major (contiguous):
`use_decoding_layout`, called by `zoo.generation.generate` / `stream` for a model in eval mode, and by the
serving engine. The values, shapes and Parameter objects stay the same (``param.data`` is swapped, one
matrix at a time: an optimizer, hooks and tied weights are unaffected; no second copy is kept), and the
layout stays until a run needs the other one, so steady single-row decoding pays the conversion once
(~30 ms for the bench's 23M-parameter model).

Training sees ordinary contiguous weights: ``ZooModel.train()`` puts them back row-major (`row_major`),
as do ``zoo.save`` and ``zoo.to_hf`` before they gather the tensors. Code of one's own that needs
contiguous tensors from a model that decoded single rows (``safetensors.torch.save_file(model.state_dict())``)
calls `row_major` first.
"""

from __future__ import annotations

import torch
from torch import nn

# At most this many rows per decode step go column-major (measured above: 4 rows is a draw, 8 lose 8%).
COLUMN_MAJOR_ROWS = 2


def wants_column_major(device: torch.device, dtype: torch.dtype, rows: int) -> bool:
    """Whether decoding ``rows`` rows per step with ``dtype`` weights on ``device`` is faster column-major."""
    return device.type == "cpu" and dtype == torch.float32 and rows <= COLUMN_MAJOR_ROWS


def use_decoding_layout(model: nn.Module, *, rows: int) -> None:
    """Put ``model``'s weight matrices in the layout that decoding ``rows`` rows per step runs fastest with."""
    matrices = _matrices(model)
    if not matrices:
        return
    first = matrices[0]
    _set_layout(matrices, column_major=wants_column_major(first.device, first.dtype, rows))


def row_major(model: nn.Module) -> None:
    """Make every weight matrix of ``model`` contiguous again (a no-op unless it decoded single rows on CPU)."""
    _set_layout(_matrices(model), column_major=False)


def is_column_major(tensor: torch.Tensor) -> bool:
    """A 2-D tensor stored transposed: strides (1, rows), not contiguous."""
    return tensor.dim() == 2 and not tensor.is_contiguous() and tensor.t().is_contiguous()


def _matrices(model: nn.Module) -> list[nn.Parameter]:
    # Every plain 2-D floating-point parameter, each once (a tied head's matrix is its embedding's):
    # embeddings too, since a tied LM head multiplies by the embedding matrix; a lookup of one row is
    # unaffected. Tensor subclasses (torchao's quantised weights) keep the layout their kernels expect.
    return [
        p
        for p in model.parameters()
        if p.dim() == 2 and p.is_floating_point() and type(p.data) is torch.Tensor
    ]


@torch.no_grad()
def _set_layout(matrices: list[nn.Parameter], *, column_major: bool) -> None:
    for param in matrices:
        if column_major and param.is_contiguous() and param.shape[0] > 1 and param.shape[1] > 1:
            param.data = param.data.t().contiguous().t()  # same (out, in) shape, stored as (in, out)
        elif not column_major and is_column_major(param):
            param.data = param.data.contiguous()
