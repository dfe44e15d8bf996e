"""The one JSON reader for every JSON file zoo opens, with bounded cost and errors that name the file.

config.json, tokenizer_config.json, a safetensors index, a safetensors header (`zoo.io.checkpoint.files`)
and the JSON strings inside its metadata all come from files anyone can write. Python's ``json`` module is
safe from code execution, not from cost or surprises, so a document is refused, naming the file, when

- the file is larger than its limit (read at most the limit plus one byte: a growing file or a 1 GB sparse
  index costs nothing): ``ZOO_MAX_JSON_BYTES`` (64 MiB) for config files and indexes;
- it nests arrays and objects more than `MAX_DEPTH` levels deep: json's C parser recurses once per level, so
  50,000 ``[`` end in a RecursionError (or worse, with a raised recursion limit). The depth is measured
  before parsing, by a vectorised scan of the brackets outside strings (about 0.5 s per 100 MB);
- it holds an integer of more than 4,300 digits (Python's limit on str -> int);
- it holds ``NaN``, ``Infinity`` or a number beyond the float range (``1e999``): none is valid JSON
  (RFC 8259), and each would otherwise pass as a float where a finite number is meant. The message names
  the key (``layer_norm_epsilon: Infinity is not a finite number``);
- it is not UTF-8, not JSON, or (`read_json_object`) not an object.

This module imports no torch.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from zoo.spec.errors import clip
from zoo.spec.limits import Limit

MAX_DEPTH = 100  # nesting levels; zoo's files use fewer than 10
JSON_BYTES = Limit("ZOO_MAX_JSON_BYTES", 64 * 2**20, "bytes")  # config.json, indexes, tokenizer configs
# tokenizer.json is parsed by the `tokenizers` library, not here: `check_file_size` bounds it first.
TOKENIZER_BYTES = Limit("ZOO_MAX_TOKENIZER_BYTES", 512 * 2**20, "bytes")
_CHUNK = 2**20  # bytes per step of the depth scan: bounded scratch memory however large the text
_QUOTE = ord('"')
_STEPS = np.zeros(256, dtype=np.int8)  # byte -> change of nesting depth
_STEPS[[ord("["), ord("{")]], _STEPS[[ord("]"), ord("}")]] = 1, -1


class JSONLimitError(ValueError):
    """A JSON document over a limit (size, depth or number length): refused before it is parsed."""


def read_json(
    path: Path, *, error: type[Exception] = ValueError, limit: Limit = JSON_BYTES, what: str | None = None
) -> Any:
    """The parsed JSON in ``path``, within ``limit`` bytes and the bounds above.

    Raises ``error`` (a `JSONLimitError` when ``error`` is ValueError) naming the file, and ``what`` it is
    when given (``"not a valid index"``: messages read ``<path>: not a valid index: ...``); OSError when it
    cannot be read.
    """
    with path.open("rb") as file:
        raw = file.read(limit.value + 1)  # at most the limit: a huge or growing file costs nothing more
    if len(raw) > limit.value:
        raise _error(
            error,
            f"{path}: larger than the limit of {_size(limit.value)} for this JSON file; set the environment "
            f"variable {limit.env} to allow more",
            limit=True,
        )
    return parse_json(raw, where=f"{path}: {what}" if what else str(path), error=error)


def read_json_object(
    path: Path, *, error: type[Exception] = ValueError, limit: Limit = JSON_BYTES
) -> dict[str, Any]:
    """The JSON object in ``path`` (`read_json`); raises ``error`` naming the file when it is not an object."""
    data = read_json(path, error=error, limit=limit)
    if not isinstance(data, dict):
        raise error(f"{path}: expected a JSON object, got {_kind(data)}")
    return data


def parse_json(text: str | bytes, *, where: str, error: type[Exception] = ValueError) -> Any:
    """``text`` parsed within the bounds above (no size limit: the caller read it within one); raises
    ``error`` whose message starts with ``where`` (a file, or a file and the metadata key)."""
    raw = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    if nesting_exceeds(raw, MAX_DEPTH):
        raise _error(
            error, f"{where}: JSON nested more than {MAX_DEPTH} levels deep; no model file is", limit=True
        )
    not_finite: list[str] = []  # set by the hooks below: a walk to name the key is needed only then

    def constant(name: str) -> float:
        not_finite.append(name)
        return float(name.replace("Infinity", "inf"))

    def number(literal: str) -> float:
        value = float(literal)
        if not math.isfinite(value):
            not_finite.append(literal)
        return value

    try:
        data = json.loads(
            raw.decode("utf-8") if isinstance(text, bytes) else text,
            parse_constant=constant,
            parse_float=number,
        )
    except UnicodeDecodeError as problem:
        raise error(f"{where}: not UTF-8 text ({problem.reason} at byte {problem.start})") from None
    except json.JSONDecodeError as problem:
        raise error(f"{where}: not valid JSON: {problem}") from None
    except ValueError:  # "Exceeds the limit (4300 digits) for integer string conversion"
        raise _error(error, f"{where}: holds an integer of more than 4,300 digits", limit=True) from None
    except RecursionError:  # a scan that missed a level would still end here, not in a traceback
        raise _error(error, f"{where}: JSON nested too deeply", limit=True) from None
    if not_finite:
        key = next((key for key, value in _floats(data) if not math.isfinite(value)), "")
        raise error(
            f"{where}: {clip(key, 120) or 'the document'}: {clip(not_finite[0], 40)} is not a finite number "
            "(JSON has no NaN or Infinity, and a number beyond the float range reads as one)"
        )
    return data


def nesting_exceeds(raw: bytes, limit: int) -> bool:
    """Whether JSON text ``raw`` nests arrays and objects more than ``limit`` levels deep (brackets inside
    strings do not count). Linear, vectorised, at most `_CHUNK` bytes of scratch at a time.

    Escapes are removed first so that every remaining quote opens or closes a string: each ``\\\\`` pair
    (an escaped backslash), then each ``\\"``. A run of n backslashes is n // 2 escaped backslashes and,
    when n is odd, an escape of the next character: removing pairs from the left leaves exactly that.
    """
    if raw.count(b"[") + raw.count(b"{") <= limit:  # the common case: a small document, no scan
        return False
    clean = raw.replace(b"\\\\", b"").replace(b'\\"', b"")
    data = np.frombuffer(clean, dtype=np.uint8)
    in_string, depth = 0, 0
    for start in range(0, len(data), _CHUNK):
        chunk = data[start : start + _CHUNK]
        # Quote parity: 1 inside a string (and on its opening quote); uint8 wraps, parity survives.
        outside = (np.cumsum(chunk == _QUOTE, dtype=np.uint8) + in_string) & 1 ^ 1
        in_string = 1 - int(outside[-1])
        levels = np.cumsum(_STEPS[chunk] * outside.view(np.int8), dtype=np.int32)  # (chunk,) depth change
        if depth + int(levels.max()) > limit:
            return True
        depth += int(levels[-1])
    return False


def check_file_size(path: Path, limit: Limit, *, what: str, error: type[Exception] = ValueError) -> None:
    """Refuse, before a library reads it whole, a file over ``limit`` bytes (e.g. a tokenizer.json)."""
    size = path.stat().st_size
    if size > limit.value:
        raise _error(
            error,
            f"{path}: {_size(size)}, over the limit of {_size(limit.value)} for a {what}; set the environment "
            f"variable {limit.env} to allow more (e.g. {limit.env}={size})",
            limit=True,
        )


def _floats(data: Any) -> Iterator[tuple[str, float]]:
    """(dotted key, value) of every float in ``data``, depth first, without recursion."""
    stack: list[tuple[str, Any]] = [("", data)]
    while stack:
        key, node = stack.pop()
        if isinstance(node, float):
            yield key, node
        elif isinstance(node, dict):
            stack += [(f"{key}.{k}" if key else str(k), v) for k, v in reversed(node.items())]
        elif isinstance(node, list):
            stack += [(f"{key}[{i}]", v) for i, v in reversed(list(enumerate(node)))]


def _error(error: type[Exception], message: str, *, limit: bool = False) -> Exception:
    """``error(message)``; a `JSONLimitError` where ``error`` is plain ValueError and a limit was hit."""
    return JSONLimitError(message) if limit and error is ValueError else error(message)


def _kind(value: Any) -> str:
    return {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number"
    )


def _size(count: int) -> str:
    return f"{count / 2**20:,.0f} MiB" if count >= 2**20 else f"{count:,} bytes"
