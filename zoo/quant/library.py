"""torchao, the library that does the quantising: imported on first use, quietly, or refused in one line.

torchao is an optional extra (``pip install -e '.[quant]'``). Importing it logs a warning for
each CUDA-only extension it cannot load on a CPU build of torch, and torch logs one about an Enum that
torchao registers with pytree; neither says anything about weight-only quantisation, so both loggers are
quieted for the duration of the import (and restored after it).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import logging
from types import ModuleType

from zoo._extras import install_hint

__all__ = ["INSTALL_HINT", "QuantizationError", "TorchaoMissingError", "import_torchao", "torchao_version"]

INSTALL_HINT = f"weight-only quantisation needs torchao: {install_hint('quant')}"

# The loggers that speak while torchao is imported on a CPU build: its own (".so" extensions it cannot
# load) and torch's pytree (an Enum registration torch now deprecates).
_NOISY_LOGGERS = ("torchao", "torch.utils._pytree")


class QuantizationError(ValueError):
    """A model or a setting `zoo.quant` cannot quantise, or a quantised tensor it cannot read back; the
    message names the tensor or the setting and what was expected."""


class TorchaoMissingError(QuantizationError, ImportError):
    """torchao is not installed (an ``ImportError`` too): the message says how to install it."""


def import_torchao(module: str = "torchao.quantization") -> ModuleType:
    """A torchao module (default ``torchao.quantization``), imported with its CUDA-extension warnings
    silenced; `TorchaoMissingError` when torchao is not installed."""
    loggers = [logging.getLogger(name) for name in _NOISY_LOGGERS]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        return importlib.import_module(module)
    except ImportError as error:
        if importlib.util.find_spec("torchao") is None:
            raise TorchaoMissingError(INSTALL_HINT) from None
        raise QuantizationError(
            f"the installed torchao ({torchao_version()}) has no {module} ({error}); zoo.quant needs torchao>=0.14"
        ) from None
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def torchao_version() -> str:
    """The installed torchao's version (its distribution metadata, else its ``__version__``)."""
    try:
        return importlib.metadata.version("torchao")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"
