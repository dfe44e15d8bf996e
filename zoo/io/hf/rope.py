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
    {type: yarn, factor,                 yarn                     factor (or max_position_embeddings /
     original_max_positions, beta_fast,                           original), original_max_position_embeddings,
     beta_slow, truncate, attention_factor,                       beta_fast, beta_slow, truncate,
     mscale, mscale_all_dim}                                      attention_factor, mscale, mscale_all_dim
    {type: dynamic, factor,              dynamic                  factor; original_max_position_embeddings is
     original_max_positions}                                      the config's max_position_embeddings
    fraction (partial rotary)            partial_rotary_factor    read only where the family's attention
                                                                  slices it (``partial=True``: Phi-3, GPT-NeoX)

A scaling zoo cannot run is refused naming the field, as is an invalid one: a ``factor`` (or Llama 3's
``low_freq_factor`` / ``high_freq_factor``) that is not a positive number, or a ``type`` (4.x's key) that
disagrees with ``rope_type`` beside it (what transformers 5 leaves when it merges a legacy ``rope_scaling``
into Gemma 3's or ModernBERT's ``rope_parameters``: 4.x applied the one, 5.x the other).

Dynamic NTK grows its base once a call's sequence passes ``max_position_embeddings``, so that length is
the scaling's ``original_max_positions`` and zoo's ``max_positions`` (the longest sequence it accepts) is
``floor(max_position_embeddings * factor)``, as vLLM sizes it (`max_positions_from_config`); an export
writes the original length back (`max_positions_to_config`). transformers keeps the rates of the longest
call since the last one within the original context; zoo computes them from each call alone, which is the
same while calls do not shrink (a fresh model, one ``generate``). LongRoPE's switch between its two factor
sets depends only on the current call's position ids, so zoo makes the same choice
(`zoo.blocks.position.RotaryPositions`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from zoo.io.hf.common import HFError
from zoo.spec import PositionSpec, RotaryPositions
from zoo.spec.errors import short_repr

SUPPORTED = ("default", "llama3", "linear")  # what a family reads unless it says otherwise (`kinds`)
LONG_CONTEXT = (*SUPPORTED, "yarn", "dynamic")  # the families that size max_positions by the scaling too
_ZOO_KINDS = {*LONG_CONTEXT, "longrope"}  # every kind zoo's RotaryPositions runs
_ALIASES = {"su": "longrope"}  # Phi-3's first releases; transformers reads it as longrope
_LLAMA3 = ("factor", "low_freq_factor", "high_freq_factor")
_YARN_DEFAULTS = {"beta_fast": 32.0, "beta_slow": 1.0}  # transformers' ``or`` defaults (0 reads as these)


def rope_from_config(
    config: Mapping[str, Any],
    *,
    layer_types: list[str] | None = None,
    partial: bool = False,
    kinds: tuple[str, ...] = SUPPORTED,
    where: str | None = None,
    max_positions: int | None = None,
    default_theta: float = 10000.0,
) -> dict[str, Any]:
    """The ``position`` sub-spec (a dict) for a config's rotary settings; HFError for what zoo cannot run.

    ``layer_types``: the config's per-layer attention kinds; transformers 5 may key ``rope_parameters`` by
    them (one dict per kind), which zoo accepts when every kind has the same settings. ``partial``: the
    family's attention rotates only ``partial_rotary_factor`` of each head (Phi-3, GPT-NeoX), read into
    ``fraction``; elsewhere a factor other than 1 is refused.
    ``kinds``: the rope types the family reads. ``longrope`` only where transformers' generation recomputes
    the cache when the factors switch, as zoo's does (Phi-3): elsewhere greedy decoding would differ.
    ``where``: the config key the settings came from, for messages (by default the one read).
    ``max_positions``: the config's ``max_position_embeddings`` with the family's default (by default the
    config's own); ``default_theta``: the family's base when the config gives none.
    """
    if max_positions is None:
        max_positions = config.get("max_position_embeddings")
    where = where or ("rope_scaling" if config.get("rope_scaling") else "rope_parameters")
    params = _flat(config.get("rope_scaling") or config.get("rope_parameters") or {}, layer_types)
    if "rope_type" in params and "type" in params and _kind(params["type"]) != _kind(params["rope_type"]):
        raise HFError(
            f"config.json {where}: type={short_repr(params['type'])} disagrees with "
            f"rope_type={short_repr(params['rope_type'])}; give one rope_type"
        )
    kind = _kind(params.get("rope_type", params.get("type", "default")))
    if not isinstance(kind, str) or kind not in kinds:
        why = "zoo's RotaryPositions has no field for it" if isinstance(kind, str) else ""
        if isinstance(kind, str) and kind in _ZOO_KINDS:
            why = "zoo runs it, but this family's import does not read it"
        if kind == "longrope":
            why = "this family's transformers generation keeps keys cached before the factors switch"
        raise HFError(
            f"config.json rope_type={short_repr(kind)} is not supported{f' ({why})' if why else ''}; "
            f"supported: {', '.join(kinds)}"
        )
    fraction = params.get("partial_rotary_factor", config.get("partial_rotary_factor", 1.0))
    if fraction != 1.0 and not partial:
        raise HFError(f"config.json partial_rotary_factor={fraction} is not supported; zoo rotates every dim")
    theta = params.get(
        "rope_theta", config.get("rope_theta", default_theta)
    )  # the spec checks it is a number
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
            params.get("original_max_position_embeddings", max_positions),
        )
        position["scaling"] = {
            "type": "llama3",
            **{name: _positive(params, name, kind, where) for name in _LLAMA3},
            "original_max_positions": original,
        }
    elif kind == "longrope":
        position["scaling"] = _longrope_from_config(config, params, where)
    elif kind == "yarn":
        position["scaling"] = _yarn_from_config(config, params, where, max_positions)
    elif kind == "dynamic":
        position["scaling"] = {
            "type": "dynamic",
            "factor": _positive(params, "factor", kind, where),
            "original_max_positions": max_positions,
        }
    return position


def max_positions_from_config(position: Mapping[str, Any], max_position_embeddings: Any) -> Any:
    """zoo's ``max_positions`` for a config read as ``position``: ``max_position_embeddings``, or for dynamic
    NTK (whose scaling starts there) that length times the factor, as vLLM's longest accepted sequence."""
    scaling = position.get("scaling") or {}
    if scaling.get("type") != "dynamic" or not isinstance(max_position_embeddings, int):
        return max_position_embeddings
    return math.floor(max_position_embeddings * scaling["factor"])


def max_positions_to_config(position: PositionSpec, max_positions: int) -> int:
    """The config's ``max_position_embeddings`` for a model of ``max_positions``: dynamic NTK's original
    length (where transformers starts growing the base), else ``max_positions``."""
    scaling = position.scaling if isinstance(position, RotaryPositions) else None
    return (
        scaling.original_max_positions if scaling is not None and scaling.type == "dynamic" else max_positions
    )


def _yarn_from_config(
    config: Mapping[str, Any], params: Mapping[str, Any], where: str, max_positions: Any
) -> dict[str, Any]:
    """YaRN's fields with transformers' defaults: the original context as Llama 3's; ``factor`` missing is
    max_position_embeddings / original; beta_fast/beta_slow 0 or missing read as 32/1 and a zero mscale as
    none (transformers tests them for truth)."""
    original = config.get(
        "original_max_position_embeddings", params.get("original_max_position_embeddings", max_positions)
    )
    if not isinstance(original, int) or isinstance(original, bool) or original < 1:
        raise HFError(
            "config.json rope_type='yarn' needs original_max_position_embeddings (a positive integer), "
            f"got {short_repr(original)}"
        )
    if params.get("factor") is None and isinstance(max_positions, int):
        factor: float = max_positions / original
    else:
        factor = _positive(params, "factor", "yarn", where)
    scaling: dict[str, Any] = {"type": "yarn", "factor": factor, "original_max_positions": original}
    for name, default in _YARN_DEFAULTS.items():
        scaling[name] = _positive(params, name, "yarn", where) if params.get(name) else default
    for name in ("mscale", "mscale_all_dim", "attention_factor"):
        if params.get(name) is not None and (name == "attention_factor" or params[name]):
            scaling[name] = _positive(params, name, "yarn", where)
    truncate = params.get("truncate", True)
    if not isinstance(truncate, bool):
        raise HFError(f"config.json {where} truncate={short_repr(truncate)}: true or false is expected")
    scaling["truncate"] = truncate
    return scaling


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
    elif scaling is not None and scaling.type == "yarn":
        fields = {
            "rope_type": "yarn",
            "factor": scaling.factor,
            "original_max_position_embeddings": scaling.original_max_positions,
            **{name: getattr(scaling, name) for name in _YARN_DEFAULTS if getattr(scaling, name) != _YARN_DEFAULTS[name]},
            **{name: getattr(scaling, name) for name in ("mscale", "mscale_all_dim", "attention_factor")
               if getattr(scaling, name) is not None},
            **({"truncate": False} if not scaling.truncate else {}),
        }  # fmt: skip
    elif scaling is not None and scaling.type == "dynamic":
        fields = {"rope_type": "dynamic", "factor": scaling.factor}  # the family writes the original length
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
