"""Errors of specs and configs, and the one formatter every validation error goes through.

pydantic's own text (``str(ValidationError)``) prints each failing input's repr and a link to its
documentation. Neither belongs in front of a user: the repr of a large or self-referencing input (a YAML
alias bomb) takes minutes and gigabytes to build, and the link says nothing about zoo. So every message
here is built from ``error.errors(include_url=False, include_input=False)``, one ``dotted.field: problem``
line per error, each piece cut to a short length.

This module imports no torch.
"""

from __future__ import annotations

import reprlib
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic_core import PydanticCustomError
from typing_extensions import Self

_FAMILY_TAGS = ("encoder", "decoder", "encoder-decoder")
_FFN_TAGS = ("dense", "moe")
MAX_MESSAGE_CHARS = 300  # one problem's text; longer (a huge tag or key echoed back) is cut
MAX_FIELD_CHARS = 80  # one part of a dotted field path (a mapping key from the input)
MAX_LINES = 30  # problems listed; the rest are counted

_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = 60
_REPR.maxlist = _REPR.maxtuple = _REPR.maxdict = _REPR.maxset = 6
_REPR.maxlevel = 3
_REPR.maxlong = 40


class SpecError(ValueError):
    """A spec file or preset that cannot be read or does not validate; the message names the file."""


def short_repr(value: Any) -> str:
    """A bounded repr: a few elements, a few levels, a few dozen characters, however large ``value`` is."""
    return _REPR.repr(value)


def clip(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    return text if len(text) <= limit else f"{text[: limit - 15]}... ({len(text):,} chars)"


def format_validation_error(error: ValidationError) -> str:
    """One line per problem, ``  dotted.field: message`` (the message alone for a whole-model check);
    no input reprs, no URLs; long pieces cut, at most `MAX_LINES` lines."""
    items = error.errors(include_url=False, include_input=False, include_context=False)
    lines = []
    for item in items[:MAX_LINES]:
        loc = [
            clip(part if isinstance(part, str) else short_repr(part), MAX_FIELD_CHARS) for part in item["loc"]
        ]
        if loc and loc[0] in _FAMILY_TAGS:  # pydantic puts the union tag first; it is not a field
            loc = loc[1:]
        # an FFN's kind tag (dense, moe) is not a field either: ``ffn.d_ff``, as before the union
        loc = [part for i, part in enumerate(loc) if not (i and loc[i - 1] == "ffn" and part in _FFN_TAGS)]
        message = clip(item["msg"].removeprefix("Value error, "))
        # A whole-model check (a model_validator) has no field of its own; its message names the fields.
        lines.append(f"  {'.'.join(loc)}: {message}" if loc else f"  {message}")
    if len(items) > MAX_LINES:
        lines.append(f"  ... and {len(items) - MAX_LINES} more")
    return "\n".join(lines)


class SpecValidationError(ValidationError, SpecError):
    """pydantic's `ValidationError` for a model spec or any of zoo's public configs (``except
    ValidationError`` still catches it), whose text is `format_validation_error`'s and which holds no input
    (so nothing can print or expand it)."""

    def __str__(self) -> str:
        what = "model spec" if self.title == "ModelSpec" else self.title
        return f"invalid {what}:\n{format_validation_error(self)}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self)!r})"

    @classmethod
    def from_error(cls, error: ValidationError, *, keep_input: bool = False) -> SpecValidationError:
        """The same problems (type, field, message) as ``error``, without its inputs unless ``keep_input``
        (for a caller that quotes one, bounded; this class's text never shows them)."""
        lines: list[Any] = [
            {
                # A custom error with no context keeps the message as it is (braces included).
                "type": PydanticCustomError(item["type"], clip(item["msg"])),
                "loc": item["loc"],
                "input": item.get("input") if keep_input else None,
            }
            for item in error.errors(include_url=False, include_input=keep_input, include_context=False)
        ]
        return cls.from_exception_data(error.title, lines)


class CleanModel(BaseModel):
    """Base of the pydantic models users construct themselves (every spec, `GenerationConfig`, the training
    config's sections): a validation error is a `SpecValidationError`, one ``field: problem`` line per
    error, never pydantic's input reprs or its "For further information visit https://errors.pydantic.dev"
    links. ``except ValidationError`` and ``except ValueError`` both still catch it.

        >>> GenerationConfig(num_beams=0)
        SpecValidationError: invalid GenerationConfig:
          num_beams: num_beams must be an int >= 1, got 0
    """

    def __init__(self, /, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as error:
            raise SpecValidationError.from_error(error, keep_input=True) from None

    @classmethod
    def model_validate(cls, *args: Any, **kwargs: Any) -> Self:
        try:
            return super().model_validate(*args, **kwargs)
        except ValidationError as error:
            raise SpecValidationError.from_error(error, keep_input=True) from None

    @classmethod
    def model_validate_json(cls, *args: Any, **kwargs: Any) -> Self:
        try:
            return super().model_validate_json(*args, **kwargs)
        except ValidationError as error:
            raise SpecValidationError.from_error(error, keep_input=True) from None


def plain_tags(data: Any, paths: Iterable[tuple[str, ...]]) -> Any:
    """``data`` with each union tag at ``paths`` (e.g. ``("position", "kind")``) that is not a short
    string replaced by a placeholder: ``'<list>'``, or the string's start and ``...``.

    pydantic quotes a tag that matches no variant in its message, building the quote from the whole value
    first: a large list there (a shared, self-repeating one costs nothing to pass) would take minutes. Such
    a tag matches no variant anyway (tags are short words), so the replacement changes no outcome, only
    the quote.
    Mappings on a path are copied, never changed in place.
    """
    for path in paths:
        data = _replace_tag(data, path)
    return data


def _replace_tag(node: Any, path: tuple[str, ...]) -> Any:
    if not isinstance(node, Mapping) or path[0] not in node:
        return node
    head, rest = path[0], path[1:]
    value = node[head]
    if rest:
        new = _replace_tag(value, rest)
    else:
        new = value if isinstance(value, str) and len(value) <= _MAX_TAG else _placeholder(value)
    return node if new is value else {**node, head: new}


_MAX_TAG = 40


def _placeholder(value: Any) -> str:
    return f"{value[:20]}..." if isinstance(value, str) else f"<{type(value).__name__}>"


def number(value: int) -> str:
    """An int for a message, however many digits it has (Python refuses str() past 4300 digits)."""
    if value.bit_length() <= 100:
        return f"{value:,}"
    return f"a {int(value.bit_length() * 0.30103) + 1}-digit number"
