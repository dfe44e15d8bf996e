"""Exported against eager: run both on the same inputs and report the largest difference per output.

example = example_inputs(model, batch=3, length=11)           # a batch and length the export never saw
compare_program(model, program, example)    # {"logits": 0.0, "last_hidden_state": 0.0}
compare_onnx(model, "model.onnx", example)  # needs onnxruntime: {"logits": 2.4e-07, ...}
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from pathlib import Path

import torch

from zoo._extras import install_hint
from zoo.export.errors import ExportError, OnnxMissingError
from zoo.models.base import ZooModel
from zoo.models.outputs import ModelOutput


def eager_outputs(model: ZooModel, example: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The eval-mode forward's tensor outputs on ``example``, by `ModelOutput` field name (the mode restored)."""
    training = model.training
    model.eval()
    try:
        with torch.no_grad():
            return _tensors(model(**example))
    finally:
        model.train(training)


def compare_program(
    model: ZooModel, program: torch.export.ExportedProgram, example: Mapping[str, torch.Tensor]
) -> dict[str, float]:
    """Max |exported - eager| per output of ``program`` (`zoo.export.export_program`) on ``example``."""
    with torch.no_grad():
        exported = _tensors(program.module()(**example))
    return _differences(exported, eager_outputs(model, example))


def compare_onnx(model: ZooModel, path: str | Path, example: Mapping[str, torch.Tensor]) -> dict[str, float]:
    """Max |onnxruntime - eager| per named output of the ONNX file at ``path`` on ``example`` (CPU)."""
    if importlib.util.find_spec("onnxruntime") is None:
        raise OnnxMissingError(f"checking an ONNX file needs onnxruntime: {install_hint('onnx')}")
    import onnxruntime

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    wanted = [node.name for node in session.get_inputs()]
    missing = [name for name in wanted if name not in example]
    if missing:
        raise ExportError(f"{path}: the ONNX model takes {', '.join(missing)}, which the example lacks")
    feeds = {name: example[name].detach().cpu().numpy() for name in wanted}
    names = [node.name for node in session.get_outputs()]
    exported = {name: torch.from_numpy(value) for name, value in zip(names, session.run(None, feeds))}
    return _differences(exported, eager_outputs(model, example))


def _tensors(output: object) -> dict[str, torch.Tensor]:
    if not isinstance(output, ModelOutput):
        raise ExportError(f"expected a ModelOutput, got {type(output).__name__}")
    found = {}
    for name, value in vars(output).items():
        if isinstance(value, torch.Tensor):
            found[name] = value
        elif isinstance(value, tuple):
            found.update((f"{name}.{i}", tensor) for i, tensor in enumerate(value))
    return found


def _differences(exported: dict[str, torch.Tensor], eager: dict[str, torch.Tensor]) -> dict[str, float]:
    if set(exported) != set(eager):
        raise ExportError(f"exported outputs {sorted(exported)} are not the eager {sorted(eager)}")
    differences = {}
    for name, tensor in exported.items():
        reference = eager[name].detach().float().cpu()
        if tuple(tensor.shape) != tuple(reference.shape):
            raise ExportError(f"{name}: exported shape {tuple(tensor.shape)}, eager {tuple(reference.shape)}")
        differences[name] = (
            float((tensor.detach().float().cpu() - reference).abs().max()) if tensor.numel() else 0.0
        )
    return differences
