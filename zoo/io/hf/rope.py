"""Rotary settings in a Hugging Face ``config.json``, both ways: ``rope_theta`` and the frequency scaling.

transformers 4.x writes ``rope_theta`` beside a ``rope_scaling`` dict (null for plain RoPE); transformers 5
writes one ``rope_parameters`` dict holding ``rope_type``, ``rope_theta`` and the scaling fields, and still
reads ``rope_scaling`` first when a config has both (``RotaryEmbeddingConfigMixin``). `rope_from_config`
reads either; `rope_to_config` writes both, so either version loads the export.

    zoo RotaryPositions.scaling          transformers rope_type   its fields
    None                                 default                  rope_theta
    {type: llama3, ...}                  llama3                   factor, low_freq_factor, high_freq_factor,
                                                                  original_max_position_embeddings
    {type: linear, factor}               linear                   factor

``dynamic`` (NTK) is refused: transformers recomputes its frequencies from the longest sequence a model
has seen since it was built, so the angles of a position depend on earlier calls, and no fixed table (nor
any stateless function of the current batch) reproduces that. YaRN, LongRoPE and partial rotary factors have
no zoo field either.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from zoo.io.hf.common import HFError
from zoo.spec import RotaryPositions
from zoo.spec.errors import short_repr

SUPPORTED = ("default", "llama3", "linear")
_LLAMA3 = ("factor", "low_freq_factor", "high_freq_factor")
_WHY_NOT = {
    "dynamic": "transformers recomputes dynamic-NTK frequencies from the longest sequence the model has seen "
    "so far (state kept between calls), which no fixed rotary table reproduces",
}


def rope_from_config(config: Mapping[str, Any], *, layer_types: list[str] | None = None) -> dict[str, Any]:
    """The ``position`` sub-spec (a dict) for a config's rotary settings; HFError for what zoo cannot run.

    ``layer_types``: the config's per-layer attention kinds; transformers 5 may key ``rope_parameters`` by
    them (one dict per kind), which zoo accepts when every kind has the same settings.
    """
    params = _flat(config.get("rope_scaling") or config.get("rope_parameters") or {}, layer_types)
    kind = params.get("rope_type", params.get("type", "default"))
    if not isinstance(kind, str) or kind not in SUPPORTED:
        why = _WHY_NOT.get(kind, "zoo's RotaryPositions has no field for it") if isinstance(kind, str) else ""
        raise HFError(
            f"config.json rope_type={short_repr(kind)} is not supported{f' ({why})' if why else ''}; "
            f"supported: {', '.join(SUPPORTED)}"
        )
    partial = params.get("partial_rotary_factor", config.get("partial_rotary_factor", 1.0))
    if partial != 1.0:
        raise HFError(f"config.json partial_rotary_factor={partial} is not supported; zoo rotates every dim")
    theta = params.get("rope_theta", config.get("rope_theta", 10000.0))  # the spec checks it is a number
    position: dict[str, Any] = {"kind": "rotary", "theta": theta}
    if kind == "linear":
        position["scaling"] = {"type": "linear", "factor": _field(params, "factor", kind)}
    elif kind == "llama3":
        # as transformers' standardize_rope_params: a top-level value first (Phi-3 keeps it there), then the
        # rotary dict's, then the whole context
        original = config.get(
            "original_max_position_embeddings",
            params.get("original_max_position_embeddings", config.get("max_position_embeddings")),
        )
        position["scaling"] = {
            "type": "llama3",
            **{name: _field(params, name, kind) for name in _LLAMA3},
            "original_max_positions": original,
        }
    return position


def rope_to_config(position: RotaryPositions) -> dict[str, Any]:
    """``rope_theta`` + ``rope_scaling`` (transformers 4.x) and ``rope_parameters`` (transformers 5)."""
    scaling = position.scaling
    fields: dict[str, Any] = {}
    if scaling is not None and scaling.type == "linear":
        fields = {"rope_type": "linear", "factor": scaling.factor}
    elif scaling is not None:
        fields = {
            "rope_type": "llama3",
            "factor": scaling.factor,
            "low_freq_factor": scaling.low_freq_factor,
            "high_freq_factor": scaling.high_freq_factor,
            "original_max_position_embeddings": scaling.original_max_positions,
        }
    return {
        "rope_theta": position.theta,
        "rope_scaling": fields or None,
        "rope_parameters": {"rope_type": "default", **fields, "rope_theta": position.theta},
    }


def _flat(params: Any, layer_types: list[str] | None) -> dict[str, Any]:
    """One rotary dict: ``params`` itself, or the one every layer kind shares when keyed by layer kind."""
    if not isinstance(params, Mapping):
        raise HFError(f"config.json rope_parameters must be a mapping, got {type(params).__name__}")
    nested = [key for key in params if key in (layer_types or ())]
    if not nested:
        return dict(params)
    if not all(isinstance(params[key] or {}, Mapping) for key in nested):
        raise HFError(
            f"config.json rope_parameters: each layer type's entry must be a mapping ({', '.join(nested)})"
        )
    distinct = {repr(sorted(dict(params[key] or {}).items())) for key in nested}
    if len(distinct) > 1:
        raise HFError(
            f"config.json rope_parameters differ between layer types ({', '.join(nested)}); zoo has one "
            "rotary setting per stack"
        )
    return dict(params[nested[0]] or {})


def _field(params: Mapping[str, Any], name: str, kind: str) -> Any:
    if name not in params:
        raise HFError(f"config.json rope_type={kind!r} needs {name!r} in rope_parameters/rope_scaling")
    return params[name]
