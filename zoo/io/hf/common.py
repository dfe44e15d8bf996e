"""The shape of a Hugging Face family mapping: config <-> spec, and tensor names both ways.

One `FamilyMapping` per family module (``gpt2.py``, ``bert.py``, ``t5.py``, ...): declarative name maps plus
the explicit list of tensors that are transposed, fused or split. Nothing outside `zoo.io.hf` knows about
Hugging Face names.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from zoo.spec import ModelSpec

StateDict = dict[str, torch.Tensor]


@dataclass(frozen=True)
class FamilyMapping:
    """How one Hugging Face family maps onto zoo.

    config_to_spec(config, tensor_names): the HF ``config.json`` dict and the checkpoint's tensor names (to
        tell e.g. a headless ``BertModel`` from ``BertForMaskedLM``) -> a zoo `ModelSpec`.
    spec_to_config(spec): a zoo spec -> an HF ``config.json`` dict (with ``model_type`` and ``architectures``).
    hf_to_zoo(tensors, spec): HF state dict -> zoo state dict (every zoo tensor, tied ones once).
    zoo_to_hf(tensors, spec): zoo state dict -> HF state dict that ``from_pretrained`` loads with no missing
        or unexpected keys.
    """

    model_types: tuple[str, ...]
    config_to_spec: Callable[[dict[str, Any], set[str]], ModelSpec]
    spec_to_config: Callable[[ModelSpec], dict[str, Any]]
    hf_to_zoo: Callable[[StateDict, ModelSpec], StateDict]
    zoo_to_hf: Callable[[StateDict, ModelSpec], StateDict]
