"""`to_peft`: a model's adapters in PEFT's format, for the Hugging Face export of its base (`zoo.to_hf`).

    zoo.to_hf(base, "hf_base/")                       # before apply (or after merge_and_unload of a copy)
    zoo.lora.to_peft(adapted, "hf_adapter/")          # adapter_config.json + adapter_model.safetensors
    PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained("hf_base/"), "hf_adapter/")

No table per family: the family's own export converter (`FamilyMapping.zoo_to_hf`) is probed. It only moves
entries around (renames, q/k/v splits, GPT-2's Conv1D transposes, Marian's permuted residual stream), so it
is run once on a float64 state dict in which every targeted weight holds its own index codes

    code = offset(tensor) + i * columns + j + 1        (0 everywhere else)

and each exported tensor's codes say which zoo weight, which rows and which columns it was cut from, and
whether it is transposed. A pure selection ``W_hf = W[rows][:, cols]`` maps the adapter exactly:

    B_hf = B[rows]   (O_hf, r)       A_hf = A[:, cols]   (r, I_hf)       magnitude_hf = m[rows]   (DoRA)

so a fused qkv adapter becomes q, k and v adapters that share a copy of A (B A restricted to those rows is
exactly the fused update's rows). A converter that scales, mixes or drops a targeted weight is refused.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from zoo.io.atomic import write_atomic, write_text_atomic
from zoo.io.hf import _export_config
from zoo.io.names import PEFT_CONFIG_NAME, PEFT_WEIGHTS_NAME
from zoo.io.outputs import PEFT_ADAPTERS, check_output_dir
from zoo.lora.errors import LoraError
from zoo.lora.experts import LoraStackedLinear
from zoo.lora.inject import Adapter, adapter_modules
from zoo.models import build_model
from zoo.spec import LoraSpec

CONFIG_NAME = PEFT_CONFIG_NAME  # adapter_config.json
WEIGHTS_NAME = PEFT_WEIGHTS_NAME  # adapter_model.safetensors
_PREFIX = "base_model.model."  # PeftModel -> LoraModel -> the transformers model
Convert = Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]]  # zoo state dict -> HF state dict


@dataclass(frozen=True)
class Selection:
    """One exported weight cut from a zoo weight: ``hf[a, b] = zoo[rows[a], cols[b]]`` (transposed:
    ``hf[a, b] = zoo[rows[b], cols[a]]``, GPT-2's Conv1D stores (in, out))."""

    zoo: str  # the zoo module path (its ``.weight``)
    rows: torch.Tensor  # (O_hf,) zoo output rows
    cols: torch.Tensor  # (I_hf,) zoo input columns
    transposed: bool


def to_peft(
    model: torch.nn.Module,
    out_dir: str | os.PathLike[str],
    *,
    base_model_name_or_path: str | None = None,
    model_type: str | None = None,
    overwrite: bool = False,
) -> Path:
    """Write ``model``'s adapters as PEFT's ``adapter_config.json`` + ``adapter_model.safetensors`` in
    ``out_dir`` (each file atomically); returns the folder. A folder that holds other files (a model, a
    training run) is refused unless ``overwrite`` (`zoo.io.outputs`); earlier adapters there are replaced.

    The names are those of the model `zoo.to_hf` writes for this spec (``model_type`` picks the family as
    there), so ``peft.PeftModel.from_pretrained(<that transformers model>, out_dir)`` gives this model's
    outputs. ``base_model_name_or_path`` is recorded in the config for tools that fetch the base.
    """
    check_output_dir(out_dir, PEFT_ADAPTERS, writer="zoo.lora.to_peft", overwrite=overwrite)
    modules, spec, base_spec = _exportable_adapters(model)
    mapping, config = _export_config(base_spec, model_type)
    shapes = {path: (module.out_features, module.in_features) for path, module in modules.items()}
    selections = probe(lambda state: mapping.zoo_to_hf(state, base_spec), base_spec, shapes)
    transposed = {s.transposed for s in selections.values()}
    if len(transposed) > 1:
        raise LoraError(
            "zoo.lora.to_peft: some exported projections are transposed (Conv1D) and some are not; PEFT's "
            "fan_in_fan_out is one flag for all: target only one kind"
        )
    tensors = _adapter_tensors(modules, selections)
    adapter_config = {
        **_adapter_config(spec, targets=sorted(selections), fan_in_fan_out=transposed == {True}),
        "task_type": _task_type(config),
        "base_model_name_or_path": base_model_name_or_path,
    }
    out = Path(out_dir).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / WEIGHTS_NAME, lambda temp: save_file(tensors, str(temp), metadata={"format": "pt"}))
    write_text_atomic(out / CONFIG_NAME, json.dumps(adapter_config, indent=2, sort_keys=True) + "\n")
    return out


