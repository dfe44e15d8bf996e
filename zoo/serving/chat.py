"""Chat messages -> the prompt a model continues, through its tokenizer's chat template.

The messages are rendered with the tokenizer's template, the assistant's turn opened
(``add_generation_prompt``); a tokenizer without one (those zoo trains) uses zoo's default template, the one
`task: chat` fine-tunes with. The answer ends at the model's eos or at the token the template closes an
assistant turn with (`zoo.generation.chat.end_of_turn_ids`: ``<|im_end|>``, ``<|eot_id|>``, ...).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from zoo.serving.requests import RequestError, valid_text

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


def render_chat(tokenizer: Any, messages: Sequence[dict[str, str]]) -> list[int]:
    """The prompt's token ids: the messages rendered by the tokenizer's chat template (which writes any bos
    token itself); a template that refuses the conversation (Gemma's has no system role) is a `RequestError`
    naming ``messages``."""
    try:
        ids = tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=True)
    except ValueError as error:  # ChatTemplateError: the template's own message
        raise RequestError(f"the chat template refused the messages: {error}", param="messages") from None
    return list(ids)
