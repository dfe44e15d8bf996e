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
    {type: longrope, short_factor,       longrope (Phi-3's su)    short_factor, long_factor,
     long_factor, original_max_positions,                         original_max_position_embeddings,
     attention_factor}                                            attention_factor (or factor: derived)
    fraction (partial rotary)            partial_rotary_factor    read only where the family's attention
                                                                  slices it (``partial=True``: Phi-3, GPT-NeoX)

A scaling zoo cannot run is refused naming the field, as is an invalid one: a ``factor`` (or Llama 3's
``low_freq_factor`` / ``high_freq_factor``) that is not a positive number, or a ``type`` (4.x's key) that
disagrees with ``rope_type`` beside it (what transformers 5 leaves when it merges a legacy ``rope_scaling``
into Gemma 3's or ModernBERT's ``rope_parameters``: 4.x applied the one, 5.x the other).

``dynamic`` (NTK) is refused: transformers recomputes its frequencies from the longest sequence a model
has seen since it was built, so the angles of a position depend on earlier calls, and no fixed table (nor
any stateless function of the current batch) reproduces that. YaRN has no zoo field either. LongRoPE's
switch between its two factor sets depends only on the current call's position ids, so zoo makes the same
choice (`zoo.blocks.position.RotaryPositions`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from zoo.io.hf.common import HFError
from zoo.spec import PositionSpec, RotaryPositions
from zoo.spec.errors import short_repr

SUPPORTED = ("default", "llama3", "linear")  # what a family reads unless it says otherwise (`kinds`)
_ALIASES = {"su": "longrope"}  # Phi-3's first releases; transformers reads it as longrope
_LLAMA3 = ("factor", "low_freq_factor", "high_freq_factor")
_WHY_NOT = {
    "dynamic": "transformers recomputes dynamic-NTK frequencies from the longest sequence the model has seen "
    "so far (state kept between calls), which no fixed rotary table reproduces",
}


def rope_from_config(
    config: Mapping[str, Any],
    *,
    layer_types: list[str] | None = None,
    partial: bool = False,
    kinds: tuple[str, ...] = SUPPORTED,
    where: str | None = None,
) -> dict[str, Any]:
    """The ``position`` sub-spec (a dict) for a config's rotary settings; HFError for what zoo cannot run.

    ``layer_types``: the config's per-layer attention kinds; transformers 5 may key ``rope_parameters`` by
    them (one dict per kind), which zoo accepts when every kind has the same settings. ``partial``: the
    family's attention rotates only ``partial_rotary_factor`` of each head (Phi-3, GPT-NeoX), read into
    ``fraction``; elsewhere a factor other than 1 is refused.
    ``kinds``: the rope types the family reads. ``longrope`` only where transformers' generation recomputes
    the cache when the factors switch, as zoo's does (Phi-3): elsewhere greedy decoding would differ.
    ``where``: the config key the settings came from, for messages (by default the one read).
    """
    where = where or ("rope_scaling" if config.get("rope_scaling") else "rope_parameters")
    params = _flat(config.get("rope_scaling") or config.get("rope_parameters") or {}, layer_types)
    if "rope_type" in params and "type" in params and _kind(params["type"]) != _kind(params["rope_type"]):
        raise HFError(
            f"config.json {where}: type={short_repr(params['type'])} disagrees with "
            f"rope_type={short_repr(params['rope_type'])}; give one rope_type"
        )
    kind = _kind(params.get("rope_type", params.get("type", "default")))
    if not isinstance(kind, str) or kind not in kinds:
        why = _WHY_NOT.get(kind, "zoo's RotaryPositions has no field for it") if isinstance(kind, str) else ""
        if kind == "longrope":
            why = "this family's transformers generation keeps keys cached before the factors switch"
        raise HFError(
            f"config.json rope_type={short_repr(kind)} is not supported{f' ({why})' if why else ''}; "
            f"supported: {', '.join(kinds)}"
        )
    fraction = params.get("partial_rotary_factor", config.get("partial_rotary_factor", 1.0))
    if fraction != 1.0 and not partial:
        raise HFError(f"config.json partial_rotary_factor={fraction} is not supported; zoo rotates every dim")
    theta = params.get("rope_theta", config.get("rope_theta", 10000.0))  # the spec checks it is a number
    position: dict[str, Any] = {"kind": "rotary", "theta": theta}
    if fraction != 1.0:
        position["fraction"] = fraction
    if kind == "linear":
        position["scaling"] = {"type": "linear", "factor": _positive(params, "factor", kind, where)}
    elif kind == "llama3":
        # as transformers' standardize_rope_params: a top-level value first (Phi-3 keeps it there), then the
        # rotary dict's, then the whole context
        original = config.get(
            "original_max_position_embeddings",
            params.get("original_max_position_embeddings", config.get("max_position_embeddings")),
        )
        position["scaling"] = {
            "type": "llama3",
            **{name: _positive(params, name, kind, where) for name in _LLAMA3},
            "original_max_positions": original,
        }
    elif kind == "longrope":
        position["scaling"] = _longrope_from_config(config, params, where)
    return position


def legacy_scaling(config: Mapping[str, Any]) -> dict[str, Any]:
    """A config's legacy ``rope_scaling`` (4.x's key; {} when absent), which transformers 5 lays over the
    per-layer-type ``rope_parameters`` of Gemma 3 and ModernBERT (`layer_rope`)."""
    scaling = config.get("rope_scaling")
    if scaling is not None and not isinstance(scaling, Mapping):
        raise HFError(f"config.json rope_scaling must be a mapping or null, got {short_repr(scaling)}")
    return dict(scaling or {})


def layer_rope(params: Mapping[str, Any] | None, kind: str, scaling: Mapping[str, Any]) -> dict[str, Any]:
    """One layer type's rotary settings as transformers 5 reads them (``convert_rope_params_to_dict``): its
    ``rope_parameters`` entry, or ``{"rope_type": "default"}`` for a config without rope_parameters, updated
    by ``scaling`` (rope_scaling's keys win, a rope_type beside a legacy ``type`` included)."""
    own = params.get(kind) if params is not None else {"rope_type": "default"}
    if own is not None and not isinstance(own, Mapping):
        raise HFError(f"config.json rope_parameters.{kind} must be a mapping, got {short_repr(own)}")
    return dict(own or {}) | dict(scaling)


def local_rope(
    full: dict[str, Any], local: dict[str, Any], *, where: str, local_where: str
) -> dict[str, Any]:
    """The ``position`` sub-spec of a stack whose global layers rotate by ``full`` (read from config key
    ``where``) and local ones by ``local`` (``local_where``): the same settings, or a plain local rotary
    whose base is ``position.local_theta``."""
    position = rope_from_config({"rope_parameters": full}, where=where)
    local_position = rope_from_config({"rope_parameters": local}, where=local_where)
    if local_position == position:
        return position  # the local layers rotate as the global ones
    if set(local_position) != {"kind", "theta"}:
        raise HFError(
            f"config.json {local_where}={short_repr(local)}: zoo's local layers use plain rotary "
            "(position.local_theta), with no scaling, or the global layers' settings"
        )
    return position | {"local_theta": local_position["theta"]}


def _longrope_from_config(config: Mapping[str, Any], params: Mapping[str, Any], where: str) -> dict[str, Any]:
    """LongRoPE's fields, with transformers' defaults: the original context from the top level (Phi-3)
    or the rotary dict, and the attention factor from ``attention_factor``, else from ``factor`` (else the
    spec derives it from max_positions, as transformers derives it from max_position_embeddings)."""
    original = config.get(
        "original_max_position_embeddings",
        params.get("original_max_position_embeddings", config.get("max_position_embeddings")),
    )
    if not isinstance(original, int) or isinstance(original, bool) or original < 2:
        raise HFError(
            "config.json rope_type='longrope' needs original_max_position_embeddings (an integer > 1), "
            f"got {short_repr(original)}"
        )
    scaling = {
        "type": "longrope",
        "short_factor": _field(params, "short_factor", "longrope"),
        "long_factor": _field(params, "long_factor", "longrope"),
        "original_max_positions": original,
    }
    attention_factor, factor = params.get("attention_factor"), params.get("factor")
    if attention_factor is None and factor is not None:
        factor = _positive(params, "factor", "longrope", where)
        attention_factor = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    if attention_factor is not None:
        scaling["attention_factor"] = attention_factor
    return scaling


def rope_to_config(
    position: PositionSpec, *, partial: bool = False, kinds: tuple[str, ...] = SUPPORTED
) -> dict[str, Any]:
    """``rope_theta`` + ``rope_scaling`` (transformers 4.x) and ``rope_parameters`` (transformers 5).

    What `rope_from_config` reads back with the same ``partial`` and ``kinds``: a family writes what it can
    hold and nothing else, so what it cannot reads back as its own (positions of another kind as plain
    rotary, a scaling of a kind it does not read as none, a fraction as 1) and the export guard names it
    (`zoo.io.hf.faithful`).
    """
    rotary = as_rotary(position)
    scaling = rotary.scaling if rotary.scaling is not None and rotary.scaling.type in kinds else None
    fields: dict[str, Any] = {}
    if scaling is not None and scaling.type == "linear":
        fields = {"rope_type": "linear", "factor": scaling.factor}
    elif scaling is not None and scaling.type == "longrope":
        fields = {
            "rope_type": "longrope",
            "short_factor": list(scaling.short_factor),
            "long_factor": list(scaling.long_factor),
            "original_max_position_embeddings": scaling.original_max_positions,
        }
        if scaling.attention_factor is not None:
            fields["attention_factor"] = scaling.attention_factor
    elif scaling is not None:
        fields = {
            "rope_type": "llama3",
            "factor": scaling.factor,
            "low_freq_factor": scaling.low_freq_factor,
            "high_freq_factor": scaling.high_freq_factor,
            "original_max_position_embeddings": scaling.original_max_positions,
        }
    fraction = rotary.fraction if partial else 1.0
    written = {"partial_rotary_factor": fraction} if fraction != 1.0 else {}
    return {
        "rope_theta": rotary.theta,
        "rope_scaling": fields or None,
        "rope_parameters": {"rope_type": "default", **fields, "rope_theta": rotary.theta, **written},
        **written,
    }


def as_rotary(position: PositionSpec) -> RotaryPositions:
    """``position`` if rotary, else plain RoPE: what a rotary family writes in place of positions of another
    kind, which the config then reads back as (the export guard names them, `zoo.io.hf.faithful`)."""
    return position if isinstance(position, RotaryPositions) else RotaryPositions()


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


def _kind(name: Any) -> Any:
    """A rope type with Phi-3's early alias (``su``) read as transformers reads it."""
    return _ALIASES.get(name, name) if isinstance(name, str) else name


def _positive(params: Mapping[str, Any], name: str, kind: str, where: str) -> float:
    """Scaling field ``name``, which must be a positive number (transformers computes with 0 or -2 too)."""
    value = _field(params, name, kind)
    if not isinstance(value, int | float) or isinstance(value, bool) or not 0 < value < math.inf:
        raise HFError(
            f"config.json {where} {name}={short_repr(value)}: a positive number is expected "
            f"(rope_type={kind!r})"
        )
    return value


def _field(params: Mapping[str, Any], name: str, kind: str) -> Any:
    if name not in params:
        raise HFError(f"config.json rope_type={kind!r} needs {name!r} in rope_parameters/rope_scaling")
    return params[name]
