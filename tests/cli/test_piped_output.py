"""Piped, a message is one line however long: rich would break it at its default 80 columns, and a script
reading the output line by line would see half a path."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def test_a_long_message_stays_one_line_when_piped(tmp_path: Path) -> None:
    out = tmp_path / ("an-output-folder-whose-name-alone-is-longer-than-a-terminal-line-" * 2)
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    done = subprocess.run(
        [sys.executable, "-m", "zoo", "convert", "--to-hf", "gpt2-tiny", "--out", str(out)],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    [wrote] = [line for line in done.stdout.splitlines() if line.startswith("wrote ")]
    assert wrote == f"wrote {out} (Hugging Face): decoder, 108,032 parameters"
