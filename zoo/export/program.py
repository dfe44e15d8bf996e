"""A model's forward as a ``torch.export.ExportedProgram``, saved as a ``.pt2`` file.

    ep = export_program(model)                  # a made-up padded example, batch and lengths dynamic
    out = ep.module()(input_ids=ids, attention_mask=mask)       # a ModelOutput, as the model returns it
    save_program(ep, "model.pt2"); ep = load_program("model.pt2")

The graph is the model's eval-mode forward (no dropout) with ``output_attentions=False``, no labels and no
KV cache: it returns a `zoo.models.outputs.ModelOutput` (a registered pytree) holding ``logits`` (where the
model has a head), ``last_hidden_state`` and, as the model gives them, ``encoder_last_hidden_state`` and
``pooler_output``; the other fields are None. `output_names` lists them in the graph's (flat) order.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path

import torch
import torch.utils._pytree as pytree

from zoo.export.errors import ExportError
from zoo.export.inputs import check_example, dynamic_shapes, example_inputs
from zoo.io.atomic import write_atomic
from zoo.io.outputs import TORCH_PROGRAM, check_output_file
from zoo.models.base import ZooModel
from zoo.models.outputs import ModelOutput
from zoo.stacks import Stack


def export_program(
    model: ZooModel, *, example: Mapping[str, torch.Tensor] | None = None, dynamic: bool = True
) -> torch.export.ExportedProgram:
    """``model``'s forward exported with ``torch.export.export`` (non-strict), in eval mode.

    ``example``: the keyword inputs to trace with (`zoo.export.inputs.INPUT_NAMES`; default
    `example_inputs`, padded). The exported program takes exactly these names. ``dynamic``: batch and
    lengths are ``torch.export.Dim`` s (`dynamic_shapes`), so the program runs any batch and any length up
    to ``max_positions``; else the example's shapes are fixed. The model's train/eval mode is restored after.
    """
    if not isinstance(model, ZooModel):
        raise ExportError(f"export_program needs a zoo model, got {type(model).__name__}")
    example = dict(example) if example is not None else example_inputs(model)
    check_example(model, example, dynamic=dynamic)
    if dynamic:
        _check_dynamic_patterns(model)
    shapes = dynamic_shapes(model, example) if dynamic else None
    training = model.training
    model.eval()
    try:
        return torch.export.export(model, (), example, dynamic_shapes=shapes)
    finally:
        model.train(training)


def _check_dynamic_patterns(model: ZooModel) -> None:
    """A block-sparse layout is a constant of the length (its block count): no graph serves every length."""
    for name in ("encoder", "decoder"):
        stack = getattr(model, name, None)
        if isinstance(stack, Stack) and any(p.kind == "block_sparse" for p in stack.patterns.distinct):
            raise ExportError(
                f"{name}: a block_sparse attention pattern's layout depends on the sequence length, so it "
                "cannot be exported with dynamic lengths; export with dynamic=False (zoo export --static) "
                "for the example's shapes"
            )


def output_names(program: torch.export.ExportedProgram) -> list[str]:
    """The program's outputs in their flat order (the ONNX outputs): the `ModelOutput` fields it returns,
    ``name.i`` for the i-th tensor of a tuple field."""
    spec = program.call_spec.out_spec
    if spec is None:
        raise ExportError("the exported program records no output structure")
    tree = pytree.tree_unflatten(list(range(spec.num_leaves)), spec)  # each leaf: its flat index
    if not isinstance(tree, ModelOutput):
        return [f"output_{i}" for i in range(spec.num_leaves)]
    names: dict[int, str] = {}
    for field in dataclasses.fields(tree):
        value = getattr(tree, field.name)
        if isinstance(value, int):
            names[value] = field.name
        elif isinstance(value, tuple):
            names.update((index, f"{field.name}.{i}") for i, index in enumerate(value))
    return [names[i] for i in range(spec.num_leaves)]


def save_program(program: torch.export.ExportedProgram, path: str | Path, *, overwrite: bool = False) -> Path:
    """Write ``program`` to ``path`` (``torch.export.save``'s ``.pt2`` archive), atomically; returns it. An
    existing file that is not an exported program (a checkpoint's weights, say) is refused unless
    ``overwrite`` (`zoo.io.outputs`); an earlier program is replaced."""
    path = Path(path).expanduser()
    if path.is_dir():
        raise ExportError(f"{path} is a folder; give the file to write, e.g. {path / 'model.pt2'}")
    check_output_file(path, TORCH_PROGRAM, writer="zoo.export.save_program", overwrite=overwrite)
    write_atomic(path, lambda temp: torch.export.save(program, temp))
    return path


def load_program(path: str | Path) -> torch.export.ExportedProgram:
    """A ``.pt2`` file `save_program` wrote (``torch.export.load``; zoo's `ModelOutput` is registered on
    import). torch's loader may unpickle parts of the archive: load only files you trust."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise ExportError(f"{path}: no such file (an exported program, .pt2)")
    return torch.export.load(path)
