"""Reward functions the grpo tests name in their configs (``tests/training/grpo_rewards.py:short``)."""

from __future__ import annotations

from typing import Any


def short(prompts: list[Any], completions: list[str], **columns: Any) -> list[float]:
    """Fewer words, more reward."""
    return [-float(len(c.split())) for c in completions]


def says(prompts: list[Any], completions: list[str], word: list[str], **columns: Any) -> list[float | None]:
    """1 when the completion holds the line's ``word`` column, else 0; None for the word "none" (no opinion)."""
    return [None if w == "none" else float(w in c.split()) for w, c in zip(word, completions)]
