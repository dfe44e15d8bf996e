"""The frozen reference of the objectives that hold the policy near where it started (dpo, kto, grpo): the
weights the run started from, never trained.

    with adapters       (the config's ``lora``) the trained model itself, run with them disabled
                        (`zoo.lora.disabled`): no weight copied
    without             a frozen copy of ``model.init_from`` (or of the seed's initialisation), built once at
                        setup and kept in eval mode: it doubles the weights' memory, as TRL's does
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext

from torch import nn

import zoo.lora


def frozen(model: nn.Module) -> nn.Module:
    """``model`` in eval mode with no parameter requiring a gradient."""
    for p in model.parameters():
        p.requires_grad_(False)
    return model.eval()


def frozen_reference(model: nn.Module, starting_model: Callable[[], nn.Module]) -> tuple[nn.Module, bool]:
    """The reference for the trained ``model`` and whether it is ``model`` itself, to run with its LoRA
    adapters disabled (the base is the trained model without them: ``(model, True)``), else a frozen copy
    of the starting weights, ``starting_model()`` (``(copy, False)``)."""
    if zoo.lora.adapter_modules(model):
        return model, True
    return frozen(starting_model()), False


@contextmanager
def reference_mode(model: nn.Module, *, adapters: bool) -> Iterator[nn.Module]:
    """Run ``model`` as the reference: in eval mode (no dropout) and, with ``adapters``, its LoRA adapters
    disabled; its training mode restored after (the policy may be the same model)."""
    was_training = model.training
    model.eval()
    try:
        with zoo.lora.disabled(model) if adapters else nullcontext():
            yield model
    finally:
        model.train(was_training)
