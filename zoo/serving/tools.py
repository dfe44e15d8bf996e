"""Tool calling (OpenAI's ``tools``, ``tool_choice``, ``parallel_tool_calls``): the request's tools checked
and handed to the chat template's ``tools`` argument, and the model's calls read back from its answer into
``message.tool_calls``.

A model writes its calls in the format its chat template taught it. `FORMATS` is the table of the formats
zoo reads; a template speaks the first whose markers all appear in its source (`tool_format`):

    hermes    Qwen 2.5 / 3, Hermes: optional text, then ``<tool_call>{"name": ..., "arguments": {...}}
              </tool_call>`` blocks, one per call
    llama3    Llama 3.1 / 3.2 (JSON tool calling): the whole answer is ``{"name": ..., "parameters": {...}}``,
              optionally after ``<|python_tag|>``; several calls separated by ``;``
    mistral   Mistral v0.3: optional text, then ``[TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]``;
              a call's id is 9 letters and digits (the template refuses any other in later turns)

``tool_choice``:

    auto      (the default with tools) the answer is read: calls become ``message.tool_calls`` with
              ``finish_reason: tool_calls``; an answer that is not a well-formed call to one of the tools
              (unknown name, JSON that does not parse, text after the call) is returned as plain content
    none      the tools are still rendered (as vLLM does: the prompt reads as it does under ``auto``), the
              answer is never read: plain content
    required  a call to one of the tools is forced; ``{"type": "function", "function": {"name": X}}`` a
              call to X: the prompt ends with the format's opener (``<tool_call>``, ``[TOOL_CALLS]``) and
              the grammar engine holds the rest to a call whose arguments validate against the tool's
              ``parameters`` (`forced_schema`)

``parallel_tool_calls: false``: an answer holds at most one call (the first; a forced call is one call).
"""

from __future__ import annotations

import json
import re
import secrets
import string
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from zoo.generation.constrain import Grammar, GrammarError
from zoo.serving.requests import RequestError

# A call's JSON object and the text before it: (content, [object, ...]) or None (no call in the text).
Split = Callable[[str], "tuple[str, list[Any]] | None"]


@dataclass(frozen=True)
class ToolFormat:
    """How one family of chat templates writes a model's tool calls."""

    name: str
    markers: tuple[str, ...]  # all in a template's source: it speaks this format
    opener: str  # what a forced call's prompt ends with (the calls' start, as the template writes it)
    starts: tuple[str, ...]  # what a call begins with in an answer
    anywhere: bool  # the calls may follow text (else the answer is the calls alone)
    arguments: tuple[str, ...]  # the keys a call's arguments may come under, the first the template's
    split: Split  # the answer -> (content, the calls' JSON objects), or None
    call_id: Callable[[], str]  # a new call's id
    schema: Callable[[dict[str, Any], bool], dict[str, Any]]  # one call's schema -> the body's (parallel)


def _openai_id() -> str:
    return "call_" + secrets.token_hex(12)


def _mistral_id() -> str:
    return "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(9))


_BLOCK = re.compile(r"\s*<tool_call>(.*?)(?:</tool_call>|\Z)", re.S)


def _split_hermes(text: str) -> tuple[str, list[Any]] | None:
    start = text.find("<tool_call>")
    if start < 0:
        return None
    objects, at = [], start
    while text[at:].strip():
        block = _BLOCK.match(text, at)
        if block is None:  # text after a call that is not another call
            return None
        objects.append(_json(block.group(1)))
        at = block.end()
    return text[:start], objects


def _split_llama3(text: str) -> tuple[str, list[Any]] | None:
    body = text.strip().removeprefix("<|python_tag|>").lstrip()
    if not body.startswith("{"):
        return None
    decoder, objects, at = json.JSONDecoder(), [], 0
    while at < len(body):
        try:
            value, at = decoder.raw_decode(body, at)
        except ValueError:
            return "", [None]
        objects.append(value)
        at = len(body) - len(body[at:].lstrip().removeprefix(";").lstrip())
    return "", objects


