"""Mixed precision: the autocast a run trains under, and float16's dynamic loss scaling.

    fp32   no autocast
    bf16   autocast to bfloat16; weights, gradients and Adam stay float32. bfloat16 has float32's exponent
           range, so gradients neither overflow nor underflow where float32's would not: no loss scaling
    fp16   autocast to float16 with dynamic loss scaling (Micikevicius et al. 2018, `torch.amp.GradScaler`):
           float16 ends at 65504 and flushes gradients below ~6e-8 to zero, so the loss is multiplied by a
           scale S (2^16 to start) before backward, and the gradients divided by S again before clipping.
           A step whose gradients overflowed (an inf or NaN) is skipped — weights and Adam moments untouched —
           and S halved; after 2000 steps in a row without overflow S doubles
    auto   bf16 on a CUDA device that supports it, fp32 everywhere else

One optimizer step under loss scaling, accumulated micro-batches and clipping included:

    for each micro-batch:  scale(loss).backward()        gradients sum, scaled by S
    unscale(optimizer)                                    gradients / S, inf/NaN noted (no host sync)
    clip_gradients(...)                                   the clip sees the true gradient norm
    step(optimizer, grad_norm)                            skipped on overflow; S halved or kept or doubled

The scale and its growth counter are part of a checkpoint (`state_dict`: JSON numbers), so a resumed run
scales its loss exactly as the interrupted one would have.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any, Literal

import torch

Precision = Literal["fp32", "bf16", "fp16"]
PrecisionSetting = Literal["auto", "fp32", "bf16", "fp16"]
_AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
# GradScaler.state_dict()'s keys, all plain numbers: what a checkpoint's ``grad_scaler`` entry holds.
SCALER_STATE_KEYS = ("scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker")


def resolve_precision(setting: PrecisionSetting, device: torch.device) -> Precision:
    """The precision ``setting`` means on ``device`` (``auto``: bf16 on CUDA when supported, else fp32)."""
    if setting != "auto":
        return setting
    bf16_ok = device.type == "cuda" and torch.cuda.is_bf16_supported()
    return "bf16" if bf16_ok else "fp32"


def autocast(precision: Precision, device: torch.device) -> AbstractContextManager:
    """The autocast context of ``precision`` on ``device`` (none for fp32)."""
    if precision == "fp32":
        return nullcontext()
    return torch.autocast(device_type=device.type, dtype=_AUTOCAST_DTYPES[precision])


class LossScaling:
    """fp16's dynamic loss scale around one optimizer; with any other precision every method passes through.

    Skipped steps are counted on the device (no host sync per step) and read with the scale by `measure`,
    which the loop calls once per record.
    """

    def __init__(self, precision: Precision, device: torch.device) -> None:
        self.enabled = precision == "fp16"
        self.scaler = torch.amp.GradScaler(device.type, enabled=self.enabled)
        self._skipped = torch.zeros((), dtype=torch.int64, device=device)  # since the last `measure`

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        """``loss`` times the current scale (``loss`` itself when not scaling)."""
        return self.scaler.scale(loss) if self.enabled else loss

    def unscale(self, optimizer: torch.optim.Optimizer) -> None:
        """Divide the accumulated gradients by the scale, in place; call once per step, before clipping."""
        self.scaler.unscale_(optimizer)

    def step(self, optimizer: torch.optim.Optimizer, grad_norm: torch.Tensor) -> None:
        """The optimizer step, unless the (unscaled) gradients overflowed; then the scale's update.

        ``grad_norm`` is the global norm of the unscaled gradients (`clip_gradients`' return value): it is
        not finite exactly when some gradient holds an inf or NaN, which is when GradScaler skips the step.
        (Finite gradients whose squares overflow float32, beyond ~1e19, would be counted too; the scaler
        steps on them. A run with such gradients has diverged anyway.) Under FSDP the norm is already the
        global one, so every process counts the same steps.
        """
        if not self.enabled:
            optimizer.step()
            return
        self.scaler.step(optimizer)
        self._skipped += (~torch.isfinite(grad_norm)).to(self._skipped.device)
        self.scaler.update()

    @property
    def loss_scale(self) -> float | None:
        """The current scale (a host sync), None when not scaling."""
        return self.scaler.get_scale() if self.enabled else None

    def measure(self) -> dict[str, Any]:
        """``loss_scale`` now and ``skipped_steps`` since the last call, for a training record ({} when not
        scaling)."""
        if not self.enabled:
            return {}
        skipped = int(self._skipped)
        self._skipped.zero_()
        return {"loss_scale": self.scaler.get_scale(), "skipped_steps": skipped}

    def state_dict(self) -> dict[str, float | int] | None:
        """The scaler's state as JSON numbers (scale, growth counter, factors), None when not scaling."""
        if not self.enabled:
            return None
        return {key: self.scaler.state_dict()[key] for key in SCALER_STATE_KEYS}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a `state_dict`; the next step scales by the saved scale."""
        if self.enabled:
            self.scaler.load_state_dict({key: state[key] for key in SCALER_STATE_KEYS})


def scaler_state_problem(state: Any) -> str | None:
    """Why ``state`` (a checkpoint's ``grad_scaler`` entry) is not a scaler state, or None when it is."""
    if not isinstance(state, dict):
        return f"grad_scaler is {type(state).__name__}, not a mapping"
    bad = [
        key
        for key in SCALER_STATE_KEYS
        if not isinstance(state.get(key), int | float) or isinstance(state.get(key), bool)
    ]
    if bad:
        return f"grad_scaler: no valid {', '.join(bad)}"
    if not state["scale"] > 0:
        return f"grad_scaler: scale ({state['scale']}) must be positive"
    return None
