"""Reading the small JSON files of a checkpoint folder (config.json, tokenizer_config.json): a clear error
naming the file when it is not a JSON object."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def read_json_object(path: Path, *, error: type[Exception] = ValueError) -> dict[str, Any]:
    """The JSON object in ``path``; raises ``error`` naming the file when it is not valid JSON or not an object."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as problem:
        raise error(f"{path}: not valid JSON: {problem}") from None
    if not isinstance(data, dict):
        raise error(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data