def _split_mistral(text: str) -> tuple[str, list[Any]] | None:
    start = text.find("[TOOL_CALLS]")
    if start < 0:
        return None
    value = _json(text[start + len("[TOOL_CALLS]") :])
    return text[:start], value if isinstance(value, list) else [value]


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def _single(call: dict[str, Any], parallel: bool) -> dict[str, Any]:
    return call  # one call: the format writes a block per call, and a forced answer is one block


def _array(call: dict[str, Any], parallel: bool) -> dict[str, Any]:
    return {"type": "array", "items": call, "minItems": 1, **({} if parallel else {"maxItems": 1})}


FORMATS: tuple[ToolFormat, ...] = (
    ToolFormat(
        name="hermes",
        markers=("<tool_call>",),
        opener="<tool_call>\n",
        starts=("<tool_call>",),
        anywhere=True,
        arguments=("arguments",),
        split=_split_hermes,
        call_id=_openai_id,
        schema=_single,
    ),
    ToolFormat(
        name="mistral",
        markers=("[TOOL_CALLS]",),
        opener="[TOOL_CALLS]",
        starts=("[TOOL_CALLS]",),
        anywhere=True,
        arguments=("arguments",),
        split=_split_mistral,
        call_id=_mistral_id,
        schema=_array,
    ),
    ToolFormat(
        name="llama3",
        markers=("<|start_header_id|>", '"parameters": '),
        opener="",
        starts=("{", "<|python_tag|>"),
        anywhere=False,
        arguments=("parameters", "arguments"),
        split=_split_llama3,
        call_id=_openai_id,
        schema=_single,
    ),
)
KNOWN = "Hermes/Qwen <tool_call>, Llama 3.1 JSON, Mistral [TOOL_CALLS]"


def tool_format(template: str | None) -> ToolFormat | None:
    """The format a chat template's source speaks (`FORMATS`), or None: it renders no tools zoo can read."""
    if template is None or not re.search(r"\btools\b", template):
        return None
    return next((f for f in FORMATS if all(marker in template for marker in f.markers)), None)


# ---- the request ----

_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
FUNCTION_KEYS = ("name", "description", "parameters", "strict")


@dataclass(frozen=True)
class Tools:
    """A request's tools, checked: ``schemas`` as the template takes them, ``choice`` ("auto", "none",
    "required", or a function's name: forced), ``parallel``: more than one call allowed."""

    format: ToolFormat
    schemas: list[dict[str, Any]]
    parameters: dict[str, dict[str, Any]]  # each function's parameters schema, by name
    choice: str
    parallel: bool

    @property
    def forced(self) -> bool:
        return self.choice not in ("auto", "none")

    @property
    def reads(self) -> bool:
        """Whether the answer is read for calls."""
        return self.choice != "none"


def read_tools(body: Mapping[str, Any], format_: ToolFormat | None) -> Tools | None:
    """The request's ``tools``, ``tool_choice`` and ``parallel_tool_calls`` checked (None: no tools), or
    `RequestError` naming the field: a bad tool, a choice that names no given tool, tools for a chat
    template that renders none zoo can read."""
    tools, choice, parallel = body.get("tools"), body.get("tool_choice"), body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise RequestError(
            f"parallel_tool_calls must be a boolean, got {parallel!r}", param="parallel_tool_calls"
        )
    if not tools:  # null or []: no tools, and nothing that would need them
        if tools is not None and not isinstance(tools, list):
            raise RequestError("tools must be a list of {type: function, function: {...}}", param="tools")
        if choice not in (None, "none"):
            raise RequestError("tool_choice is only allowed when tools are given", param="tool_choice")
        if parallel is not None:
            raise RequestError(
                "parallel_tool_calls is only allowed when tools are given", param="parallel_tool_calls"
            )
        return None
    if format_ is None:
        raise RequestError(
            f"this model's chat template does not render tools in a format zoo reads ({KNOWN})",
            param="tools",
        )
    schemas, parameters = _check_tools(tools)
    return Tools(format_, schemas, parameters, _choice(choice, parameters), parallel is not False)


