"""LoRA and DoRA adapters for zoo models, injected from outside the blocks.

    model = zoo.lora.apply(zoo.load("runs/base"), r=8, alpha=16, targets=["qkv", "out"])  # base frozen
    ...train...                                                 # only lora_A / lora_B (/ magnitude) learn
    zoo.lora.save(model, "runs/adapter.safetensors")            # the adapters only, with the base's id and spec
    model = zoo.lora.load(zoo.load("runs/base"), "runs/adapter.safetensors")   # a different base is refused
    zoo.lora.merge(model); zoo.lora.unmerge(model)               # fold in and out, in place
    with zoo.lora.disabled(model): base_logits = model(ids).logits   # the base alone, no weight copied
    plain = zoo.lora.merge_and_unload(model)                     # an ordinary zoo model: zoo.save, zoo.to_hf
    zoo.lora.to_peft(model, "peft_adapter/")                     # adapter_config.json + adapter_model.safetensors
    model = zoo.lora.apply(zoo.lora.load_base("runs/base"), r=8, quantize_base="nf4")   # QLoRA: an NF4 base

The modules, along the flow:

    layer.py    `LoraLinear`: a frozen linear plus its adapter; LoRA and DoRA forward, merge, unmerge
    inject.py   target resolution, `apply`, `merge`, `unmerge`, `merge_and_unload`, `disabled`,
                `trainable_parameters`
    files.py    `save`, `load`, `read_adapter`: adapter-only safetensors with the base's spec and fingerprint
    peft.py     `to_peft`: the adapters in PEFT's format, for any model `zoo.to_hf` exports
    nf4.py      QLoRA's frozen NF4 storage (torchao): `quantize`, `Nf4Linear` for unadapted projections
    base.py     `load_base`: a checkpoint read tensor by tensor into an NF4 base, never whole and dense
    fingerprint.py  `base_fingerprint`: which base an adapter file was trained on

Docs: docs/lora.md.
"""

from __future__ import annotations

from zoo.lora.base import load_base
from zoo.lora.errors import LoraError
from zoo.lora.files import AdapterInfo, base_fingerprint, load, read_adapter, save
from zoo.lora.fingerprint import WeightSample
from zoo.lora.inject import (
    adapter_modules,
    adapter_state,
    apply,
    base_weights,
    disabled,
    merge,
    merge_and_unload,
    nf4_modules,
    resolve_targets,
    trainable_parameters,
    unmerge,
)
from zoo.lora.layer import LoraLinear
from zoo.lora.nf4 import Nf4Linear
from zoo.lora.peft import to_peft
from zoo.spec import LoraSpec

__all__ = [
    "AdapterInfo",
    "LoraError",
    "LoraLinear",
    "LoraSpec",
    "Nf4Linear",
    "WeightSample",
    "adapter_modules",
    "adapter_state",
    "apply",
    "base_fingerprint",
    "base_weights",
    "disabled",
    "load",
    "load_base",
    "merge",
    "merge_and_unload",
    "nf4_modules",
    "read_adapter",
    "resolve_targets",
    "save",
    "to_peft",
    "trainable_parameters",
    "unmerge",
]
