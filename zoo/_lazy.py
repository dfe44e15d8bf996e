"""Names a package exports without importing them until first use (PEP 562): `import zoo` stays instant
and free of torch, while `zoo.build`, `zoo.training.Trainer` and friends are one attribute access away."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable
from typing import Any


def lazy_exports(
    package: str, names: dict[str, str], *, submodules: Iterable[str] = (), eager: Iterable[str] = ()
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``.

    ``names`` maps a public name to ``"module:attribute"``, imported (and cached in the package) on first
    access; ``submodules`` are reachable as attributes too; ``eager`` are the names the package defines
    itself, listed by ``dir()``.
    """
    subpackages = tuple(submodules)
    listed = sorted({*eager, *names, *subpackages})

    def __getattr__(name: str) -> Any:
        if name in subpackages:
            return importlib.import_module(f"{package}.{name}")
        if name not in names:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, attribute = names[name].split(":")
        value = getattr(importlib.import_module(module), attribute)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return listed

    return __getattr__, __dir__