def _check_tools(tools: Any) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    if not isinstance(tools, list):
        raise RequestError("tools must be a list of {type: function, function: {...}}", param="tools")
    schemas, parameters = [], {}
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type") != "function" or set(tool) != {"type", "function"}:
            raise RequestError(f"{where} must be {{type: function, function: {{...}}}}", param=where)
        function = tool["function"]
        if not isinstance(function, dict):
            raise RequestError(f"{where}.function must be an object", param=f"{where}.function")
        for key in function:
            if key not in FUNCTION_KEYS:
                raise RequestError(f"unknown field {where}.function.{key}", param=f"{where}.function.{key}")
        name = function.get("name")
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise RequestError(
                f"{where}.function.name must be 1-64 letters, digits, _ or -, got {name!r}",
                param=f"{where}.function.name",
            )
        if name in parameters:
            raise RequestError(
                f"{where}.function.name {name!r} is given twice", param=f"{where}.function.name"
            )
        schema = function.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(schema, dict) or schema.get("type", "object") != "object":
            raise RequestError(
                f"{where}.function.parameters must be a JSON schema of an object",
                param=f"{where}.function.parameters",
            )
        for key, wanted in (("description", str), ("strict", bool)):
            if function.get(key) is not None and not isinstance(function[key], wanted):
                raise RequestError(
                    f"{where}.function.{key} must be a {wanted.__name__}", param=f"{where}.function.{key}"
                )
        parameters[name] = schema
        kept = {k: v for k, v in function.items() if k != "strict" and v is not None}
        schemas.append({"type": "function", "function": {**kept, "parameters": schema}})
    return schemas, parameters


def _choice(choice: Any, parameters: Mapping[str, Any]) -> str:
    if choice is None:
        return "auto"
    if choice in ("auto", "none", "required"):
        return str(choice)
    function = choice.get("function") if isinstance(choice, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str) or choice.get("type") != "function":
        raise RequestError(
            'tool_choice must be "auto", "none", "required" or {"type": "function", "function": {"name": '
            "...}}",
            param="tool_choice",
        )
    if name not in parameters:
        raise RequestError(
            f"tool_choice names function {name!r}, which is not among the tools ({', '.join(parameters)})",
            param="tool_choice",
        )
    return name


def forced_schema(tools: Tools) -> dict[str, Any]:
    """The JSON schema of what a forced answer writes after the format's opener: a call (or the format's
    list of calls) to the chosen function, or to any of the tools for ``required``, its arguments under the
    format's key validating against the function's ``parameters``."""
    key = tools.format.arguments[0]
    names = list(tools.parameters) if tools.choice == "required" else [tools.choice]
    calls = [
        {
            "type": "object",
            "properties": {"name": {"const": name}, key: tools.parameters[name]},
            "required": ["name", key],
            "additionalProperties": False,
        }
        for name in names
    ]
    call = calls[0] if len(calls) == 1 else {"anyOf": calls}
    return tools.format.schema(call, tools.parallel)


def forced_grammar(tools: Tools) -> Grammar:
    """`forced_schema` compiled for the grammar engine; a schema it cannot compile is a `RequestError`
    naming ``tools`` (`zoo.generation.constrain.GrammarMissing` without the ``grammar`` extra)."""
    try:
        return Grammar.json_schema(forced_schema(tools))
    except GrammarError as error:
        raise RequestError(f"the tools' parameters cannot be enforced: {error}", param="tools") from None


# ---- the answer ----


def read_calls(
    text: str, tools: Tools, *, forced: bool = False
) -> tuple[str | None, list[dict[str, Any]]] | None:
    """An answer's calls as OpenAI's ``tool_calls`` (each with a new id), and the content before them (None:
    none); None when the answer is not well-formed calls to the given tools (it is plain content then).
    ``forced``: the answer follows the opener the prompt ended with."""
    fmt = tools.format
    split = fmt.split(fmt.opener + text if forced else text)
    if split is None:
        return None
    content, objects = split
    calls = []
    for value in objects:
        call = _call(value, fmt, tools.parameters)
        if call is None:
            return None
        calls.append(call)
    if not calls:
        return None
    if not tools.parallel:
        calls = calls[:1]
    return content.strip() or None, calls