def _exportable_adapters(model: torch.nn.Module) -> tuple[dict[str, Adapter], LoraSpec, Any]:
    """(adapted module path -> its adapter layer, the LoRA spec, the base model's spec) of a model whose
    adapters PEFT can hold: present, unmerged, on plain linears (not stacked experts), on a zoo model."""
    modules = adapter_modules(model)
    spec = getattr(model, "lora_spec", None)
    if not modules or spec is None:
        raise LoraError("zoo.lora.to_peft: the model has no LoRA adapters (add them with zoo.lora.apply)")
    merged = [name for name, module in modules.items() if module.merged]
    if merged:
        raise LoraError(f"zoo.lora.to_peft: {merged[0]} is merged; unmerge first (zoo.lora.unmerge)")
    base_spec = getattr(model, "spec", None)
    if base_spec is None:
        raise LoraError(f"zoo.lora.to_peft needs a zoo model (with a .spec), got {type(model).__name__}")
    experts = [name for name, module in modules.items() if isinstance(module, LoraStackedLinear)]
    if experts:
        raise LoraError(
            f"zoo.lora.to_peft: {experts[0]} adapts Mixture-of-Experts experts, one adapter per expert of a "
            "stacked weight, which PEFT's LoRA layers do not hold; merge them (zoo.lora.merge_and_unload) "
            "and export the model with zoo.to_hf"
        )
    return modules, spec, base_spec


def _adapter_tensors(
    modules: dict[str, Adapter], selections: dict[str, Selection]
) -> dict[str, torch.Tensor]:
    """PEFT's tensors, on the CPU: each exported module's A (r, I_hf) and B (O_hf, r) (and DoRA's magnitude
    (O_hf,)), the rows and columns of the zoo adapter that land in it."""
    tensors: dict[str, torch.Tensor] = {}
    for hf_module, selection in selections.items():
        module = modules[selection.zoo]
        rows, cols = selection.rows.to(module.lora_B.device), selection.cols.to(module.lora_A.device)
        key = f"{_PREFIX}{hf_module}"
        tensors[f"{key}.lora_A.weight"] = module.lora_A.detach()[:, cols]  # (r, I_hf)
        tensors[f"{key}.lora_B.weight"] = module.lora_B.detach()[rows]  # (O_hf, r)
        if module.lora_magnitude is not None:
            tensors[f"{key}.lora_magnitude_vector"] = module.lora_magnitude.detach()[rows]  # (O_hf,)
    return {name: t.to("cpu").contiguous() for name, t in tensors.items()}


def _adapter_config(spec: LoraSpec, *, targets: list[str], fan_in_fan_out: bool) -> dict[str, Any]:
    """PEFT's ``adapter_config.json`` for ``spec`` (a `LoraSpec`) on ``targets``, the full module paths:
    exactly these, no suffix matching surprises (the caller adds task_type and base_model_name_or_path)."""
    return {
        "peft_type": "LORA",
        "revision": None,
        "inference_mode": True,
        "r": spec.r,
        "lora_alpha": int(spec.alpha) if float(spec.alpha).is_integer() else spec.alpha,
        "lora_dropout": spec.dropout,
        "target_modules": targets,
        "fan_in_fan_out": fan_in_fan_out,
        "bias": "none",
        "use_dora": spec.dora,
        "use_rslora": False,
        "init_lora_weights": True,
        "modules_to_save": None,
        "layers_to_transform": None,
        "layers_pattern": None,
        "rank_pattern": {},
        "alpha_pattern": {},
        "lora_bias": False,
    }


