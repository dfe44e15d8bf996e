"""Weight-only quantisation through torchao (an optional extra): int8 anywhere, int4 on the CPU.

    from zoo.quant import quantize
    model = quantize(zoo.load("runs/demo"))             # int8: one scale per output row
    zoo.save(model, "runs/demo-int8", tokenizer=tok)    # qdata + scales, the record in the metadata
    model = zoo.load("runs/demo-int8")                  # the same int8 tensors back, bit for bit
    model = quantize(model_bf16, "int4", group_size=32) # int4 groups, torch's CPU kernel

The package, along the data flow:

    library.py   torchao imported on first use (quietly), or one line saying how to install it
    record.py    `Quantization`: what was done, on the model (``model.quantization``) and in the file
    schemes.py   int8 and int4: torchao's config, the shapes each kernel takes, the tensors on disk
    apply.py     `quantize`: which matrices (the stacks' Linear layers, an untied LM head), in place
    state.py     what `zoo.save` and `zoo.load` call to write and rebuild the quantised tensors

Format, accuracy and speed on this project's CPU: docs/quantization.md.
"""

from __future__ import annotations

from zoo.quant.apply import is_quantized_tensor, quantization_targets, quantize
from zoo.quant.library import INSTALL_HINT, QuantizationError, TorchaoMissingError
from zoo.quant.record import WEIGHTS, Quantization, Weights, quantization_of
from zoo.quant.state import float_parts

__all__ = [
    "INSTALL_HINT",
    "WEIGHTS",
    "Quantization",
    "QuantizationError",
    "TorchaoMissingError",
    "Weights",
    "float_parts",
    "is_quantized_tensor",
    "quantization_of",
    "quantization_targets",
    "quantize",
]
