"""`TrainerState`: where a training run stands, as one value.

The loop hands a fresh snapshot to every callback hook and to `CheckpointIO` for each checkpoint. Its
progress fields (step, data position, elapsed time, RNG streams) are what a checkpoint saves and a resume
restores; the rest is context for callbacks (the step count to reach, the last step's lr and gradient
norm, the output directory, the parameter counts and LoRA spec), known from the config, the model and the
last step and never saved. Nothing here refers
to a trainer: a state can be made, saved and compared on its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from zoo.spec import LoraSpec

PROGRESS_FIELDS = ("step", "epoch", "position", "elapsed_s")  # trainer_state.json, besides provenance


@dataclass(frozen=True)
class TrainerState:
    # progress: saved in a checkpoint, restored on resume
    step: int = 0  # optimizer steps done
    epoch: int = 0  # the epoch the data position is in
    position: int = 0  # batches of that epoch already taken, over all processes
    elapsed_s: float = 0.0  # training time, the interrupted parts of a resumed run included
    rng: dict[str, torch.Tensor] | None = field(default=None, repr=False, compare=False)  # this process's
    # context for callbacks: not saved
    total_steps: int = 0  # the step training stops at
    steps_per_epoch: int = 0
    lr: float | None = None  # the learning rate of the last step
    grad_norm: float | None = None  # the last step's global gradient norm, before clipping
    output_dir: Path | None = None
    trainable_parameters: int = 0  # parameter elements the optimizer updates (a LoRA run: the adapters')
    total_parameters: int = 0  # every parameter element of the model being trained, adapters included
    lora: LoraSpec | None = None  # the run's adapters (the config's ``lora``), None for a full fine-tune

    def progress(self) -> dict[str, Any]:
        """The progress fields as JSON values (``trainer_state.json``); the RNG goes to its own file."""
        return {name: getattr(self, name) for name in PROGRESS_FIELDS}

    @classmethod
    def from_progress(cls, saved: dict[str, Any], **context: Any) -> TrainerState:
        """A state from `progress` (extra keys such as provenance are ignored) plus ``rng`` and context."""
        return cls(
            step=int(saved["step"]),
            epoch=int(saved["epoch"]),
            position=int(saved["position"]),
            elapsed_s=float(saved["elapsed_s"]),
            **context,
        )


def rng_state(device: torch.device) -> dict[str, torch.Tensor]:
    """This process's RNG streams: the CPU generator's, and the device's on CUDA."""
    states = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        states["cuda"] = torch.cuda.get_rng_state(device)
    return states


def set_rng_state(states: dict[str, torch.Tensor], device: torch.device) -> None:
    torch.set_rng_state(states["cpu"])
    if device.type == "cuda" and "cuda" in states:
        torch.cuda.set_rng_state(states["cuda"], device)
