"""Text read from files, made safe to print: no terminal control characters, no escape sequences.

A checkpoint's spec name, a preset's ``source:``, a tokenizer's tokens, a generated text, the message of an
error that quotes a file: all come from files anyone could have written. Printed raw, ``"\\x1b[2J"`` clears
the screen, ``"\\x1b]0;...\\x07"`` retitles the window, and worse sequences exist (some terminals answer
queries by typing into the shell). Every command prints such text through `clean` (rich markup through
`markup`), as ``less`` and ``git`` do: escape sequences are dropped whole; what remains of C0 and C1
controls (carriage return, backspace, bell, DEL) is dropped too, except tab and newline.
"""

from __future__ import annotations

import json
import re
from typing import Any

# ECMA-48: CSI (ESC [ params intermediates final), OSC (ESC ] ... BEL or ST), the string sequences DCS, SOS,
# PM, APC (ESC P/X/^/_ ... ST), any other ESC with its one following character; then the 8-bit CSI and OSC.
_ESCAPE_SEQUENCE = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]?"
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?"
    r"|\x1b[PX^_][^\x1b]*(?:\x1b\\)?"
    r"|\x1b[ -~]?"
    r"|\x9b[0-?]*[ -/]*[@-~]?"
    r"|\x9d[^\x07\x1b\x9c]*[\x07\x9c]?"
)
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # C0 but tab and newline, DEL, C1
_C1 = re.compile(r"[\x7f-\x9f]")


def clean(text: object) -> str:
    """``str(text)`` without escape sequences or control characters other than tab and newline."""
    return _CONTROL.sub("", _ESCAPE_SEQUENCE.sub("", str(text)))


def markup(text: object) -> str:
    """`clean` text, escaped for rich markup (``[viz]`` stays text): for f-strings given to ``console.print``."""
    from rich.markup import escape

    return escape(clean(text))


def json_text(data: Any, *, indent: int | None = 2) -> str:
    """``json.dumps(data, ensure_ascii=False)`` with DEL and C1 controls written as ``\\u`` escapes.

    JSON escapes C0 controls itself; the others pass through ``ensure_ascii=False`` raw. Escaped, they are
    the same data to a JSON reader and nothing to a terminal.
    """
    text = json.dumps(data, indent=indent, ensure_ascii=False)
    return _C1.sub(lambda match: f"\\u{ord(match.group()):04x}", text)
