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
        "bench.loading",
        "bench.chunked_loss",
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


def test_the_full_cpu_run_adds_memory_rows_of_a_1b_shape_loaded_from_a_checkpoint(
    bench_modules: None,
) -> None:
    from bench.workloads import suite

    rows = [w for w in suite(quick=False, device="cpu").generate if w.from_checkpoint]
    assert [w.batch for w in rows] == [1, 8] and all(w.contenders == ("zoo", "hf") for w in rows)
    assert rows[0].spec["vocab_size"] == 128256 and rows[0].spec["lm_head"] == {"tied": True}
    assert not any(w.from_checkpoint for w in suite(quick=True, device="cpu").generate)
    assert not any(w.from_checkpoint for w in suite(quick=False, device="cuda").generate)


def test_memory_rows_write_one_checkpoint_per_shape_and_remove_it(
    bench_modules: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from bench import run

    written: list[Path] = []
    measured: list[tuple[str, str, Path]] = []

    def write(workload: str, folder: Path, *, device: str) -> bool:
        (folder / "zoo").mkdir()
        written.append(folder)
        return True

    def measure(kind: str, workload: str, contender: str, *, device: str, checkpoint: Path) -> dict:
        assert kind == "generate" and checkpoint.is_dir()
        measured.append((workload, contender, checkpoint))
        return {"peak_mib": 20.0 if contender == "zoo" else 30.0, "process_mib": 5000.0}

    monkeypatch.setattr(run, "write_checkpoint", write)
    monkeypatch.setattr(run, "measure", measure)
    assert run.main(["--only", "generate", "--match", "llama-3.2-1b", "--out", str(tmp_path)]) == 0
    assert len(written) == 1 and not written[0].exists()  # one checkpoint for both batches, then removed
    assert [(w[-7:], c) for w, c, _ in measured] == [
        ("float32", "zoo"), ("float32", "hf"), ("float32", "zoo"), ("float32", "hf")
    ]  # fmt: skip
    record = json.loads((tmp_path / "results.json").read_text())
    assert all(row["rate"] is None and row["parameters"] == 1_235_814_400 for row in record["results"])
    table = (tmp_path / "results.md").read_text()
    assert (
        "memory only" in table and "| llama-3.2-1b-shaped greedy, batch 8, float32 | hf | 30 MiB |" in table
    )
    assert "new tokens/s" not in table  # no timed rows in this run


def test_a_memory_row_loads_the_written_checkpoint_and_measures_two_calls(
    bench_modules: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`bench.memory`'s child, in this process on a tiny llama: the checkpoint it writes (zoo's and the
    `zoo.to_hf` export) loads in both libraries, and each generates through the measured calls."""
    pytest.importorskip("transformers")
    from bench import memory
    from bench.workloads import LLAMA_1B, GenerateWorkload

    small = {
        "d_model": 64, "num_layers": 2, "vocab_size": 512, "bos_token_id": 1, "eos_token_id": 2,
        "ffn": {**LLAMA_1B["ffn"], "d_ff": 128}, "attention": {"num_heads": 4, "num_kv_heads": 2, "bias": False},
    }  # fmt: skip
    tiny = GenerateWorkload(
        "tiny", "decoder", {**LLAMA_1B, **small}, batch=1, prompt=8, new_tokens=4, from_checkpoint=True
    )
    monkeypatch.setattr(memory, "_workload", lambda kind, name, device: tiny)
    memory._write("tiny", "cpu", tmp_path)
    assert (tmp_path / "zoo").is_dir() and (tmp_path / "hf" / "config.json").is_file()
    for contender in ("zoo", "hf"):
        result = memory._child("generate", "tiny", contender, "cpu", tmp_path)  # figures: in a child only
        assert set(result) == {"peak_mib", "process_mib"} and result["process_mib"] > 0
