"""`load_base`: a base model for QLoRA with its projections stored NF4 as they are read, never whole in
its dense dtype.

    model = zoo.lora.load_base("runs/base", dtype=torch.bfloat16)         # every projection NF4 as read
    model = zoo.lora.apply(model, r=8, targets=["qkv", "out"], quantize_base="nf4")

`zoo.lora.apply(zoo.load(path), quantize_base="nf4")` quantises too, one matrix at a time, but only after
the dense model has been loaded whole: its peak is the dense model. `load_base` builds the model on the
meta device (`zoo.load` checks every file first, reading no tensor), then reads one tensor at a time, each
through its own memory map that is closed once the tensor is quantised: an attention or FFN projection
weight becomes NF4 (`Nf4Linear`, its fingerprint sample kept), every other tensor (embeddings, norms,
biases, the head) is assigned in the compute dtype. The peak is the NF4 model plus one dense matrix.

A Hugging Face folder is converted by `zoo.from_hf` first (dense, whole), then quantised matrix by matrix;
save it once as a zoo checkpoint (``zoo convert``) to load it without the dense peak.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from zoo.devices import default_device, resolve_device, resolve_dtype
from zoo.io.checkpoint import load as load_checkpoint
from zoo.io.checkpoint.discovery import Checkpoint, open_checkpoint
from zoo.io.checkpoint.loading import materialize_buffers
from zoo.io.names import CONFIG_NAME, SPEC_NAME
from zoo.lora import nf4
from zoo.lora.errors import LoraError
from zoo.lora.fingerprint import WeightSample, weight_sample
from zoo.lora.inject import quantize_projections, quantized_projections
from zoo.models import ZooModel
from zoo.spec import LoraSpec


def load_base(
    path: str | os.PathLike[str],
    *,
    quantize_base: str = "nf4",
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> ZooModel:
    """The model saved at ``path`` (a zoo checkpoint, or a Hugging Face folder: see the module docstring)
    with every attention and FFN projection stored NF4 (`Nf4Linear`) and everything else in ``dtype`` (as
    saved when None), in eval mode; ``device`` as `zoo.load` takes it. Give it to `zoo.lora.apply` with
    ``quantize_base="nf4"``."""
    if quantize_base not in nf4.KINDS:
        raise LoraError(f"zoo.lora.load_base: quantize_base must be 'nf4', got {quantize_base!r}")
    place = resolve_device(device) if device is not None else default_device()
    cast = resolve_dtype(dtype)
    folder = Path(path).expanduser()
    if folder.is_dir() and not (folder / SPEC_NAME).is_file() and (folder / CONFIG_NAME).is_file():
        from zoo.io.hf import from_hf

        model = from_hf(folder, device=place, dtype=cast)
        quantize_projections(model, quantized_projections(model, LoraSpec(quantize_base="nf4")))
        return model
    loaded = load_checkpoint(folder, device="meta", dtype=cast)  # every check; the structure only
    assert isinstance(loaded, ZooModel)  # return_report=False
    model = loaded
    checkpoint = open_checkpoint(folder)
    if checkpoint.quantization is not None:
        raise LoraError(
            f"{checkpoint.source}: holds {checkpoint.quantization.weights} weights (zoo.quant); load_base needs "
            "a floating-point checkpoint to store NF4"
        )
    projections = quantized_projections(model, LoraSpec(quantize_base="nf4"))
    pending: dict[str, tuple[torch.Tensor, WeightSample]] = {}
    for name in model.state_dict():
        if name in checkpoint.aliases:
            continue  # tied: set to the very tensor it was saved as, below
        tensor = _read(checkpoint, name, device=place, dtype=cast)
        module_path, _, leaf = name.rpartition(".")
        if module_path in projections and leaf == "weight":
            pending[module_path] = (nf4.quantize(tensor, name=name), weight_sample(tensor, name=name))
            del tensor  # its memory map closes with it
            continue
        owner = model.get_submodule(module_path)
        if leaf in owner._parameters:
            owner._parameters[leaf] = nn.Parameter(tensor, requires_grad=False)
        else:
            owner._buffers[leaf] = tensor
    for module_path, (weight, sample) in pending.items():
        parent_path, _, attr = module_path.rpartition(".")
        bias = model.get_submodule(module_path).bias
        assert bias is None or isinstance(bias, torch.Tensor)
        setattr(model.get_submodule(parent_path), attr, nf4.Nf4Linear(weight, bias, base_sample=sample))
    for alias, kept in checkpoint.aliases.items():
        owner_path, _, leaf = alias.rpartition(".")
        kept_owner, _, kept_leaf = kept.rpartition(".")
        setattr(model.get_submodule(owner_path), leaf, getattr(model.get_submodule(kept_owner), kept_leaf))
    materialize_buffers(model, place)
    model.reset_buffers()
    unplaced = [name for name, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if unplaced:
        raise LoraError(f"{checkpoint.source}: {unplaced[0]} has no value after loading")
    setattr(model, "name_or_path", os.fspath(path))  # noqa: B010 (what zoo.lora.save records as base_id)
    return model.eval()


def _read(
    checkpoint: Checkpoint, name: str, *, device: torch.device, dtype: torch.dtype | None
) -> torch.Tensor:
    """One stored tensor, through a memory map of its own (closed when the tensor is released), cast to
    ``dtype`` when floating point."""
    file = checkpoint.tensors[name][0]
    with safe_open(str(file), framework="pt", device=str(device)) as handle:
        tensor = handle.get_tensor(name)
    return tensor.to(dtype) if dtype is not None and tensor.is_floating_point() else tensor
