"""What `zoo show`, `zoo presets`, `zoo diff` and a refused `zoo eval` import: only what they use. torch's compiler (torch._dynamo,
sympy) is a second or more of start-up, transformers and lm-eval several more; wall times are measured by
hand (docs/inspect.md), never asserted here, where the machine's load makes them noise."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from zoo.io.names import PRESET_COUNTS_NAME

ROOT = Path(__file__).resolve().parents[2]

# Runs the command in a fresh interpreter, then prints which of the watched modules it imported.
_PROBE = """
import contextlib, io, json, sys
from zoo.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    status = main(sys.argv[1:])
print(json.dumps({"status": status, "imported": [m for m in WATCHED if m in sys.modules]}))
"""

HEAVY = ("torch._dynamo", "sympy", "transformers", "lm_eval", "tokenizers", "zoo.io.hf")


def _imported(*argv: str | Path, cache: Path | None = None) -> tuple[int, list[str]]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if cache is not None:
        env["XDG_CACHE_HOME"] = str(cache)
    done = subprocess.run(
        [sys.executable, "-c", _PROBE.replace("WATCHED", repr((*HEAVY, "torch"))), *map(str, argv)],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        check=True,
        timeout=120,
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return result["status"], result["imported"]


# 2-3 s a start-up. By default `show` once: an encoder-decoder's build on meta is in `presets`' (every preset),
# and `presets` on an empty cache is the first listing of test_presets_counts_come_from_the_cache_until_zoo_changes.
@pytest.mark.parametrize(
    "argv",
    [
        ("show", "gpt2"),
        pytest.param(("show", "transformer-base"), marks=pytest.mark.slow),
        pytest.param(("presets",), marks=pytest.mark.slow),
    ],
)
def test_show_and_presets_import_neither_the_compiler_nor_transformers(
    argv: tuple[str, ...], tmp_path: Path
) -> None:
    status, imported = _imported(*argv, cache=tmp_path)  # an empty cache: presets builds every count
    assert status == 0
    assert "torch" in imported  # the meta-device build: parameter counts have one source of truth
    assert not set(imported) & set(HEAVY), imported


def test_presets_counts_come_from_the_cache_until_zoo_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first listing builds (and imports torch); the next reads the counts back and imports no torch;
    a changed file of zoo's makes the cache stale."""
    import zoo
    from zoo.cli import presets

    assert _imported("presets", cache=tmp_path)[1] == ["torch"]
    assert _imported("presets", cache=tmp_path) == (0, [])
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    rows = {row["name"]: row["parameters"] for row in presets.preset_rows()}
    assert rows["gpt2"] == zoo.build("gpt2", device="meta").num_parameters() == 124_439_808
    stale = tmp_path / "zoo" / PRESET_COUNTS_NAME
    stale.write_text(stale.read_text().replace(str(rows["gpt2"]), "1"))  # a wrong count, same stamp: read
    assert {r["name"]: r["parameters"] for r in presets.preset_rows()}["gpt2"] == 1
    monkeypatch.setattr(presets, "_code_stamp", lambda: "zoo changed")  # another stamp: built again
    assert {r["name"]: r["parameters"] for r in presets.preset_rows()}["gpt2"] == rows["gpt2"]


def test_diff_of_presets_imports_no_torch() -> None:
    status, imported = _imported("diff", "gpt2", "gpt2-medium")
    assert status == 1 and imported == []


def test_eval_refuses_a_missing_model_folder_before_importing_lm_eval(tmp_path: Path) -> None:
    status, imported = _imported("eval", tmp_path / "missing", "--tasks", "hellaswag")
    assert status == 2 and "lm_eval" not in imported


def test_eval_refuses_an_unknown_task_before_importing_lm_eval(tmp_path: Path) -> None:
    """lm-eval's import is a second, its task index ten and more: a name no task file mentions costs neither."""
    pytest.importorskip("lm_eval")
    for name in ("spec.json", "tokenizer.json"):  # what `zoo.io.pretrained.pretrained_kind` looks for
        (tmp_path / name).write_text("{}")
    status, imported = _imported("eval", tmp_path, "--tasks", "hellaswag,no_such_task_anywhere")
    assert status == 2 and "lm_eval" not in imported
