"""`zoo presets` and `zoo schema`, run as the console script a user runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from zoo.cli import main


def run_zoo(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "200"}  # rich fits tables to the terminal; give it room
    return subprocess.run(
        [sys.executable, "-m", "zoo", *args], capture_output=True, text=True, timeout=120, env=env
    )


def test_presets_table_lists_every_preset_with_counts():
    result = run_zoo("presets")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    for expected in (
        "transformer-base",
        "encoder-decoder",
        "gpt2",
        "124,439,808",
        "bert-base",
        "109,482,240",
    ):
        assert expected in out


def test_schema_is_json_schema_of_the_spec():
    result = run_zoo("schema")
    assert result.returncode == 0, result.stderr
    schema = json.loads(result.stdout)
    assert schema["title"] == "ModelSpec" and "discriminator" in json.dumps(schema)


def test_schema_writes_a_file(tmp_path):
    assert main(["schema", "--out", str(tmp_path / "schema.json")]) == 0
    assert json.loads((tmp_path / "schema.json").read_text())["title"] == "ModelSpec"


SCRIPT = Path(sys.executable).parent / "zoo"


@pytest.mark.skipif(not SCRIPT.exists(), reason="zoo is not pip-installed in this interpreter's environment")
def test_console_script_is_installed():
    result = subprocess.run([str(SCRIPT), "--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "presets" in result.stdout