def probe(convert: Convert, spec: Any, targeted: dict[str, tuple[int, int]]) -> dict[str, Selection]:
    """Where each ``targeted`` zoo linear (module path -> (out, in)) lands in ``convert(state)``: the
    exported module path -> its `Selection`. Refuses an exported weight that is not a pure selection of one
    targeted weight, and a targeted weight the export drops."""
    meta = build_model(spec, device="meta", init=False).state_dict()
    offsets: dict[str, int] = {}
    state: dict[str, torch.Tensor] = {}
    total = 0
    for name, tensor in meta.items():
        module = name.removesuffix(".weight")
        if name.endswith(".weight") and module in targeted:
            out_features, in_features = targeted[module]
            codes = torch.arange(total + 1, total + 1 + out_features * in_features, dtype=torch.float64)
            state[name] = codes.view(out_features, in_features)  # (O, I): unique, exact in float64
            offsets[module] = total
            total += out_features * in_features
        else:  # untouched by the adapters: zeros that cost no memory until the converter copies them
            state[name] = torch.zeros((), dtype=tensor.dtype).expand(tensor.shape)
    missing = sorted(set(targeted) - set(offsets))
    if missing:
        raise LoraError(f"zoo.lora.to_peft: the model spec has no weight for {', '.join(missing)}")
    if total >= 2**53:
        raise LoraError("zoo.lora.to_peft: too many targeted weights to probe exactly in float64")
    starts = torch.tensor(sorted(offsets.values()), dtype=torch.long)  # (M,)
    by_start = {offset: module for module, offset in offsets.items()}
    selections: dict[str, Selection] = {}
    for hf_name, tensor in convert(state).items():
        if not tensor.is_floating_point() or tensor.dtype != torch.float64 or not bool((tensor != 0).any()):
            continue  # not cut from a targeted weight
        selections[_module_of(hf_name)] = _selection(hf_name, tensor, starts, by_start, targeted)
    dropped = sorted(set(targeted) - {s.zoo for s in selections.values()})
    if dropped:
        raise LoraError(f"zoo.lora.to_peft: the Hugging Face export drops {', '.join(dropped)}")
    return selections


def _selection(
    hf_name: str,
    tensor: torch.Tensor,
    starts: torch.Tensor,
    by_start: dict[int, str],
    targeted: dict[str, tuple[int, int]],
) -> Selection:
    def refuse(why: str) -> LoraError:
        return LoraError(f"zoo.lora.to_peft: the export's {hf_name} {why}; PEFT cannot express its adapter")

    codes = tensor.long()
    if tensor.dim() != 2 or not hf_name.endswith(".weight"):
        raise refuse(f"({list(tensor.shape)}) is not a linear weight but holds a targeted weight's entries")
    if not torch.equal(codes.double(), tensor) or bool((codes <= 0).any()):
        raise refuse("is not a pure selection of a targeted weight's entries (scaled, mixed or padded)")
    index = torch.searchsorted(starts, (codes - 1).contiguous(), right=True) - 1  # the zoo weight, per entry
    if bool((index != index[0, 0]).any()):
        raise refuse("mixes entries of several zoo weights")
    start = int(starts[index[0, 0]])
    zoo = by_start[start]
    in_features = targeted[zoo][1]
    local = codes - 1 - start
    i, j = local // in_features, local % in_features  # zoo row and column of each entry
    if bool((i == i[:, :1]).all()) and bool((j == j[:1, :]).all()):
        return Selection(zoo, rows=i[:, 0], cols=j[0, :], transposed=False)
    if bool((i == i[:1, :]).all()) and bool((j == j[:, :1]).all()):
        return Selection(zoo, rows=i[0, :], cols=j[:, 0], transposed=True)
    raise refuse(f"is not rows x columns of {zoo}.weight (a reshuffle PEFT's A and B cannot follow)")


def _module_of(hf_name: str) -> str:
    return hf_name.removesuffix(".weight")


def _task_type(config: dict[str, Any]) -> str | None:
    """PEFT's task type for the exported head class: CAUSAL_LM, SEQ_2_SEQ_LM, or None (plain PeftModel)."""
    architecture = (config.get("architectures") or [""])[0]
    if architecture.endswith(("ForCausalLM", "LMHeadModel")):
        return "CAUSAL_LM"
    if architecture.endswith(("ForConditionalGeneration", "MTModel")):
        return "SEQ_2_SEQ_LM"
    return None
