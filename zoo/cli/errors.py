"""What `zoo.cli.main` reports as a one-line error, and how.

A user error (a bad value, a missing or unreadable file, a full disk, an unparsable YAML value, CUDA out of
memory) is a one-line message and exit status 2. Anything else is a bug and keeps its traceback. The message
is the exception's own, made to fit one line: pydantic's boilerplate (``[type=..., input_value=...]``, its
documentation URLs) dropped, the lines of a multi-line message joined, terminal controls removed.
"""

from __future__ import annotations

import errno
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from zoo.cli.sanitize import clean

# ENOSPC: the disk is full; EDQUOT: the user's quota is; EFBIG: the file system's file size limit.
_DISK_FULL = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC), errno.EFBIG}

# pydantic's `str(ValidationError)`, should one reach here unformatted: "field\n  msg [type=..., ...]\n
# For further information visit https://errors.pydantic.dev/...".
_PYDANTIC_URL = re.compile(r"\s*For further information visit https?://\S+")
_PYDANTIC_INPUT = re.compile(r" \[type=\w+(?:, input_value=.*?, input_type=\w+)?\]")
_PYDANTIC_FIELD = re.compile(r"(?m)^([\w.\[\]-]+)\n\s+(?:Value error, )?")


def is_user_error(error: BaseException) -> bool:
    """Whether ``error`` is one that user input raises (reported in a line) rather than a bug (a traceback).

    ValueError covers zoo's own errors, pydantic's ValidationError, JSON and UTF-8 decoding; OSError covers
    files and disks. torch's out-of-memory error is the one RuntimeError that is the user's to fix.
    """
    if isinstance(error, ValueError | OSError):
        return True
    yaml = sys.modules.get("yaml")  # checked only where loaded: no import for a command that never read YAML
    if yaml is not None and isinstance(error, yaml.YAMLError):
        return True
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(error, getattr(torch.cuda, "OutOfMemoryError", ()))


def one_line(error: BaseException) -> str:
    """The message of a user error, on one line and safe to print."""
    # A raw OSError(errno, strerror, filename) from a write; zoo's own messages (one argument, e.g. a
    # training run's "what is intact, run --resume") already say more and are kept.
    if isinstance(error, OSError) and error.errno in _DISK_FULL and len(error.args) >= 2:
        where = f"cannot write {error.filename}" if error.filename else "cannot write the output"
        return clean(f"{where}: the disk is full ({error.strerror or 'no space left on device'})")
    text = _validation_text(error) or str(error) or type(error).__name__
    text = _PYDANTIC_FIELD.sub(r"\1: ", _PYDANTIC_INPUT.sub("", _PYDANTIC_URL.sub("", text)))
    if type(error).__name__ == "OutOfMemoryError":
        # "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has ... free. <allocator advice and a URL>"
        text = ". ".join(text.split("\n")[0].split(". ")[:3])
    return _join_lines(clean(text))


def _validation_text(error: BaseException) -> str | None:
    """A pydantic ValidationError as ``invalid Model: field: message; other.field: message``."""
    pydantic = sys.modules.get("pydantic")
    if pydantic is None or not isinstance(error, pydantic.ValidationError):
        return None
    from zoo.spec.errors import SpecValidationError

    if isinstance(error, SpecValidationError):  # already formatted by zoo.spec.errors, without inputs
        return str(error)
    items = [
        f"{'.'.join(str(part) for part in item['loc'])}: {item['msg'].removeprefix('Value error, ')}"
        if item["loc"]
        else item["msg"].removeprefix("Value error, ")
        for item in error.errors()
    ]
    return f"invalid {error.title}: " + "; ".join(items)


def _join_lines(text: str) -> str:
    """``"spec.yaml: invalid spec:\\n  a: x\\n  b: y"`` -> ``"spec.yaml: invalid spec: a: x; b: y"``."""
    head, *rest = [line.strip() for line in text.splitlines() if line.strip()] or [""]
    if not rest:
        return head
    return head + (" " if head.endswith(":") else "; ") + "; ".join(rest)


@contextmanager
def writing(path: str | Path) -> Iterator[None]:
    """Name ``path`` in a full-disk error raised inside without a file name (``write`` gives none).

    Only disk-full errors: they can come from writing alone, so a block that also reads may be wrapped.
    """
    try:
        yield
    except OSError as error:
        if error.filename is not None or error.errno not in _DISK_FULL:
            raise
        raise OSError(error.errno, error.strerror, str(path)) from error
