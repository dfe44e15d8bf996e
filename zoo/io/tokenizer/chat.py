"""Chat templates: a conversation rendered to the text a chat model was trained on, as transformers renders it.

A chat template is a Jinja program shipped with a tokenizer (``tokenizer_config.json``'s ``"chat_template"``
or a ``chat_template.jinja`` file). `render_chat` runs one the way
``transformers.PreTrainedTokenizerBase.apply_chat_template`` does, so the text (and so the ids) are equal:

    environment   Jinja's ``ImmutableSandboxedEnvironment`` (templates come from the Hub: untrusted code),
                  ``trim_blocks`` and ``lstrip_blocks`` on, the ``loopcontrols`` extension ({% break %}),
                  and ``{% generation %}`` (marks assistant text for training masks; rendered as its body)
    globals       ``raise_exception(msg)`` (a `ChatTemplateError` with the template's message),
                  ``strftime_now(fmt)`` (today's date: Llama 3.2 prints it), ``namespace`` and ``dict``
                  that refuse names starting with ``_``
    filters       ``tojson`` as ``json.dumps`` with ``ensure_ascii=False`` (Jinja's own escapes HTML
                  characters) and ``indent`` / ``separators`` / ``sort_keys``
    variables     ``messages``, ``tools``, ``documents``, ``add_generation_prompt``, the tokenizer's special
                  tokens (``bos_token``, ``eos_token``, ...) and any extra keyword (``date_string``,
                  ``enable_thinking``), which override the tokens

The messages are copied to plain data first (a template may not reach a caller's objects), keys whose
value is None are dropped (OpenAI clients send ``"content": None`` beside tool calls), and a message's
reasoning under ``reasoning_content`` / ``thinking`` / ``reasoning`` is copied to the first two names,
which templates read. ``continue_final_message`` leaves the last message open for the model to continue:
the message is rendered with a marker after it and the text is cut at the marker.

Each template string is compiled once (`_compiled` caches it); jinja2 is imported on first use only.

A template comes from anywhere, so its render is bounded (`_BoundedEnvironment`): the text it writes and
every string or list it builds (``*``, ``+``, ``~``, ``**``, str methods and filters that pad to a width)
stay under `MAX_CHARS`, the ``range()`` loops of one render under `MAX_LOOP_STEPS` steps together, and
recursion is caught; a template past a bound is a `ChatTemplateError` naming its file, never gigabytes of
memory or a process killed. A template that renders nothing for a conversation is refused too.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterator, Mapping, Sequence
from contextvars import ContextVar
from datetime import datetime
from functools import lru_cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import jinja2
    import jinja2.ext
    import jinja2.sandbox


class ChatTemplateError(ValueError):
    """A chat template that cannot render a conversation, or a conversation it cannot take; the message
    names the template's file (or argument) and the problem."""


# The bounds of one render (module docstring): far above any real chat template's needs (the longest prompts
# are a model's context, ~10^6 characters), far below what would exhaust memory or time.
MAX_CHARS = 1 << 23  # characters of the output, and of any one string or list built on the way
MAX_LOOP_STEPS = 1_000_000  # range() items of one render, all loops together
MAX_WIDTH = 10_000  # a padding width, an indent, a format's field width or precision
MAX_POWER_BITS = 1 << 16  # bits of an integer power (9 ** 9 ** 9 would take minutes and gigabytes)
_LOOP_STEPS: ContextVar[list[int]] = ContextVar("chat_template_loop_steps")


class _TooBig(ChatTemplateError):
    """A template past one of the render's bounds."""


# Where transformers and chat templates look for a message's reasoning; the first two are what templates read.
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
# Appended to the message to continue and cut off again: it marks where the message's text ends.
_CONTINUE_MARK = "ZOO_CONTINUE_FINAL_MESSAGE "


def default_template(*, bos: bool, eos: bool) -> str:
    """zoo's template for a tokenizer without one: ``<role>: <content>`` per message, each closed by eos.

    ``bos`` / ``eos``: whether the tokenizer has those tokens (the template writes only what it has).
    ``add_generation_prompt`` appends ``assistant:``, so a model trained on this format answers after it
    and stops at the eos that closes its turn. A content given as parts writes their ``"text"``.
    """
    content = (
        "{% if message['content'] is string %}{{ message['content'] }}"
        "{% else %}{% for part in message['content'] if part['type'] == 'text' %}{{ part['text'] }}"
        "{% endfor %}{% endif %}"
    )
    return (
        ("{{ bos_token }}" if bos else "")
        + "{% for message in messages %}{{ message['role'] }}: "
        + content
        + ("{{ eos_token }}" if eos else "{{ '\\n' }}")  # an expression: trim_blocks eats a bare newline
        + "{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"
    )


