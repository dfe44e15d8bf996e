"""`zoo.load`: a checkpoint directory (or its weights file, or its index) back to a model.

Loading reads only safetensors (never pickle). Before reading any tensor data it checks every header, the
spec, every name, shape and dtype, and that the spec asks for no more than the file holds (limits.py). It
builds the model on the ``meta`` device and assigns each tensor as read: on the CPU in the stored dtype a view
of the file's memory mapping (nothing copied; the pages become resident as the weights are used), otherwise
cast or moved one tensor at a time, its source's pages given back at once (`zoo.io.checkpoint.mapped`), so
no second full copy is ever held; then it recomputes the fixed tables (sinusoids, rotary angles, ALiBi
slopes) on the target device.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from zoo.devices import default_device, path_argument, resolve_device, resolve_dtype
from zoo.io.checkpoint.discovery import Checkpoint, LoadReport, open_checkpoint
from zoo.io.checkpoint.files import CheckpointError, CheckpointNotFoundError
from zoo.io.checkpoint.limits import check_allocation, check_spec_fits
from zoo.io.checkpoint.mapped import MappedFiles
from zoo.io.generation_file import read_generation_file, set_generation_file
from zoo.io.names import TOKENIZER_NAME
from zoo.io.paths import inside
from zoo.models import ZooModel, build_model
from zoo.quant.library import QuantizationError
from zoo.quant.state import assemble, check_loadable, part_names, place

if TYPE_CHECKING:
    from zoo.io.tokenizer import Tokenizer
    from zoo.spec import ModelSpec

__all__ = ["load", "load_tokenizer", "materialize_buffers", "read_spec"]

logger = logging.getLogger(__name__)


def load(
    path: str | os.PathLike[str],
    *,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
    strict: bool = True,
    return_report: bool = False,
) -> ZooModel | tuple[ZooModel, LoadReport]:
    """The model saved at ``path`` (a checkpoint directory, its ``model.safetensors`` or its index), in eval mode.

    ``device``: where the tensors go (default: the ambient device as for ``nn.Module`` construction, the CPU
    unless ``with torch.device(...)`` or ``torch.set_default_device`` says otherwise; ``"auto"``: CUDA when
    available); asking for a device that is not there (``"cuda"`` without CUDA) is a `ValueError`, raised
    before anything is read. On ``meta`` (given or ambient) every file is checked and the model is returned
    without reading a single tensor (its structure only).
    ``dtype``: cast floating-point tensors (integer and bool tensors keep theirs); default: as saved, which
    must then be one floating-point dtype (a float16 tensor among float32 ones is refused, naming it: pass
    ``dtype`` to load such a file in one dtype). A stored tensor whose kind differs from the model's (an
    integer where a floating-point weight belongs) is refused whatever ``dtype`` says.
    ``strict`` (default): any missing, unexpected or shape-mismatched tensor raises one `CheckpointError`
    naming them all. ``strict=False`` loads the tensors that fit, leaves the missing ones freshly
    initialised, and logs a warning; pass ``return_report=True`` to get ``(model, LoadReport)`` with the
    ``missing`` / ``unexpected`` / ``mismatched`` names.
    A ``generation_config.json`` beside the weights (Whisper's prompt and suppressed tokens) travels with the
    model (`zoo.io.generation_file`): `zoo.save` and `zoo.to_hf` write it, `zoo.transcribe` reads it.
    """
    # Checked first: without it, CUDA's absence surfaced from deep in safetensors (a pin_memory error).
    path = path_argument(path, where="zoo.load")
    device = resolve_device(device) if device is not None else default_device()
    dtype = resolve_dtype(dtype)
    checkpoint = open_checkpoint(path)
    folder = Path(path).expanduser()
    generation = read_generation_file(folder if folder.is_dir() else folder.parent, error=CheckpointError)
    spec, source = checkpoint.spec, str(checkpoint.source)
    quantization = checkpoint.quantization
    if quantization is not None:  # torchao, and a device its kernel runs on, before anything is built
        try:
            check_loadable(quantization, device=device)
        except QuantizationError as error:
            raise CheckpointError(f"{source}: holds {quantization.weights} weights; {error}") from None
    check_spec_fits(spec, checkpoint.shapes(), checkpoint.layers_held(), source=source)  # before any build
    model = build_model(spec, device="meta", init=False)
    state = model.state_dict()
    expected = {name: tuple(t.shape) for name, t in state.items()}
    report = checkpoint.compare(expected)
    if strict and not report.ok:
        raise CheckpointError(
            f"{source}: the tensors do not fit the spec ({spec.name or spec.family}):\n{report}"
        )
    if not report.ok:
        logger.warning("%s: loaded with strict=False:\n%s", checkpoint.source, report)
    not_loaded = {*report.missing, *report.mismatched_names}
    matched = [name for name in expected if name not in not_loaded]
    quantized = [name for name in matched if quantization and name in quantization.tensors]
    plain = [name for name in matched if name not in quantized]  # read as they are stored
    _check_dtypes(checkpoint, {name: state[name].dtype for name in plain}, dtype=dtype)
    check_allocation(model, spec, loaded=set(matched), file_elements=checkpoint.elements, source=source)
    if device.type == "meta":  # the structure only, as asked: every check above ran, nothing is read
        cast = dtype or checkpoint.floating_dtype()
        model = model.to(cast) if cast is not None else model
    elif report.missing or report.mismatched:
        # The tensors not loaded need values: build for real (initialised) and copy the rest in, one by one.
        model = build_model(spec, device=device, dtype=dtype or checkpoint.floating_dtype())
        targets = model.state_dict()
        with torch.no_grad():
            for name, tensor in _read_tensors(checkpoint, plain, device=device, dtype=dtype):
                targets[name].copy_(tensor)
    else:
        # Names and shapes were checked above; `assign` adopts the tensors just read, no second copy.
        model.load_state_dict(
            dict(_read_tensors(checkpoint, plain, device=device, dtype=dtype)),
            assign=True,
            strict=not quantized,  # the quantised weights are placed below
        )
        materialize_buffers(model, device)
    if quantization is not None and device.type != "meta":
        _place_quantized(model, checkpoint, quantized, device=device, dtype=dtype)
    if device.type != "meta":
        _retie(model, checkpoint.aliases, loaded=set(matched))
        model.reset_buffers()
        _check_placed(model, checkpoint.source)
    setattr(model, "name_or_path", os.fspath(path))  # noqa: B010 (what zoo.lora.save records as base_id)
    set_generation_file(model, generation)
    model.eval()
    return (model, report) if return_report else model


def read_spec(path: str | os.PathLike[str]) -> ModelSpec:
    """The spec of a checkpoint (directory, ``.safetensors`` file or index), reading headers only."""
    return open_checkpoint(path_argument(path, where="zoo.read_spec")).spec


def load_tokenizer(path: str | os.PathLike[str]) -> Tokenizer:
    """The ``tokenizer.json`` saved beside a checkpoint (``path``: the directory or a file in it)."""
    from zoo.io.tokenizer import Tokenizer

    path = Path(path).expanduser()
    if not path.exists():
        raise CheckpointNotFoundError(f"{path}: no such checkpoint (file or directory not found)")
    directory = path if path.is_dir() else path.parent
    file = directory / TOKENIZER_NAME
    if file != path:  # found beside the weights, not named by the user: it must not lead out of the folder
        inside(directory, TOKENIZER_NAME, error=CheckpointError)
    if not file.is_file():
        raise CheckpointNotFoundError(
            f"{directory}: no {TOKENIZER_NAME} in this checkpoint (save one with zoo.save(model, dir, tokenizer=...))"
        )
    try:
        return Tokenizer.from_file(file)
    except ValueError as error:
        raise CheckpointError(str(error)) from None


# -- helpers -------------------------------------------------------------------------------------------------


def _read_tensors(
    checkpoint: Checkpoint, names: list[str], *, device: torch.device, dtype: torch.dtype | None
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (name, tensor) on ``device``, floating point cast to ``dtype``, file by file: on the CPU in the
    stored dtype a view of the file's mapping (no copy), otherwise a copy made one tensor at a time whose
    source's pages are given back at once (`zoo.io.checkpoint.mapped`)."""
    by_file: dict[Path, list[str]] = {}
    for name in names:
        stored = checkpoint.aliases.get(name, name)
        by_file.setdefault(checkpoint.tensors[stored][0], []).append(name)
    source = MappedFiles(by_file)
    try:
        for file, file_names in by_file.items():
            try:
                read: dict[str, torch.Tensor] = {}
                for name in file_names:
                    stored = checkpoint.aliases.get(name, name)
                    if stored not in read:
                        tensor = source.get(file, stored)  # a view of the file's mapping: nothing copied
                        cast = dtype if dtype and tensor.is_floating_point() else tensor.dtype
                        read[stored] = tensor.to(device=device, dtype=cast)
                        if read[stored].data_ptr() != tensor.data_ptr():  # a copy: the source's pages go
                            source.release(tensor)
                    yield name, read[stored]
            except Exception as error:  # safetensors raises its own (Rust) error type for bad files
                if isinstance(error, CheckpointError):
                    raise
                raise CheckpointError(f"{file}: cannot read tensors: {error}") from None
    finally:
        source.close()


def _place_quantized(
    model: ZooModel,
    checkpoint: Checkpoint,
    names: list[str],
    *,
    device: torch.device,
    dtype: torch.dtype | None,
) -> None:
    """Read the parts of each quantised weight in ``names`` as stored, rebuild torchao's tensor in the
    model's dtype and make it the model's parameter (zoo.quant.state)."""
    assert checkpoint.quantization is not None
    record, owners = checkpoint.quantization, part_names(checkpoint.quantization)
    wanted = set(names)
    parts = [part for part, owner in owners.items() if owner in wanted]
    read = dict(_read_tensors(checkpoint, parts, device=device, dtype=None))  # bit for bit: never cast here
    compute = dtype or checkpoint.floating_dtype() or torch.float32
    try:
        weights = {name: assemble(record, name, read, dtype=compute) for name in names}
    except QuantizationError as error:
        raise CheckpointError(f"{checkpoint.source}: {error}") from None
    place(model, weights, record)


def _check_dtypes(
    checkpoint: Checkpoint, expected: dict[str, torch.dtype], *, dtype: torch.dtype | None
) -> None:
    """Refuse, before any tensor is read, a stored tensor of another kind than the model's (an integer where a
    float belongs), and with ``dtype=None`` floating-point tensors of more than one dtype."""
    main = dtype or checkpoint.floating_dtype() or torch.float32
    for name, want in expected.items():
        file, info = checkpoint.tensors[checkpoint.aliases.get(name, name)]
        if info.dtype.is_floating_point != want.is_floating_point or (
            not want.is_floating_point and info.dtype != want
        ):
            wanted = f"a floating-point tensor ({_name(main)})" if want.is_floating_point else _name(want)
            raise CheckpointError(
                f"{file}: {name} is stored as {_name(info.dtype)}; the model expects {wanted}"
            )
        if dtype is None and info.dtype.is_floating_point and info.dtype != main:
            raise CheckpointError(
                f"{file}: {name} is stored as {_name(info.dtype)} but the checkpoint's other floating-point "
                f"tensors are {_name(main)}; pass dtype= to load every tensor in one dtype"
            )


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def materialize_buffers(model: torch.nn.Module, device: torch.device) -> None:
    """Give the non-persistent buffers (still meta: not in the file) storage on ``device`` to recompute into.

    Also used by `zoo.from_hf`, which loads a meta-built model the same way.
    """
    for module in model.modules():
        for name, buffer in module._buffers.items():
            if buffer is not None and buffer.is_meta:
                module._buffers[name] = torch.empty_like(buffer, device=device)


def _retie(model: torch.nn.Module, aliases: dict[str, str], *, loaded: set[str]) -> None:
    """Make each loaded alias the very same Parameter/buffer as the tensor it was saved as (ties survive)."""
    for alias, kept in aliases.items():
        if alias not in loaded:
            continue
        owner, _, leaf = alias.rpartition(".")
        kept_owner, _, kept_leaf = kept.rpartition(".")
        setattr(model.get_submodule(owner), leaf, getattr(model.get_submodule(kept_owner), kept_leaf))


def _check_placed(model: torch.nn.Module, source: Path) -> None:
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        if tensor.is_meta:
            raise CheckpointError(
                f"{source}: {name} has no value after loading (a fixed table whose module lacks reset_buffers?)"
            )
