"""A model's forward as an ONNX file, through ``torch.onnx.export(..., dynamo=True)`` (the ``onnx`` extra).

    info = export_onnx(model, "model.onnx")                   # dynamic batch and lengths, like the .pt2
    session = onnxruntime.InferenceSession("model.onnx")
    logits, hidden = session.run(None, {"input_ids": ids, "attention_mask": mask})   # int64 numpy arrays

The ONNX graph is the `zoo.export.program.export_program` graph, converted: the same inputs, by name
(``input_ids``, ``attention_mask``, ``token_type_ids``, ``decoder_input_ids``, ``decoder_attention_mask``;
int64), and the `ModelOutput` flattened into named outputs in field order: ``logits``,
``last_hidden_state``, then ``encoder_last_hidden_state`` or ``pooler_output`` where the model gives them.
Dynamic dimensions keep their names (``batch``, ``length`` / ``source_length``, ``target_length``).

Weights over 2 GB (protobuf's limit for one file) go to ``<file>.data`` beside the model (ONNX external
data); both files are written atomically, the data file first.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from zoo.export.errors import INSTALL_HINT, ExportError, OnnxMissingError
from zoo.export.inputs import dynamic_shapes, example_inputs
from zoo.export.program import export_program, output_names
from zoo.io.atomic import discard_temp, fsync_dir, move_into_place, write_temp
from zoo.io.outputs import ONNX_MODEL, check_output_file
from zoo.models.base import ZooModel
from zoo.spec.errors import short_repr

LARGE_MODEL_BYTES = 2**31  # protobuf refuses a message of 2 GB or more: the weights must go to a data file
# torch.onnx's loggers that speak on every export without saying anything about this model (e.g. that
# torchvision's operators are skipped when torchvision is not installed).
_NOISY_LOGGERS = ("torch.onnx._internal.exporter._registration",)


@dataclass(frozen=True)
class OnnxExport:
    """What `export_onnx` wrote."""

    path: Path
    data_path: Path | None  # the external weights, ``<file>.data``, when they were written apart
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    dynamic: dict[str, tuple[str | int, ...]]  # per input: its dimensions, a name where dynamic
    opset: int


def require_onnx() -> None:
    """`OnnxMissingError` unless onnx and onnxscript (what torch.onnx's exporter needs) are installed."""
    missing = [name for name in ("onnx", "onnxscript") if importlib.util.find_spec(name) is None]
    if missing:
        raise OnnxMissingError(f"{INSTALL_HINT} ({' and '.join(missing)} not installed)")


def supported_opsets() -> range:
    """The ONNX opsets an export can target: from torch.onnx's own (it has no operators below it) to the
    newest the installed onnxscript converts to and onnx defines. Outside them torch.onnx logs a traceback
    and quietly writes another opset, so `check_opset` refuses them first."""
    import onnx

    try:  # private constants: their public meaning is "what this torch / onnxscript can do"
        from torch.onnx._internal.exporter._constants import TORCHLIB_OPSET as low
    except ImportError:  # pragma: no cover - another torch layout
        low = 18
    try:
        from onnxscript.version_converter._version_converter import SUPPORTED_MAX_ONNX_OPSET as high
    except ImportError:  # pragma: no cover - another onnxscript layout
        high = onnx.defs.onnx_opset_version()
    return range(int(low), min(int(high), onnx.defs.onnx_opset_version()) + 1)


def check_opset(opset: object) -> None:
    """Raise `ExportError` unless ``opset`` is None (torch.onnx's default) or an opset `supported_opsets`
    lists; before any tracing."""
    if opset is None:
        return
    require_onnx()
    opsets = supported_opsets()
    if not isinstance(opset, int) or isinstance(opset, bool) or opset not in opsets:
        raise ExportError(
            f"opset {short_repr(opset)} is not supported: this torch.onnx and onnxscript export opsets "
            f"{opsets.start} to {opsets.stop - 1} (an int)"
        )


def export_onnx(
    model: ZooModel,
    path: str | Path,
    *,
    example: Mapping[str, torch.Tensor] | None = None,
    opset: int | None = None,
    dynamic: bool = True,
    external_data: bool | None = None,
    overwrite: bool = False,
) -> OnnxExport:
    """Write ``model``'s forward to ``path`` as ONNX; returns what was written.

    ``example`` and ``dynamic``: as `zoo.export.export_program`. ``opset``: the ONNX opset (default
    torch.onnx's; `supported_opsets` lists the others). ``external_data``: weights in ``<path>.data``
    (default: only when they reach 2 GB). An existing file that is not an ONNX model is refused unless
    ``overwrite`` (`zoo.io.outputs`); an earlier one is replaced.
    """
    require_onnx()
    check_opset(opset)
    path = Path(path).expanduser()
    if path.is_dir():
        raise ExportError(f"{path} is a folder; give the file to write, e.g. {path / 'model.onnx'}")
    check_output_file(path, ONNX_MODEL, writer="zoo.export.export_onnx", overwrite=overwrite)
    example = dict(example) if example is not None else example_inputs(model)
    program = export_program(model, example=example, dynamic=dynamic)
    inputs, outputs = tuple(example), tuple(output_names(program))
    shapes = dynamic_shapes(model, example) if dynamic else None
    with _quiet():
        onnx_program = torch.onnx.export(
            program,
            (),
            None,
            kwargs=example,
            dynamic_shapes=shapes,
            input_names=list(inputs),
            output_names=list(outputs),
            opset_version=opset,
            dynamo=True,
            verbose=False,
        )
    if onnx_program is None:  # only the legacy exporter (dynamo=False) returns nothing
        raise ExportError("torch.onnx.export returned no program")
    weights = sum(_nbytes(tensor) for tensor in onnx_program.model.graph.initializers.values())
    external = weights >= LARGE_MODEL_BYTES if external_data is None else external_data
    data_path = path.with_name(path.name + ".data") if external else None
    _write(path, data_path, lambda temp: onnx_program.save(temp, external_data=external))
    dims = {
        name: tuple(
            shapes[name][axis].__name__ if shapes is not None and axis in shapes[name] else size
            for axis, size in enumerate(example[name].shape)
        )
        for name in inputs
    }
    return OnnxExport(path, data_path, inputs, outputs, dims, onnx_program.model.opset_imports[""])


def _write(path: Path, data_path: Path | None, save: Any) -> None:
    """``save(temp)`` in a private temp folder beside ``path``, then the data file (if any) and the model
    renamed into place: a reader sees a complete model, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = write_temp(path, save)
    try:
        if data_path is not None:
            data_temp = temp.with_name(data_path.name)
            if not data_temp.is_file():
                raise ExportError(f"{path}: the ONNX exporter wrote no external data file {data_path.name}")
            with data_temp.open("rb+") as f:
                os.fsync(f.fileno())
            os.chmod(data_temp, 0o644)
            os.replace(data_temp, data_path)
        move_into_place(temp, path)
    except BaseException:
        discard_temp(temp)
        raise
    fsync_dir(path.parent)


def _nbytes(value: Any) -> int:
    """Bytes of an ONNX IR initializer (its const value), 0 where it holds none."""
    const = getattr(value, "const_value", None)
    return int(getattr(const, "nbytes", 0) or 0)


@contextmanager
def _quiet() -> Iterator[None]:
    """torch.onnx's routine log lines and its warning that two inputs share a dimension (they do: that is
    the shared batch and length) silenced; errors still raise."""
    loggers = [logging.getLogger(name) for name in _NOISY_LOGGERS]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings(
                "ignore", message=r".*The axis name: .* will not be used", category=UserWarning
            )
            # torch's own treespec copy, deprecated inside torch: nothing for the caller to change
            warnings.filterwarnings(
                "ignore", message=r".*isinstance\(treespec, LeafSpec\)", category=FutureWarning
            )
            yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)