def render_chat(
    template: str,
    messages: Sequence[Mapping[str, Any]],
    *,
    where: str,
    special_tokens: Mapping[str, str],
    add_generation_prompt: bool = False,
    continue_final_message: bool | str = False,
    tools: Sequence[Mapping[str, Any]] | None = None,
    documents: Sequence[Mapping[str, Any]] | None = None,
    template_kwargs: Mapping[str, Any] | None = None,
) -> str:
    """The text ``template`` renders for ``messages``, equal to transformers' ``apply_chat_template(...,
    tokenize=False)``. ``where`` names the template in errors (its file); ``special_tokens`` are the
    ``{"bos_token": "<s>", ...}`` variables; ``continue_final_message`` (True for ``"content"``, or the
    field's name) leaves the last message open. Every problem is one `ChatTemplateError`."""
    chat = check_messages(messages)
    if continue_final_message and add_generation_prompt:
        raise ChatTemplateError(
            "continue_final_message and add_generation_prompt cannot both be set: the first continues the "
            "last message, the second opens a new assistant message"
        )
    variables = {
        **special_tokens,
        **_plain(dict(template_kwargs or {})),
        "messages": chat,
        "tools": _check_list(tools, "tools"),
        "documents": _check_list(documents, "documents"),
        "add_generation_prompt": add_generation_prompt,
    }
    compiled = _compile(template, where)
    if not continue_final_message:
        return _render(compiled, variables, where)
    field = continue_final_message if isinstance(continue_final_message, str) else "content"
    text = _mark_final_message(chat, field, template)
    rendered = _render(compiled, variables, where)
    if text.strip() not in rendered or _CONTINUE_MARK.strip() not in rendered:
        raise ChatTemplateError(
            f"{where}: continue_final_message is set but the template changes the last message's "
            f"{field!r} (its text is not in the rendered chat), so there is nothing to continue"
        )
    cut = rendered.rindex(_CONTINUE_MARK.strip())
    if rendered[cut : cut + len(_CONTINUE_MARK)] == _CONTINUE_MARK:
        return rendered[:cut]
    return rendered[:cut].rstrip()  # the template trimmed the message, so trim what is before the mark too


def check_messages(messages: Any) -> list[dict[str, Any]]:
    """``messages`` as plain dicts (None values dropped, reasoning aliased), each checked: a mapping with a
    string ``"role"`` and a ``"content"`` that is a string or a list of ``{"type": ...}`` parts (absent
    only beside ``"tool_calls"``). A bad one is a `ChatTemplateError` naming its index and field."""
    if isinstance(messages, (str, bytes, Mapping)) or not isinstance(messages, Sequence) or not messages:
        raise ChatTemplateError(
            "messages must be a non-empty list of {'role': ..., 'content': ...} mappings, got "
            + (f"an empty {type(messages).__name__}" if not messages else type(messages).__name__)
        )
    chat = []
    for i, message in enumerate(messages):
        message = _plain(message)
        if not isinstance(message, dict):
            raise ChatTemplateError(
                f"messages[{i}] must be a mapping with 'role' and 'content', got {type(message).__name__}"
            )
        message = {key: value for key, value in message.items() if value is not None}
        if not isinstance(message.get("role"), str):
            raise ChatTemplateError(f"messages[{i}]['role'] {_wanted(message, 'role', 'a string')}")
        _check_content(message, i)
        reasoning = next((message[key] for key in _REASONING_FIELDS if key in message), None)
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        chat.append(message)
    return chat


def _check_content(message: dict[str, Any], i: int) -> None:
    content = message.get("content")
    if content is None and "tool_calls" in message:
        return  # an assistant message that only calls tools
    if isinstance(content, str):
        return
    if not isinstance(content, list):
        wanted = "a string or a list of {'type': 'text', 'text': ...} parts"
        raise ChatTemplateError(f"messages[{i}]['content'] {_wanted(message, 'content', wanted)}")
    for j, part in enumerate(content):
        where = f"messages[{i}]['content'][{j}]"
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise ChatTemplateError(
                f"{where} must be a mapping with a string 'type' (such as 'text'), got {part!r}"
            )
        if part["type"] == "text" and not isinstance(part.get("text"), str):
            raise ChatTemplateError(f"{where}['text'] {_wanted(part, 'text', 'a string')}")


