"""Chat messages -> the prompt text a model continues, through its tokenizer's chat template.

A tokenizer with a template (``tok.has_chat_template``) renders the messages with it, the assistant's turn
opened (``add_generation_prompt``); one without gets plain "role: content" lines and "assistant:", which a
model fine-tuned on no particular format continues as well as any.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from zoo.serving.requests import RequestError

ROLES = ("system", "developer", "user", "assistant", "tool")


def message_text(content: Any, index: int) -> str:
    """A message's content: a string, or OpenAI's list of ``{"type": "text", "text": ...}`` parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(
        isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)
        for part in content
    ):
        return "".join(part["text"] for part in content)
    raise RequestError(
        f"messages[{index}].content must be a string or a list of text parts",
        param=f"messages[{index}].content",
    )


def check_messages(messages: Any) -> list[dict[str, str]]:
    """The messages as ``[{"role", "content"}]``, or `RequestError` naming the bad one."""
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages must be a non-empty list of {role, content} objects", param="messages")
    checked = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            raise RequestError(
                f"messages[{i}].role must be one of {', '.join(ROLES)}", param=f"messages[{i}].role"
            )
        checked.append({"role": message["role"], "content": message_text(message.get("content"), i)})
    return checked


def render_chat(tokenizer: Any, messages: Sequence[dict[str, str]]) -> tuple[str, bool]:
    """(the prompt text, whether it came from the tokenizer's template — which then holds any bos token)."""
    if getattr(tokenizer, "has_chat_template", False):
        return tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=False), True
    lines = [f"{m['role']}: {m['content']}" for m in messages]
    return "\n".join([*lines, "assistant:"]), False