def _call(value: Any, fmt: ToolFormat, parameters: Mapping[str, Any]) -> dict[str, Any] | None:
    if not isinstance(value, dict) or value.get("name") not in parameters:
        return None
    found = [value[key] for key in fmt.arguments if key in value]
    arguments = found[0] if found else {}
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        arguments = _json(arguments)
    if not isinstance(arguments, dict):
        return None
    return {
        "id": fmt.call_id(),
        "type": "function",
        "function": {"name": value["name"], "arguments": json.dumps(arguments, ensure_ascii=False)},
    }


class CallStream:
    """A streamed answer's text that may turn into calls: `push` gives the content safe to send now (text
    that cannot be part of a call), `finish` the calls, or the text held back when it holds none."""

    def __init__(self, tools: Tools) -> None:
        self.tools, self.text, self.sent = tools, "", 0
        self.free = not tools.reads  # decided: no call can follow
        self.held = tools.forced  # a call may have begun: hold everything to the end

    def push(self, piece: str) -> str:
        self.text += piece
        if self.free:
            return self._send(len(self.text))
        if self.held:
            return ""
        fmt = self.tools.format
        if not fmt.anywhere:  # the calls are the whole answer: decide on its first characters
            head = self.text.lstrip()
            if any(head.startswith(s) for s in fmt.starts):
                self.held = True
                return ""
            if any(s.startswith(head) for s in fmt.starts):  # nothing yet, or it could still become one
                return ""
            self.free = True
            return self._send(len(self.text))
        found = [at for s in fmt.starts if (at := self.text.find(s, self.sent)) >= 0]
        if found:
            self.held = True
            return self._send(min(found))
        return self._send(len(self.text) - _held(self.text, fmt.starts))

    def finish(self) -> tuple[str, list[dict[str, Any]] | None]:
        """(content not sent yet, the calls or None)."""
        found = read_calls(self.text, self.tools, forced=self.tools.forced) if self.tools.reads else None
        if found is None:
            return self._send(len(self.text)), None
        return "", found[1]

    def _send(self, upto: int) -> str:
        piece, self.sent = self.text[self.sent : upto], max(self.sent, upto)
        return piece


def _held(text: str, starts: Sequence[str]) -> int:
    """How many trailing characters of ``text`` could begin one of ``starts``."""
    for n in range(min(max(map(len, starts)) - 1, len(text)), 0, -1):
        if any(s.startswith(text[-n:]) for s in starts):
            return n
    return 0


# ---- later turns: the assistant's calls and the tools' results ----


def check_tool_calls(calls: Any, where: str) -> list[dict[str, Any]]:
    """An assistant message's ``tool_calls`` (OpenAI's: arguments as a JSON string) as a chat template reads
    them: the arguments parsed to an object. `RequestError` naming the bad one."""
    if not isinstance(calls, list) or not calls:
        raise RequestError(f"{where} must be a non-empty list of tool calls", param=where)
    checked = []
    for j, call in enumerate(calls):
        at = f"{where}[{j}]"
        function = call.get("function") if isinstance(call, dict) else None
        if (
            not isinstance(call, dict)
            or call.get("type", "function") != "function"
            or not isinstance(call.get("id"), str)
            or not isinstance(function, dict)
            or not isinstance(function.get("name"), str)
            or set(call) - {"id", "type", "function"}
            or set(function) - {"name", "arguments"}
        ):
            raise RequestError(
                f"{at} must be {{id, type: function, function: {{name, arguments}}}}", param=at
            )
        arguments = function.get("arguments", "{}")
        parsed = _json(arguments) if isinstance(arguments, str) else None
        if not isinstance(parsed, dict):
            raise RequestError(
                f"{at}.function.arguments must be a JSON object, as a string",
                param=f"{at}.function.arguments",
            )
        checked.append(
            {
                "id": call["id"],
                "type": "function",
                "function": {"name": function["name"], "arguments": parsed},
            }
        )
    return checked


def call_ids(messages: Sequence[Mapping[str, Any]]) -> set[str]:
    """The ids of the calls the assistant made in ``messages``."""
    return {call["id"] for m in messages for call in m.get("tool_calls", ())}
