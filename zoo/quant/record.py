"""What a quantised model carries (``model.quantization``) and its checkpoint records in the metadata.

    {"weights": "int8", "group_size": null, "library": "torchao", "version": "0.18.0",
     "tensors": ["decoder.layers.0.ffn.down_proj.weight", ...]}

``weights`` names the scheme (`zoo.quant.schemes`), ``group_size`` its group (None: one scale per output
row), ``library`` and ``version`` what quantised it, ``tensors`` the weights it replaced. The record is
plain data: it is checked when read from a file as strictly as the tensors it describes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal, cast

__all__ = ["WEIGHTS", "Quantization", "Weights", "quantization_of", "set_quantization"]

Weights = Literal["int8", "int4"]
WEIGHTS: tuple[Weights, ...] = ("int8", "int4")


@dataclass(frozen=True)
class Quantization:
    """How a model's weights were quantised: ``model.quantization`` after `zoo.quant.quantize` or a load."""

    weights: Weights
    group_size: int | None
    tensors: tuple[str, ...]  # the quantised weights, by state-dict name
    library: str = "torchao"
    version: str = "unknown"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"tensors": list(self.tensors)}

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    def describe(self) -> str:
        """``int8 weight-only (per output row), 48 tensors, torchao 0.18.0``: for people."""
        group = f"groups of {self.group_size}" if self.group_size else "per output row"
        return f"{self.weights} weight-only ({group}), {len(self.tensors)} tensors, {self.library} {self.version}"

    @classmethod
    def parse(cls, raw: Any, *, where: str, error: type[ValueError] = ValueError) -> Quantization:
        """The record in a file's metadata (a JSON string, or the object an index holds); ``error``
        (naming ``where``) for anything that is not a record this zoo can read."""
        try:
            data = json.loads(raw) if isinstance(raw, str) else raw
        except json.JSONDecodeError as problem:
            raise error(
                f"{where}: corrupted metadata: 'quantization' is not valid JSON ({problem})"
            ) from None
        if not isinstance(data, Mapping):
            raise error(f"{where}: corrupted metadata: 'quantization' must be a JSON object")
        weights, group_size, tensors = data.get("weights"), data.get("group_size"), data.get("tensors")
        if weights not in WEIGHTS:
            raise error(
                f"{where}: quantization.weights is {weights!r}; this zoo reads {' or '.join(WEIGHTS)} "
                "(a newer zoo wrote it?)"
            )
        if group_size is not None and (not isinstance(group_size, int) or isinstance(group_size, bool)):
            raise error(f"{where}: corrupted metadata: quantization.group_size must be an int or null")
        if not isinstance(tensors, list) or not all(isinstance(name, str) for name in tensors) or not tensors:
            raise error(f"{where}: corrupted metadata: quantization.tensors must be a list of tensor names")
        if len(set(tensors)) != len(tensors):
            raise error(f"{where}: corrupted metadata: quantization.tensors names a tensor twice")
        library, version = data.get("library", "torchao"), data.get("version", "unknown")
        if not isinstance(library, str) or not isinstance(version, str):
            raise error(f"{where}: corrupted metadata: quantization.library and .version must be strings")
        return cls(cast(Weights, weights), group_size, tuple(tensors), library, version)


def quantization_of(model: object) -> Quantization | None:
    """``model.quantization``: how its weights were quantised, or None for a floating-point model."""
    record = getattr(model, "quantization", None)
    return record if isinstance(record, Quantization) else None


def set_quantization(model: object, record: Quantization) -> None:
    """Record ``record`` on ``model`` (a plain attribute: it travels with ``copy.deepcopy`` and ``.to()``)."""
    object.__setattr__(model, "quantization", record)
