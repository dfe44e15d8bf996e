"""Chat messages -> the prompt a model continues, through its tokenizer's chat template.

The messages are rendered with the tokenizer's template, the assistant's turn opened
(``add_generation_prompt``); a tokenizer without one (those zoo trains) uses zoo's default template, the one
`task: chat` fine-tunes with. The answer ends at the model's eos or at the token the template closes an
assistant turn with (`zoo.generation.chat.end_of_turn_ids`: ``<|im_end|>``, ``<|eot_id|>``, ...).

A message's other keys are never dropped unseen: ``name`` reaches the template when it reads it
(``message.name`` / ``message['name']`` in its source), else it is a 400 when set. An assistant's
``tool_calls`` reach a template that renders tool calls (`zoo.serving.tools`), their arguments parsed from
OpenAI's JSON string to the object templates read (an empty content beside them: Qwen 3's template reads
every assistant content); a ``tool`` message's ``tool_call_id`` must name one of those calls, and reaches the
template (Mistral's writes it). The keys of features zoo does not support yet (``refusal``, ``audio``,
``function_call``) are a 400 when set; any other key is a 400 naming it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from zoo.serving.requests import RequestError, valid_text
from zoo.serving.tools import ToolFormat, call_ids, check_tool_calls

ROLES = ("system", "developer", "user", "assistant", "tool")


def message_text(content: Any, index: int) -> str:
    """A message's content: a string, or OpenAI's list of ``{"type": "text", "text": ...}`` parts."""
    where = f"messages[{index}].content"
    if isinstance(content, str):
        return valid_text(content, where)
    if isinstance(content, list) and all(
        isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)
        for part in content
    ):
        return valid_text("".join(part["text"] for part in content), where)
    raise RequestError(
        f"messages[{index}].content must be a string or a list of text parts",
        param=f"messages[{index}].content",
    )


PASSED = ("name",)  # handed to a template that reads it
NOT_YET = ("refusal", "audio", "function_call")


def template_reads(template: str | None, key: str) -> bool:
    """Whether a chat template's source reads ``message.<key>`` (or ``message['<key>']``)."""
    return (
        template is not None
        and re.search(rf"message(\.{key}\b|\[\s*['\"]{key}['\"]\s*\])", template) is not None
    )


def check_messages(
    messages: Any, template: str | None = None, tools: ToolFormat | None = None
) -> list[dict[str, Any]]:
    """The messages as ``[{"role", "content"}]`` (plus ``name`` where ``template``, the chat template's
    source, reads it, and the tool calls and their results where it renders them in format ``tools``), or
    `RequestError` naming the bad one, or a key that would not be acted on."""
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages must be a non-empty list of {role, content} objects", param="messages")
    checked: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            raise RequestError(
                f"messages[{i}].role must be one of {', '.join(ROLES)}", param=f"messages[{i}].role"
            )
        role = message["role"]
        calls = role == "assistant" and message.get("tool_calls") is not None
        content = message.get("content")
        kept: dict[str, Any] = {
            "role": role,
            "content": "" if calls and content is None else message_text(content, i),
        }
        for key, value in message.items():
            where = f"messages[{i}].{key}"
            if key in ("role", "content") or value is None:
                continue
            if key in ("tool_calls", "tool_call_id") and role != (
                "assistant" if key == "tool_calls" else "tool"
            ):
                raise RequestError(
                    f"{where} is only for {'an assistant' if key == 'tool_calls' else 'a tool'} message",
                    param=where,
                )
            if key == "tool_calls":
                if tools is None:
                    raise RequestError(
                        f"{where}: this model's chat template renders no tool calls", param=where
                    )
                kept[key] = check_tool_calls(value, where)
            elif key == "tool_call_id":
                if not isinstance(value, str) or value not in call_ids(checked):
                    raise RequestError(
                        f"{where} must name a tool call of an earlier assistant message, got {value!r}",
                        param=where,
                    )
                kept[key] = value
            elif key in PASSED and template_reads(template, key):
                if not isinstance(value, str):
                    raise RequestError(f"{where} must be a string", param=where)
                kept[key] = valid_text(value, where)
            elif key in PASSED:
                raise RequestError(f"{where} is not used by this model's chat template", param=where)
            elif key in NOT_YET:
                raise RequestError(f"{where} is not supported by zoo serve yet", param=where)
            else:
                raise RequestError(f"unknown field {where}", param=where)
        checked.append(kept)
    return checked


def render_chat(
    tokenizer: Any, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None = None
) -> list[int]:
    """The prompt's token ids: the messages (and ``tools``, the functions' schemas) rendered by the
    tokenizer's chat template (which writes any bos token itself); a template that refuses the conversation
    (Gemma's has no system role) is a `RequestError` naming ``messages``."""
    try:
        ids = tokenizer.apply_chat_template(
            list(messages), add_generation_prompt=True, tokenize=True, **({"tools": tools} if tools else {})
        )
    except ValueError as error:  # ChatTemplateError: the template's own message
        raise RequestError(f"the chat template refused the messages: {error}", param="messages") from None
    return list(ids)
