"""Structured output fields of a request body -> the `Grammar` its text must follow (`zoo.generation.constrain`).

    response_format: {"type": "text"}                                        nothing asked (OpenAI's)
    response_format: {"type": "json_object"}                                 any JSON object
    response_format: {"type": "json_schema", "json_schema": {"name": ..., "schema": {...}, "strict": true}}
    guided_json: {...} · guided_regex: "..." · guided_choice: ["a", "b"]    vLLM's extensions

At most one of them asks for a grammar. A schema the engine cannot compile is a 400 naming
``response_format.json_schema.schema`` and the engine's reason; a server without llguidance answers 501
naming the ``grammar`` extra (as ``/metrics`` does for its own). ``strict`` is accepted either way: zoo always
holds the text to the whole schema.
"""

from __future__ import annotations

from typing import Any

from zoo.generation.constrain import Grammar, GrammarError, GrammarMissing
from zoo.serving.bodies import HTTPError, bad

FIELDS = ("response_format", "guided_json", "guided_regex", "guided_choice")
JSON_SCHEMA_KEYS = ("name", "description", "schema", "strict")


def grammar_of(body: dict[str, Any]) -> Grammar | None:
    """The grammar ``body`` asks for (None: free text); `HTTPError` for a bad one."""
    given = [name for name in FIELDS if body.get(name) is not None and not _plain_text(name, body[name])]
    if len(given) > 1:
        raise bad(f"{given[0]} and {given[1]} both ask for a grammar: give one of them", given[1])
    if not given:
        return None
    name = given[0]
    value = body[name]
    try:
        if name == "response_format":
            return _response_format(value)
        if name == "guided_json":
            if not isinstance(value, dict | str):
                raise bad("guided_json must be a JSON schema (an object or its JSON text)", name)
            return _compiled(lambda: Grammar.json_schema(value), name)
        if name == "guided_regex":
            if not isinstance(value, str) or not value:
                raise bad("guided_regex must be a non-empty regular expression", name)
            return _compiled(lambda: Grammar.regex(value), name)
        if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
            raise bad("guided_choice must be a non-empty list of non-empty strings", name)
        return _compiled(lambda: Grammar.choice(value), name)
    except GrammarMissing as error:
        raise HTTPError(501, str(error), kind="not_implemented_error", param=name) from None


def _plain_text(name: str, value: Any) -> bool:
    return name == "response_format" and value == {"type": "text"}


def _response_format(value: Any) -> Grammar:
    if not isinstance(value, dict):
        raise bad("response_format must be an object with a type", "response_format")
    kind = value.get("type")
    if kind == "json_object":
        _only(value, ("type",), "response_format")
        return Grammar.json_object()
    if kind != "json_schema":
        raise bad(
            f"response_format.type must be text, json_object or json_schema, got {kind!r}",
            "response_format.type",
        )
    _only(value, ("type", "json_schema"), "response_format")
    spec = value.get("json_schema")
    where = "response_format.json_schema"
    if not isinstance(spec, dict):
        raise bad(f"{where} must be an object with a schema", where)
    _only(spec, JSON_SCHEMA_KEYS, where)
    for key in ("name", "description"):
        if spec.get(key) is not None and not isinstance(spec[key], str):
            raise bad(f"{where}.{key} must be a string", f"{where}.{key}")
    if spec.get("strict") is not None and not isinstance(spec["strict"], bool):
        raise bad(f"{where}.strict must be a boolean", f"{where}.strict")
    schema = spec.get("schema")
    if not isinstance(schema, dict):
        raise bad(f"{where}.schema must be a JSON schema (an object)", f"{where}.schema")
    return _compiled(lambda: Grammar.json_schema(schema), f"{where}.schema")


def _only(value: dict[str, Any], keys: tuple[str, ...], where: str) -> None:
    for key in value:
        if key not in keys:
            raise bad(f"unknown field {key!r} in {where} (it takes {', '.join(keys)})", f"{where}.{key}")


def _compiled(make: Any, param: str) -> Grammar:
    try:
        grammar: Grammar = make()
    except GrammarError as error:
        raise bad(f"{param}: {error}", param) from None
    return grammar