def _wanted(mapping: dict[str, Any], key: str, wanted: str) -> str:
    if key not in mapping:
        return f"is missing (must be {wanted})"
    return f"must be {wanted}, got {type(mapping[key]).__name__}"


def _check_list(items: Any, name: str) -> list[Any] | None:
    """``tools`` / ``documents`` as plain data: None, or a list of mappings (JSON schemas, documents)."""
    if items is None:
        return None
    if isinstance(items, (str, bytes, Mapping)) or not isinstance(items, Sequence):
        raise ChatTemplateError(
            f"{name} must be a list of mappings (JSON schemas), got {type(items).__name__}"
        )
    plain = _plain(list(items))
    for i, item in enumerate(plain):
        if not isinstance(item, dict):
            raise ChatTemplateError(
                f"{name}[{i}] must be a mapping (a JSON schema such as {{'type': 'function', 'function': "
                f"{{...}}}}), got {type(item).__name__}"
            )
    return plain


def _mark_final_message(chat: list[dict[str, Any]], field: str, template: str) -> str:
    """Append the marker to the last message's ``field`` (in place); returns the text it marks."""
    final = chat[-1].get(field)
    if final is None:
        raise ChatTemplateError(
            f"continue_final_message is set but the last message has no {field!r} to continue"
        )
    fields = [field]
    if field in _REASONING_FIELDS:  # the reasoning is under several names: mark each the template may read
        fields = [name for name in _REASONING_FIELDS if chat[-1].get(name) == final]
    if not any(name in template for name in fields):
        raise ChatTemplateError(
            f"continue_final_message is set to {field!r} but the chat template never reads that field"
        )
    if isinstance(final, list):
        for part in reversed(final):
            if isinstance(part, dict) and "text" in part:
                text = str(part["text"])
                part["text"] = text + _CONTINUE_MARK
                return text
        raise ChatTemplateError("continue_final_message is set but the last message has no text part")
    if not isinstance(final, str):
        raise ChatTemplateError(
            f"continue_final_message is set but the last message's {field!r} is {type(final).__name__}, "
            "not text"
        )
    for name in fields:
        chat[-1][name] = chat[-1][name] + _CONTINUE_MARK
    return final


def _render(compiled: jinja2.Template, variables: dict[str, Any], where: str) -> str:
    import jinja2

    token = _LOOP_STEPS.set([0])  # this render's loop steps (a render inside a render keeps its own)
    try:
        text = _bounded_text(compiled.generate(**variables))
    except _TooBig as error:
        raise ChatTemplateError(
            f"{where}: the chat template goes past a bound of zoo's renderer: {error}"
        ) from None
    except RecursionError:
        raise ChatTemplateError(
            f"{where}: the chat template recurses without end (a macro or loop that calls itself)"
        ) from None
    except ChatTemplateError as error:  # the template's own raise_exception (or an empty rendering)
        raise ChatTemplateError(f"{where}: the chat template refused the messages: {error}") from None
    except (
        jinja2.TemplateError,
        TypeError,
        ValueError,
        LookupError,
        AttributeError,
        ArithmeticError,
    ) as error:
        reason = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
        raise ChatTemplateError(f"{where}: the chat template failed on these messages: {reason}") from None
    finally:
        _LOOP_STEPS.reset(token)
    if not text.strip():  # a prompt of nothing: training on it learns nothing, generating from it fails
        raise ChatTemplateError(f"{where}: the chat template renders nothing for these messages")
    return text


def _bounded_text(pieces: Iterator[str]) -> str:
    """The rendered pieces joined, stopped as soon as they pass `MAX_CHARS`."""
    out, size = [], 0
    for piece in pieces:
        size += len(piece)
        if size > MAX_CHARS:
            raise _TooBig(f"it writes more than {MAX_CHARS:,} characters")
        out.append(piece)
    return "".join(out)


def _sized(value: Any) -> Any:
    """``value``, or `_TooBig` when it is a string or list longer than `MAX_CHARS`."""
    if isinstance(value, str | list | tuple) and len(value) > MAX_CHARS:
        raise _TooBig(f"it builds a {type(value).__name__} of {len(value):,} items (at most {MAX_CHARS:,})")
    return value


