"""`zoo presets`, `zoo schema` and `zoo --version`, run as the console script a user runs: names never
cut, plain text into pipes, a closed pipe ends quietly."""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import subprocess
import sys
from io import StringIO
from pathlib import Path

import pytest
from rich.console import Console
from rich.text import Text

import zoo
import zoo.cli
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


# -- names are never cut ------------------------------------------------------------------------------------


def whole_word(name: str, text: str) -> bool:
    """``name`` appears in ``text`` with no name characters glued to either side (gpt2 is not gpt2-tiny)."""
    return re.search(rf"(?<![\w.-]){re.escape(name)}(?![\w.-])", text) is not None


@pytest.mark.parametrize("columns", ["80", "40"])
def test_presets_piped_prints_every_name_whole_in_plain_text(columns: str) -> None:
    env = {
        k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE")
    }
    result = subprocess.run(
        [sys.executable, "-m", "zoo", "presets"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**env, "COLUMNS": columns},
    )
    assert result.returncode == 0, result.stderr
    missing = [name for name in zoo.list_presets() if not whole_word(name, result.stdout)]
    assert not missing, f"cut at COLUMNS={columns}: {missing}\n{result.stdout}"
    assert not set("│┃━─┏└") & set(result.stdout), "a pipe gets plain text, not box drawing"
    header, *rows = result.stdout.splitlines()
    assert header.split() == ["name", "family", "layers", "d_model", "heads", "parameters"]
    assert len(rows) == len(zoo.list_presets()) and all(len(row.split()) == 6 for row in rows)


@pytest.mark.parametrize("width", [200, 80, 40])
def test_presets_on_a_terminal_keeps_every_name_whole(monkeypatch, width: int) -> None:
    out = StringIO()
    monkeypatch.setattr(zoo.cli, "console", Console(file=out, width=width, force_terminal=True))
    assert main(["presets"]) == 0
    text = Text.from_ansi(out.getvalue()).plain
    assert max(map(len, text.splitlines())) <= width or "│" not in text  # a table fits; else plain rows
    missing = [name for name in zoo.list_presets() if not whole_word(name, text)]
    assert not missing, f"cut at width {width}: {missing}\n{text}"
    assert "124,439,808" in text


# -- pipes, version -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", [["schema"], ["presets"]])
def test_a_reader_that_goes_away_ends_the_command_quietly(command: list[str]) -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "zoo", *command], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    process.stdout.close()  # before zoo writes a byte: its first write meets a closed pipe (EPIPE)
    _, err = process.communicate(timeout=120)
    err = err.decode()
    assert "Traceback" not in err and "Exception ignored" not in err and "Broken pipe" not in err, err
    assert process.returncode == 141  # 128 + SIGPIPE, what a shell reports for `yes | head`


def test_version_names_the_installed_distribution(capsys) -> None:
    with pytest.raises(SystemExit) as exit:
        main(["--version"])
    assert exit.value.code == 0
    expected = next((v for d in ("transformer-zoo", "zoo") if (v := _installed_version(d))), zoo.__version__)
    assert capsys.readouterr().out.strip() == f"zoo {expected}"


def _installed_version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def test_version_without_installed_metadata_falls_back_to_the_package(monkeypatch) -> None:
    def not_installed(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    assert zoo.cli.version() == zoo.__version__
