"""What two checkpoints' weights differ in, tensor by tensor (`zoo diff --weights`).

    d = zoo.analysis.diff_weights("runs/a/final", "runs/b/final")   # zoo checkpoints or Hugging Face folders
    d.compared, d.same, [(t.name, t.what, t.max_abs_diff) for t in d.tensors]

Each side is read as zoo names it (a Hugging Face folder through `zoo.from_hf`), on the CPU; the values are
compared exactly, and the largest absolute difference of a differing tensor is measured in float32. A preset
or a spec file holds no weights: a `WeightsError`. Imports torch only when it runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from zoo.io.names import CONFIG_NAME, SPEC_NAME

if TYPE_CHECKING:
    import os

    import torch


class WeightsError(ValueError):
    """A side of a weights comparison that holds no weights (a preset, a spec file, a missing path)."""


@dataclass(frozen=True)
class TensorDiff:
    """One tensor that is not the same on both sides."""

    name: str  # the state-dict name (zoo's, for a Hugging Face folder too)
    what: Literal["values", "shape", "dtype", "only in a", "only in b"]
    a: str | None  # "float32 (64, 64)"; None: a lacks it
    b: str | None
    max_abs_diff: float | None  # values and dtype: the largest |a - b|, in float32; else None


@dataclass(frozen=True)
class WeightsDiff:
    compared: int  # tensors present on both sides with the same shape
    tensors: list[TensorDiff]  # in a's order, then b's extra tensors

    @property
    def same(self) -> bool:
        return not self.tensors


def load_target_weights(target: str | os.PathLike[str]) -> dict[str, torch.Tensor]:
    """The state dict of a zoo checkpoint (folder or ``.safetensors`` file) or a Hugging Face folder, on the
    CPU, in zoo's names."""
    import zoo

    path = Path(target).expanduser()
    if not path.exists():
        raise WeightsError(
            f"{target}: no such checkpoint; weights are compared between zoo checkpoints or Hugging Face "
            "folders (a preset or a spec file holds no weights)"
        )
    if path.is_file() and path.suffix != ".safetensors":
        raise WeightsError(
            f"{target}: a spec file holds no weights; give a zoo checkpoint or Hugging Face folder"
        )
    if path.is_dir() and (path / CONFIG_NAME).is_file() and not (path / SPEC_NAME).is_file():
        model = zoo.from_hf(path, device="cpu")
    else:
        model = zoo.load(path, device="cpu")
    return model.state_dict()


def diff_weights(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> WeightsDiff:
    """Every tensor of ``a`` and ``b`` (zoo checkpoints or Hugging Face folders) that differs."""
    import torch

    weights_a, weights_b = load_target_weights(a), load_target_weights(b)
    rows: list[TensorDiff] = []
    compared = 0
    for name, x in weights_a.items():
        y = weights_b.get(name)
        if y is None:
            rows.append(TensorDiff(name, "only in a", _describe(x), None, None))
            continue
        if x.shape != y.shape:
            rows.append(TensorDiff(name, "shape", _describe(x), _describe(y), None))
            continue
        compared += 1
        if x.dtype == y.dtype and torch.equal(x, y):
            continue
        gap = (x.float() - y.float()).abs()  # NaN where either side is NaN: a difference, shown as nan
        largest = float(gap.max()) if gap.numel() else 0.0
        what: Literal["values", "dtype"] = "dtype" if x.dtype != y.dtype else "values"
        rows.append(TensorDiff(name, what, _describe(x), _describe(y), largest))
    rows += [
        TensorDiff(name, "only in b", None, _describe(y), None)
        for name, y in weights_b.items()
        if name not in weights_a
    ]
    return WeightsDiff(compared=compared, tensors=rows)


def _describe(tensor: torch.Tensor) -> str:
    return f"{str(tensor.dtype).removeprefix('torch.')} {tuple(tensor.shape)}"