def _check_width(width: Any, what: str) -> None:
    if isinstance(width, int) and not isinstance(width, bool) and width > MAX_WIDTH:
        raise _TooBig(f"{what} {width:,} (at most {MAX_WIDTH:,})")


_FORMAT_NUMBERS = re.compile(r"\d+")


def _check_format(fmt: Any) -> None:
    """A %-format or str.format string whose widths and precisions stay under `MAX_WIDTH`."""
    if isinstance(fmt, str):
        for number in _FORMAT_NUMBERS.findall(fmt):
            if len(number) > 5 or int(number) > MAX_WIDTH:
                raise _TooBig(f"a format with a field width or precision of {number} (at most {MAX_WIDTH:,})")


def _bounded_range(*args: Any) -> range:
    """``range()``, its items counted against the render's `MAX_LOOP_STEPS` (counted when made: a loop that
    would run too long is refused before it runs)."""
    steps = range(*args)
    count = _LOOP_STEPS.get([0])
    count[0] += len(steps)
    if count[0] > MAX_LOOP_STEPS:
        raise _TooBig(f"its range() loops take more than {MAX_LOOP_STEPS:,} steps")
    return steps


def _bounded_binop(operator: str, left: Any, right: Any) -> Any:
    if operator == "*":
        sequence, count = (left, right) if isinstance(left, str | list | tuple) else (right, left)
        sized = isinstance(sequence, str | list | tuple) and isinstance(count, int)
        if sized and len(sequence) * count > MAX_CHARS:
            raise _TooBig(f"it repeats a {type(sequence).__name__} into {len(sequence) * count:,} items")
        return left * right
    if operator == "**":
        integers = isinstance(left, int) and isinstance(right, int) and right > 0
        if integers and right * max(abs(left).bit_length(), 1) > MAX_POWER_BITS:
            raise _TooBig(f"it raises {left} to the power {right:,}")
        return left**right
    return _sized(left + right)  # "+"


def _compile(template: str, where: str) -> jinja2.Template:
    import jinja2

    if not isinstance(template, str):
        raise ChatTemplateError(f"{where}: a chat template must be a string, got {type(template).__name__}")
    try:
        return _compiled(template)
    except jinja2.TemplateSyntaxError as error:
        raise ChatTemplateError(
            f"{where}: the chat template is not valid Jinja (line {error.lineno}): {error.message}"
        ) from None
    except (
        RecursionError,
        SyntaxError,
        MemoryError,
    ) as error:  # Jinja's parser and Python's compiler recurse
        reason = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
        raise ChatTemplateError(
            f"{where}: the chat template is nested too deeply to compile (blocks or brackets some hundreds "
            f"deep: {reason})"
        ) from None


@lru_cache(maxsize=64)
def _compiled(template: str) -> jinja2.Template:
    """``template`` compiled, once per string (a tokenizer renders every prompt with the same one)."""
    return _environment().from_string(template)


@lru_cache(maxsize=1)
def _environment() -> jinja2.Environment:
    """The sandboxed environment transformers renders chat templates in (module docstring), built once,
    with the render's bounds (`_bounded_environment`) and transformers' extension, filters and globals."""
    import jinja2.ext

    env = _bounded_environment()(
        trim_blocks=True, lstrip_blocks=True, extensions=[_generation_extension(), jinja2.ext.loopcontrols]
    )
    for name, check in (("center", "center to"), ("indent", "indent by"), ("wordwrap", "wrap at")):
        env.filters[name] = _width_checked(env.filters[name], check)
    env.filters["format"] = _format_checked(env.filters["format"])
    env.globals["lipsum"] = _lipsum_checked(env.globals["lipsum"])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _Dict()
    env.globals["namespace"] = _namespace()
    return env


def _generation_extension() -> type[jinja2.ext.Extension]:
    """``{% generation %}...{% endgeneration %}``: marks assistant text; rendered as its body."""
    import jinja2.ext
    import jinja2.nodes

    class Generation(jinja2.ext.Extension):
        tags = {"generation"}  # noqa: RUF012 (jinja declares it a plain attribute of Extension)

        def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller: Any) -> str:
            return str(caller())

    return Generation


