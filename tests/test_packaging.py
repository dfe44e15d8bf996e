"""A non-editable install in a fresh venv still finds the presets (they ship inside the wheel)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_wheel_carries_presets_and_an_installed_zoo_finds_them(tmp_path):
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(tmp_path / "dist"), str(ROOT)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert build.returncode == 0, build.stderr[-2000:]
    wheel = next((tmp_path / "dist").glob("transformer_zoo-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert "zoo/presets/transformer-base.yaml" in names and "zoo/presets/gpt2.yaml" in names

    venv = tmp_path / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True, timeout=120
    )
    python = venv / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "--no-deps", "--force-reinstall", str(wheel)], check=True,
                   capture_output=True, timeout=600)  # fmt: skip
    probe = "import zoo, zoo.spec; print(zoo.spec.presets_dir()); print(len(zoo.list_presets()))"
    result = subprocess.run(
        [str(python), "-c", probe], capture_output=True, text=True, cwd=tmp_path, timeout=120
    )
    assert result.returncode == 0, result.stderr
    where, count = result.stdout.split()
    assert "site-packages" in where and int(count) >= 15
