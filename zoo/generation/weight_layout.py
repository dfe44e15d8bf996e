"""Where a model's weight matrices sit in memory while it decodes on a CPU.

A decode step multiplies one row per sequence by every weight matrix: ``F.linear(x, W)`` with x (R, in)
and W (out, in), a matrix-vector product bound by reading W. For one or two rows, the CPU's BLAS reads a
*wide* W (out > in: the fused q/k/v projection, the FFN's up projection, the LM head) about twice as fast
when it is stored column-major — the same (out, in) tensor with strides (1, out), i.e. Wᵀ contiguous —
while a narrow one (the FFN's down projection) is faster row-major, and a square one is a draw.
Per matrix, float32, 2-core AMD EPYC, torch 2.13 MKL (time column-major / time row-major):

    rows per step          1      2      4      8     32
    (2048, 512) up       0.47   0.47   1.02   0.99   1.00
    (8192, 512) head     0.56   0.42   0.93   0.74   0.89
    (512, 2048) down     1.36   1.30   1.08   1.21   1.11

The chain of the bench's GPT-shaped decode step (6 layers, 25 matrices) takes 8.1 ms row-major and 5.5 ms
with its wide matrices column-major at one row (14.0 -> 9.0 ms at two); from four rows on no layout wins
in that chain, and bfloat16 moves under 6% either way. So `use_decoding_layout` — called by
`zoo.generation.generate` / `stream` for a model in eval mode, and by the serving engine — keeps a
model's wide matrices column-major for float32 decoding of at most `COLUMN_MAJOR_ROWS` rows a step on the
CPU, and every matrix row-major otherwise. Values, shapes and Parameter objects stay the same
(``param.data`` is swapped: an optimizer, hooks and tied weights are unaffected), and the layout stays until
a run needs the other one, so steady single-row decoding pays the conversion once (~30 ms for the bench's
23M-parameter model, a few seconds for a 1B one).

Decoding never holds a second copy of a weight: matrices are converted one at a time, each by
`zoo.generation.transposed.transposed_copy`, which gives the old storage's pages back to the system as it
reads them, so the resident set grows by the block in flight and a page or two per row of the copy (about
24 MiB at width 2048), not by the matrix (one of at most 16 MiB is copied whole, then given back). A plain ``W.t().contiguous()`` held the whole old matrix beside the new one: on a
Llama-3.2-1B-shaped model in float32 the first single-row `generate` peaked 1 GB over the loaded model (its
tied 128256 x 2048 table), and with weights memory-mapped from a checkpoint the file's pages stayed resident
beside every converted copy (3.4 GB, and 58 MiB on the bench's GPT shape); now it peaks ~26 MiB over the
model, as transformers' `generate` does (bench/README.md, the memory rows). A matrix whose
storage another tensor shares (a view, a ``state_dict()`` someone kept) is never released: it is converted
by a plain copy when at most `COPY_BYTES`, and otherwise left as it is for decoding (the other holder keeps
the old copy alive, so converting would hold two); likewise everywhere but Linux, where pages cannot be given
back. `row_major` always converts (saving needs contiguous tensors).

Training sees ordinary contiguous weights: ``ZooModel.train()`` puts them back row-major (`row_major`),
as do ``zoo.save`` and ``zoo.to_hf`` before they gather the tensors. Code of one's own that needs
contiguous tensors from a model that decoded single rows (``safetensors.torch.save_file(model.state_dict())``)
calls `row_major` first.
"""

from __future__ import annotations

import torch
from torch import nn

from zoo.generation.transposed import can_release, transposed_copy, uninterrupted

# At most this many rows per decode step go column-major (measured above: from 4 rows on, none wins).
COLUMN_MAJOR_ROWS = 2
# A matrix whose old pages cannot be given back during its copy (its storage shared with another tensor, or
# not Linux) is converted for decoding only up to this size, so the copy held beside it stays small: the
# bench's GPT head (8192 x 512 float32) is converted, a 1B model's 128256 x 2048 table is not.
COPY_BYTES = 16 * 2**20


