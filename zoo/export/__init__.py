"""Export a zoo model's forward: a ``torch.export`` program (``.pt2``) or an ONNX file, with dynamic batch
and sequence lengths, the exported graph equal to eager.

    ep = zoo.export.export_program(model)            # torch.export.ExportedProgram; ep.module()(**inputs)
    zoo.export.save_program(ep, "model.pt2")         # atomic; torch.export.load / load_program reads it
    zoo.export.export_onnx(model, "model.onnx")      # torch.onnx.export(dynamo=True): the onnx extra
    zoo.export.export_gguf(model, "model.gguf", tokenizer=tok, type="q8_0")   # llama.cpp: the gguf extra

The modules, along the flow:

    inputs.py    input names per family, a made-up padded example batch, the dynamic dims (``Dim`` s)
    program.py   `export_program`, `output_names`, `save_program`, `load_program`
    onnx.py      `export_onnx` and what it wrote (`OnnxExport`)
    check.py     exported against eager: `compare_program`, `compare_onnx` (onnxruntime)
    gguf/        `export_gguf`: a decoder as one GGUF file for llama.cpp / Ollama (the gguf extra)

What the graphs take and return, what is dynamic and what is not covered: docs/export.md.
"""

from __future__ import annotations

from zoo.export.check import compare_onnx, compare_program, eager_outputs
from zoo.export.errors import ExportError, OnnxMissingError
from zoo.export.gguf import GGUF_TYPES, GGUFExport, GGUFMissingError, export_gguf
from zoo.export.inputs import INPUT_NAMES, dynamic_shapes, example_inputs, input_names
from zoo.export.onnx import OnnxExport, export_onnx, require_onnx
from zoo.export.program import export_program, load_program, output_names, save_program

__all__ = [
    "GGUF_TYPES",
    "INPUT_NAMES",
    "ExportError",
    "GGUFExport",
    "GGUFMissingError",
    "OnnxExport",
    "OnnxMissingError",
    "compare_onnx",
    "compare_program",
    "dynamic_shapes",
    "eager_outputs",
    "example_inputs",
    "export_gguf",
    "export_onnx",
    "export_program",
    "input_names",
    "load_program",
    "output_names",
    "require_onnx",
    "save_program",
]
