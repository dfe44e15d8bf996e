"""Reward functions for examples/instruct.py's GRPO stage (``task: {kind: grpo, rewards: [...]}``).

Each is called as TRL calls one: ``fn(prompts, completions, **columns)`` with one entry per completion
(``columns``: the prompts' other JSON keys, here ``answer``), and returns one number per completion.
"""

from __future__ import annotations

import re
from typing import Any

SHORT = re.compile(r"It is -?\d+\.")


def correct(prompts: list[Any], completions: list[str], answer: list[int], **columns: Any) -> list[float]:
    """1 when the answer's last number is the right one, else 0."""
    rewards = []
    for text, value in zip(completions, answer):
        numbers = re.findall(r"-?\d+", text)
        rewards.append(float(bool(numbers) and int(numbers[-1]) == value))
    return rewards


def short(prompts: list[Any], completions: list[str], **columns: Any) -> list[float]:
    """1 for an answer in the short form, "It is N.", else 0."""
    return [float(SHORT.fullmatch(text.strip()) is not None) for text in completions]
