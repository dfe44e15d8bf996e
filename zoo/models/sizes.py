"""How big a model is: parameters, fixed buffer elements, and the parameters one token runs through.

`zoo.parameter_count(spec)` and `zoo.buffer_count(spec)` (`zoo.models.build`) count the model itself, built
on the meta device (no memory, no values), so a count is ``zoo.build(spec).num_parameters()`` by
construction — a tied or shared tensor counts once — and a new block or head is counted the day it is
built. That build is a sizing build (`zoo.stacks.sizing_build`): a stack builds each distinct layer once
and repeats the object, and `model_sizes` counts each repeated layer at every place it holds. A preset is
counted in milliseconds, a 10,000-layer spec too.

Buffers are the fixed tables built with the model (sinusoids, rotary angles, ALiBi slopes, BART's logits
bias). Per-call memory (activations, the KV cache) depends on the batch, not the spec: `zoo.analysis`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import nn

from zoo.blocks import MoEFeedForward
from zoo.stacks import Stack


@dataclass(frozen=True)
class ModelSizes:
    parameters: int  # distinct parameters (== model.num_parameters() of a full build)
    buffers: int  # elements of the fixed tables
    active: int  # parameters one token runs through: less the experts it is not routed to


def model_sizes(model: nn.Module) -> ModelSizes:
    """The sizes of ``model``, each layer a sizing build repeated counted at every place it holds."""
    parameters = _elements(model.parameters())
    buffers = _elements(model.buffers())
    idle = idle_expert_parameters(model)
    for layer, times in repeated_layers(model):  # each distinct layer counted once, then multiplied
        parameters += times * _elements(layer.parameters())
        buffers += times * _elements(layer.buffers())
        idle += times * idle_expert_parameters(layer)
    return ModelSizes(parameters=parameters, buffers=buffers, active=parameters - idle)


def repeated_layers(model: nn.Module) -> list[tuple[nn.Module, int]]:
    """(layer, how many places past its first it holds) for each stack layer object found at several places:
    none in a model that runs (every layer its own object, ALBERT's shared one stored once); a sizing
    build's repeats."""
    repeats: dict[int, tuple[nn.Module, int]] = {}
    for stack in model.modules():
        if isinstance(stack, Stack):
            places = Counter(id(layer) for layer in stack.layers)
            for layer in stack.layers:
                if places[id(layer)] > 1:
                    repeats[id(layer)] = (layer, places[id(layer)] - 1)
    return list(repeats.values())


def idle_expert_parameters(model: nn.Module) -> int:
    """Parameters of the routed experts one token does not run through: ``num_experts - top_k`` of each
    Mixture-of-Experts layer's experts (their adapters included); 0 for a dense model."""
    return sum(
        _elements(module.experts.parameters()) * (module.num_experts - module.top_k) // module.num_experts
        for module in model.modules()
        if isinstance(module, MoEFeedForward)
    )


def _elements(tensors: Iterable[torch.Tensor]) -> int:
    return sum(tensor.numel() for tensor in tensors)
