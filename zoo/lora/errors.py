"""The one error `zoo.lora` raises for what a user can fix (a `ValueError`: the CLI prints it as one line)."""

from __future__ import annotations


class LoraError(ValueError):
    """An adapter that cannot be applied, saved, loaded or exported; the message names the target or file.

    ``field`` is the `LoraSpec` field at fault when there is one (``"r"``, ``"targets"``), so that a training
    config can name ``lora.r`` or ``lora.targets``."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field
