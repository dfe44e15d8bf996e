"""The errors `zoo.export` raises for what a user can fix (`ValueError`s: the CLI prints them as one line)."""

from __future__ import annotations

from zoo._extras import install_hint

INSTALL_HINT = f"ONNX export needs onnx and onnxscript: {install_hint('onnx')}"


class ExportError(ValueError):
    """A model, an example input or a file `zoo.export` cannot export; the message names it and what was
    expected."""


class OnnxMissingError(ExportError, ImportError):
    """onnx or onnxscript is not installed (an ``ImportError`` too): the message says how to install them."""
