"""The one error `zoo.lora` raises for what a user can fix (a `ValueError`: the CLI prints it as one line)."""

from __future__ import annotations


class LoraError(ValueError):
    """An adapter that cannot be applied, saved, loaded or exported; the message names the target or file."""
