"""`quantize`: a built or loaded zoo model's matrices to int8 (or int4) in place, through torchao's ``quantize_``.

What is quantised — the matrices that decoding streams from memory once per token:

    every nn.Linear inside a stack      attention (qkv_proj / q_proj, kv_proj, out_proj), FFN (up, down)
    an untied LM head's output matrix   (V, C): often the largest single matrix of a decoder

What is not: token and position embeddings (lookups: one row read per token, nothing to gain), a head
tied to the embeddings (quantising it would untie it or quantise the lookups too), norms and biases
(tiny, and where the numerics are fragile), and the small matrices outside the stacks (pooler,
classifier, MLM transform, OPT's projections), which decide the output directly and weigh little.

Activations stay in the model's dtype: cast the model first (``model.to(torch.bfloat16)``), then
quantise; the weights keep that dtype as the one they dequantise to.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from zoo.models.heads import LMHead
from zoo.quant.library import QuantizationError, import_torchao, torchao_version
from zoo.quant.record import WEIGHTS, Quantization, Weights, quantization_of, set_quantization
from zoo.quant.schemes import SCHEMES
from zoo.stacks import Stack

if TYPE_CHECKING:
    from zoo.models import ZooModel

__all__ = ["is_quantized_tensor", "quantization_targets", "quantize"]


def quantize(model: ZooModel, weights: Weights = "int8", *, group_size: int | None = None) -> ZooModel:
    """Quantise ``model``'s matrices to ``weights`` ("int8" or "int4") in place; returns the model.

    int8: symmetric, one scale per output row, on any device (torchao's ``Int8WeightOnlyConfig``).
    int4: asymmetric in groups of ``group_size`` input features (32 by default; 64 or 128), packed for
    torch's CPU kernel; CPU only, and fastest with a bfloat16 model. The model records what was done as
    ``model.quantization`` (a `Quantization`), which `zoo.save` writes into the checkpoint's metadata.

    Refused, with the reason: an unknown ``weights``, a model already quantised, a model without weights
    (meta), a matrix whose shape the kernel cannot take (named), and a missing torchao
    (``pip install -e '.[quant]'``).
    """
    if weights not in WEIGHTS:
        raise QuantizationError(f"weights must be one of {', '.join(WEIGHTS)}, got {weights!r}")
    scheme = SCHEMES[weights]
    group_size = scheme.group_size(group_size)
    previous = quantization_of(model)
    if previous is not None:
        raise QuantizationError(
            f"the model is already quantised ({previous.describe()}); quantise the floating-point model"
        )
    for name, parameter in model.named_parameters():
        if is_quantized_tensor(parameter):
            raise QuantizationError(
                f"{name} is already a quantised tensor ({type(parameter).__name__}); quantise the "
                "floating-point model"
            )
    targets = quantization_targets(model)
    if not targets:
        raise QuantizationError("the model has no matrices to quantise (no Linear layer in its stacks)")
    for module_name, module in targets.items():
        weight, name = _weight(module), f"{module_name}.weight"
        if weight.is_meta:
            raise QuantizationError(f"{name} is on the meta device: load or initialise the model first")
        if not weight.is_floating_point():
            raise QuantizationError(f"{name} is {weight.dtype}, not a floating-point matrix")
        scheme.check(name, weight, group_size)
    config = scheme.config(group_size)  # imports torchao: refused here, before anything changed, without it
    quantize_ = import_torchao().quantize_
    with torch.no_grad():
        quantize_(model, config, filter_fn=lambda module, fqn: fqn in targets and module is targets[fqn])
    left = [f"{name}.weight" for name, module in targets.items() if not is_quantized_tensor(_weight(module))]
    if left:  # torchao skips, with a log line, a shape its kernel cannot take: the checks above should not
        raise QuantizationError(f"torchao left {len(left)} matrices unquantised, e.g. {left[0]}")
    record = Quantization(
        weights, group_size, tuple(f"{name}.weight" for name in targets), version=torchao_version()
    )
    set_quantization(model, record)
    return model


def quantization_targets(model: nn.Module) -> dict[str, nn.Module]:
    """{module name: module} whose ``weight`` `quantize` replaces: the stacks' Linear layers and an
    untied LM head, in the model's module order (each shared module once)."""
    stacks = [name for name, module in model.named_modules() if isinstance(module, Stack)]
    targets: dict[str, nn.Module] = {}
    for name, module in model.named_modules():
        in_stack = any(name.startswith(stack + ".") for stack in stacks)
        if (isinstance(module, nn.Linear) and in_stack) or (
            isinstance(module, LMHead) and module.weight is not None
        ):
            targets[name] = module
    return targets


def _weight(module: nn.Module) -> torch.Tensor:
    weight = module.weight
    assert isinstance(weight, torch.Tensor)  # a Linear's or an untied LMHead's matrix
    return weight


def is_quantized_tensor(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` is one of torchao's quantised subclasses (not a plain tensor or Parameter)."""
    return type(tensor) not in (torch.Tensor, nn.Parameter) and hasattr(tensor, "qdata")