def _namespace() -> type:
    """Jinja's ``namespace()``, refusing names that start with ``_`` (a way to Python's internals)."""
    import jinja2

    def check_name(name: object) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"a chat template may not set {name!r} on a namespace")

    class Namespace(jinja2.utils.Namespace):
        def __init__(*args: Any, **kwargs: Any) -> None:  # Jinja's own signature: namespace(self=...) works
            self, values = args[0], dict(*args[1:], **kwargs)
            for name in values:
                check_name(name)
            jinja2.utils.Namespace.__init__(self, values)

        def __setitem__(self, name: str, value: Any) -> None:
            check_name(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

    return Namespace


def _bounded_environment() -> type[jinja2.sandbox.ImmutableSandboxedEnvironment]:
    """The sandbox with the render's bounds (module docstring): ``a ~ b``, ``*``, ``**`` and ``+``, range,
    and the str methods that pad to a width or format are checked; every call's result is sized."""
    import jinja2.compiler
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class BoundedCodeGenerator(jinja2.compiler.CodeGenerator):
        """``a ~ b`` through `_sized`, so doubling a string in a loop is stopped at `MAX_CHARS`."""

        def visit_Concat(self, node: jinja2.nodes.Concat, frame: jinja2.compiler.Frame) -> None:
            self.write("environment.sized(")
            super().visit_Concat(node, frame)
            self.write(")")

    class BoundedEnvironment(ImmutableSandboxedEnvironment):
        code_generator_class = BoundedCodeGenerator
        intercepted_binops = frozenset({"*", "**", "+"})

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.globals["range"] = _bounded_range
            self.sized = _sized

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            return _bounded_binop(operator, left, right)

        def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
            method = getattr(__obj, "__wrapped__", __obj)  # the sandbox wraps str.format in a function
            name, owner = getattr(method, "__name__", ""), getattr(method, "__self__", None)
            if isinstance(owner, str):  # a str method: the ones that pad to a width
                if name in ("center", "ljust", "rjust", "zfill", "expandtabs"):
                    _check_width(args[0] if args else next(iter(kwargs.values()), 0), f"str.{name} to")
                if name in ("format", "format_map"):
                    _check_format(owner)
            return _sized(super().call(__context, __obj, *args, **kwargs))

    return BoundedEnvironment


def _width_checked(filter_: Any, what: str) -> Any:
    def checked(value: Any, width: Any = 80, *args: Any, **kwargs: Any) -> Any:
        _check_width(width, what)
        return filter_(value, width, *args, **kwargs)

    return checked


def _format_checked(filter_: Any) -> Any:
    def checked(value: Any, *args: Any, **kwargs: Any) -> Any:
        _check_format(value)
        return _sized(filter_(value, *args, **kwargs))

    return checked


def _lipsum_checked(lipsum: Any) -> Any:
    def checked(n: int = 5, *args: Any, **kwargs: Any) -> Any:
        _check_width(n * 100, "lorem ipsum of (paragraphs x 100)")
        return lipsum(n, *args, **kwargs)

    return checked


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: Any = None,
    sort_keys: bool = False,
) -> str:
    _check_width(indent, "tojson indent of")
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _raise_exception(message: object) -> None:
    raise ChatTemplateError(str(message))


def _strftime_now(fmt: str) -> str:
    if isinstance(fmt, str) and len(fmt) > 256:
        raise _TooBig(f"strftime_now's format is {len(fmt):,} characters (at most 256)")
    return _sized(datetime.now().strftime(fmt))


class _Dict:
    """``dict(...)`` in a template, without the type itself (whose attributes lead out of the sandbox)."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any) -> dict[Any, Any]:
        return dict.fromkeys(*args)


def _plain(value: Any) -> Any:
    """``value`` rebuilt from plain JSON-like types, so that a template sees data, never a caller's objects
    (whose methods the sandbox does not know to be unsafe): pydantic models (the openai client's messages)
    and dataclasses become dicts, str / int / float subclasses their base type, anything else a
    ``"<TypeName>"`` placeholder."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_plain(key): _plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_plain(item) for item in value]
    if isinstance(value, tuple):
        return tuple(_plain(item) for item in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {field.name: _plain(getattr(value, field.name)) for field in dataclasses.fields(value)}
    if callable(getattr(value, "model_dump", None)):
        return _plain(value.model_dump())
    if hasattr(value, "item") and callable(value.item) and getattr(value, "ndim", None) == 0:
        return _plain(value.item())  # a numpy / torch scalar: its number, not a truthy placeholder
    return f"<{type(value).__name__}>"
