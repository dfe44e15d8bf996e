"""Presets: named, validated specs read from ``presets/*.yaml``.

The YAML files are data only. They ship at the top of the repository for people and inside the wheel
(``zoo/presets``) for an installed zoo; both places are searched.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from zoo.spec.errors import SpecError, format_validation_error
from zoo.spec.files import YAMLLimitError, read_yaml_file
from zoo.spec.model import ModelSpec, parse_spec

__all__ = ["SpecError", "format_validation_error", "list_presets", "load_spec", "preset", "presets_dir"]


def presets_dir() -> Path:
    """The folder holding the preset YAML files (inside the wheel, else the source checkout)."""
    package = Path(__file__).resolve().parent.parent
    for candidate in (package / "presets", package.parent / "presets"):
        if candidate.is_dir():
            return candidate
    raise SpecError(f"no presets folder found next to {package}")


@cache
def _preset_files() -> dict[str, Path]:
    return {path.stem: path for path in sorted(presets_dir().glob("*.yaml"))}


def list_presets() -> list[str]:
    """Names of every preset, sorted."""
    return list(_preset_files())


def preset(name: str, **overrides: Any) -> ModelSpec:
    """The spec of preset ``name``, with optional validated overrides (dotted keys reach sub-specs).

    >>> zoo.preset("gpt2", num_layers=4)
    """
    files = _preset_files()
    if name not in files:
        raise SpecError(f"unknown preset {name!r}; known presets: {', '.join(files)}")
    spec = load_spec(files[name])
    return spec.override(**overrides) if overrides else spec


def load_spec(path: str | Path) -> ModelSpec:
    """Read a YAML or JSON spec file; errors name the file and the failing field.

    Files over `zoo.spec.files.MAX_FILE_BYTES`, or whose aliases expand past its node limit, are refused.
    """
    path = Path(path).expanduser()
    if not path.is_file():
        raise SpecError(f"{path}: spec file not found")
    try:
        data = read_yaml_file(path, what="spec file")  # JSON is a subset of YAML
    except YAMLLimitError as error:
        raise SpecError(f"{path}: refused: {error}") from None
    except (yaml.YAMLError, UnicodeDecodeError) as error:
        raise SpecError(f"{path}: not valid YAML/JSON: {error}") from None
    if not isinstance(data, dict):
        raise SpecError(f"{path}: a spec file must hold a mapping of fields, got {type(data).__name__}")
    try:
        return parse_spec(data)
    except ValidationError as error:
        raise SpecError(f"{path}: invalid spec:\n{format_validation_error(error)}") from None