def wants_column_major(
    shape: torch.Size | tuple[int, ...], device: torch.device, dtype: torch.dtype, rows: int
) -> bool:
    """Whether an (out, in) weight matrix multiplies ``rows`` rows per step faster stored column-major."""
    out_features, in_features = shape
    cpu_float32 = device.type == "cpu" and dtype == torch.float32
    return cpu_float32 and rows <= COLUMN_MAJOR_ROWS and out_features > in_features


def use_decoding_layout(model: object, *, rows: int) -> None:
    """Put each of ``model``'s weight matrices in the layout that decoding ``rows`` rows a step runs fastest
    with (a `GenerativeModel` that is not an ``nn.Module`` is left alone). A matrix that cannot be
    converted without a second copy held (see the module docstring) and is over `COPY_BYTES` stays as it is."""
    if not isinstance(model, nn.Module):
        return
    with torch.no_grad():
        for param in _matrices(model):
            if wants_column_major(param.shape, param.device, param.dtype, rows):
                if param.is_contiguous():
                    _relayout(param, column_major=True, required=False)
            elif is_column_major(param):
                _relayout(param, column_major=False, required=False)


@torch.no_grad()
def row_major(model: nn.Module) -> None:
    """Make every weight matrix of ``model`` contiguous again (a no-op unless it decoded single rows on CPU)."""
    for param in _matrices(model):
        if is_column_major(param):
            _relayout(param, column_major=False, required=True)


def is_column_major(tensor: torch.Tensor) -> bool:
    """A 2-D tensor stored transposed: strides (1, rows), not contiguous."""
    return tensor.dim() == 2 and not tensor.is_contiguous() and tensor.t().is_contiguous()


def _relayout(param: nn.Parameter, *, column_major: bool, required: bool) -> None:
    """Store ``param``'s matrix the other way round (``param.data`` swapped, values and shape the same),
    giving the old storage's pages back as the copy reads them where nothing else refers to it; otherwise
    by a plain copy, made only when ``required`` or the matrix is at most `COPY_BYTES`."""
    release = _sole_owner(param) and can_release(param)
    stored = param.data if column_major else param.data.t()  # the storage as a contiguous matrix
    if not (release or required or stored.numel() * stored.element_size() <= COPY_BYTES):
        return
    with uninterrupted():  # released pages read as zeros: the copy goes in before anything else runs
        copy = transposed_copy(stored, release=release)
        param.data = copy.t() if column_major else copy  # column-major: (out, in) with strides (1, out)


def _sole_owner(param: nn.Parameter) -> bool:
    """Whether no tensor but ``param`` refers to its storage: no view of it, no ``state_dict()`` kept, no
    second Parameter sharing it (whose values releasing the pages would wipe)."""
    use_count = getattr(torch._C, "_storage_Use_Count", None)  # torch's own check in swap_tensors
    if use_count is None:
        return False
    return bool(use_count(param.untyped_storage()._cdata) <= 2)  # param, and the storage object asked for


def _matrices(model: nn.Module) -> list[nn.Parameter]:
    """The matrices ``F.linear`` multiplies by, each once: the ``weight`` of every linear map (a module with
    ``in_features`` and ``out_features``: ``nn.Linear``, `zoo.lora.LoraLinear`) and a head's
    ``output_weight`` (a tied LM head's is the embedding table, which then moves too: the head's matmul
    reads all of it every step, a lookup only a row per token). Tables that are only looked up (untied
    embeddings, learned positions, position biases) stay as they are: column-major, each lookup would be a
    strided gather. Tensor subclasses (torchao's quantised weights) keep the layout their kernels expect."""
    found: dict[int, nn.Parameter] = {}
    for module in model.modules():
        linear = hasattr(module, "in_features") and hasattr(module, "out_features")
        for weight in (
            getattr(module, "output_weight", None),
            getattr(module, "weight", None) if linear else None,
        ):
            if (
                isinstance(weight, nn.Parameter)
                and weight.dim() == 2
                and weight.is_floating_point()
                and type(weight.data) is torch.Tensor
            ):
                found[id(weight)] = weight
    return list(found.values())
