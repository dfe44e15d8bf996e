"""The benchmarks never change the work tree unless asked (``--update``), and ``make bench`` stays quick."""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def bench_modules(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(ROOT))


def parse(*argv: str) -> argparse.Namespace:
    from bench import report

    parser = argparse.ArgumentParser()
    report.add_output_options(parser)
    return parser.parse_args(list(argv))


def test_results_go_to_a_folder_git_ignores_unless_update_is_given(bench_modules: None) -> None:
    from bench import report

    default = report.output_dir(parse())
    assert default == ROOT / "bench" / "results" / "local"
    ignored = subprocess.run(
        ["git", "check-ignore", "-q", str(default / "results.json")], cwd=ROOT, capture_output=True
    )
    assert ignored.returncode == 0, f"{default} is not ignored by git: a bench run would dirty the tree"
    assert report.output_dir(parse("--update")) == ROOT / "bench" / "results"
    assert report.output_dir(parse("--out", "elsewhere")) == Path("elsewhere")
    with pytest.raises(SystemExit):
        parse("--out", "elsewhere", "--update")


@pytest.mark.parametrize(
    "module",
    [
        "bench.run",
        "bench.attention",
        "bench.quant",
        "bench.moe",
        "bench.embed",
        "bench.lm_eval",
        "bench.serve",
    ],
)
def test_every_bench_writes_where_the_output_options_say(module: str, bench_modules: None) -> None:
    import importlib
    import inspect

    source = inspect.getsource(importlib.import_module(module).main)
    assert "report.add_output_options(parser)" in source and "report.output_dir(args)" in source
    assert '/ "results"' not in source, f"{module} names the tracked results folder itself"


def test_quick_suite_leaves_out_compiling_and_the_encoder_decoders(bench_modules: None) -> None:
    from bench.workloads import suite

    quick, full = suite(quick=True, device="cpu"), suite(quick=False, device="cpu")
    assert [w.family for w in quick.train] == ["decoder", "encoder"]
    assert all("zoo-compiled" not in w.contenders for w in quick.generate)
    assert any("zoo-compiled" in w.contenders for w in full.generate)
    assert len(full.train) == 5 and any(w.family == "encoder-decoder" for w in full.generate)


def test_moe_bench_runs_on_a_tiny_shape_and_checks_zoo_equals_transformers(
    bench_modules: None, tmp_path: Path
) -> None:
    pytest.importorskip("transformers")
    from bench import moe

    assert moe.main(["--tiny", "--repeats", "1", "--out", str(tmp_path)]) == 0
    record = json.loads((tmp_path / "moe.json").read_text())
    assert max(record["max_difference"].values()) <= moe.TOLERANCE
    contenders = {row["contender"] for row in record["results"]}
    assert {"zoo (mixtral)", "hf mixtral", "zoo (qwen3_moe)", "hf qwen3_moe"} < contenders
    assert {row["mode"] for row in record["results"]} == {"forward", "forward+backward"}
    table = (tmp_path / "moe.md").read_text()
    assert "| forward+backward | zoo (mixtral) |" in table and "vs dense floor" in table


def test_a_compiled_row_below_0_9x_eager_is_marked_and_fails_the_run(
    bench_modules: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from bench import run

    def row(workload: str, contender: str, rate: float) -> dict:
        return {"kind": "generate", "workload": workload, "contender": contender, "rate": rate,
                "slowest": rate, "fastest": rate, "seconds": [1.0], "vs_hf": None, "parameters": 1}  # fmt: skip

    rows = [row("b8", "zoo", 480.0), row("b8", "zoo-compiled", 20.0), row("b8", "hf", 400.0)]
    rows += [row("b1", "zoo", 140.0), row("b1", "zoo-compiled", 130.0)]  # 0.93x: inside the guard
    problems = run.guard_compiled(rows)
    assert len(problems) == 1 and "b8: zoo-compiled runs at 0.04x eager zoo" in problems[0]
    assert rows[1]["below_eager"] is True and "below_eager" not in rows[4]
    assert rows[4]["vs_eager"] == pytest.approx(130 / 140)

    # the whole run: its table marks the row, and it exits 1 naming it
    monkeypatch.setattr(run, "run_generate", lambda workload, args: [dict(r) for r in rows[:3]])
    status = run.main(["--only", "generate", "--match", "gpt2-shaped greedy, batch 8, float32",
                       "--out", str(tmp_path)])  # fmt: skip
    assert status == 1
    assert "REGRESSION: b8: zoo-compiled runs at 0.04x eager" in capsys.readouterr().err
    assert "| b8 | zoo-compiled **below 0.9x eager** | 20 " in (tmp_path / "results.md").read_text()
