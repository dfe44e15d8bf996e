"""`make gpu-check` (bench/gpu_check.py): refused in one line within seconds without CUDA; its test counts,
figures, JSON and summary line from fake results; and, on the CPU with ``ZOO_GPU_CHECK_FAKE=1``, the whole
orchestration (steps side by side, the bench alone, logs and one JSON under $OUT)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def gpu_check(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.syspath_prepend(str(ROOT))
    from bench import gpu_check

    return gpu_check


def run_check(env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    env = {**{k: v for k, v in os.environ.items() if k != "ZOO_GPU_CHECK_FAKE"}, **env}
    command = [sys.executable, str(ROOT / "bench" / "gpu_check.py")]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout, cwd=ROOT)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_without_cuda_it_stops_within_seconds_with_one_line(tmp_path: Path) -> None:
    started = time.perf_counter()
    done = run_check({"OUT": str(tmp_path)}, timeout=10)
    assert time.perf_counter() - started < 10
    assert done.returncode == 2 and done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu-check: needs a CUDA GPU"), done.stderr
    assert "torch.cuda.is_available() is False" in lines[0]
    assert not any(tmp_path.iterdir())  # nothing installed or written before the refusal


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_gpu_check_runs_the_script_with_plain_python(tmp_path: Path) -> None:
    env = {**os.environ, "OUT": str(tmp_path)}
    env.pop("ZOO_GPU_CHECK_FAKE", None)
    done = subprocess.run(
        ["make", "-s", "gpu-check", f"PYTHON={sys.executable}"],
        capture_output=True, text=True, env=env, timeout=10, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode != 0
    assert "gpu-check: needs a CUDA GPU" in done.stderr.splitlines()[0]


PYTEST_LOG = """\
tests/cuda/test_cuda.py::test_a[gpt2-tiny] PASSED                                  [  5%]
[gw1] [ 10%] PASSED tests/cuda/test_cuda.py::test_a[llama-tiny]
[gw0] [ 15%] FAILED tests/cuda/test_cuda.py::test_b[t5-tiny]
[gw0] [ 16%] ERROR tests/cuda/test_cuda.py::test_b[t5-tiny]
tests/cuda/test_cuda_graphs.py::test_c SKIPPED (needs a CUDA GPU)                   [ 20%]
tests/cuda/test_cuda.py::test_d ERROR                                              [ 25%]
SKIPPED [1] tests/quant/test_quantize.py:23: could not import 'torchao': No module named 'torchao'
SKIPPED [1] tests/cuda/test_cuda_graphs.py:78: needs a CUDA GPU
"""


def test_test_counts_come_from_verbose_lines_and_whole_module_skips(gpu_check) -> None:
    counts = gpu_check.count_tests(PYTEST_LOG)
    assert (counts.passed, counts.failed, counts.errors, counts.skipped) == (2, 1, 1, 2)
    assert counts.failed_names == [
        "tests/cuda/test_cuda.py::test_b[t5-tiny]",
        "tests/cuda/test_cuda.py::test_d",
    ]


def fake_bench() -> dict:
    def row(workload: str, contender: str, rate: float, **more: float) -> dict:
        return {"kind": "x", "workload": workload, "contender": contender, "rate": rate, **more}

    from bench.workloads import GPT2_MEDIUM_TRAIN, TRANSFORMER_BASE_TRAIN, gpt2_medium_greedy

    return {
        "machine": {"gpu": "NVIDIA H100 80GB HBM3"},
        "results": [
            row(GPT2_MEDIUM_TRAIN, "zoo", 1e5, mfu=0.5, peak_mib=30000.0, estimate_mib=32000.0),
            row(GPT2_MEDIUM_TRAIN, "hf", 8e4, mfu=0.4, peak_mib=36000.0, estimate_mib=32000.0),
            row(TRANSFORMER_BASE_TRAIN, "zoo", 3e5, vs_hf=1.1),
            row(TRANSFORMER_BASE_TRAIN, "hf", 2.7e5, vs_hf=1.0),
            row(gpt2_medium_greedy(1), "zoo", 300.0, vs_hf=1.5),
            row(
                gpt2_medium_greedy(1),
                "zoo-cuda-graphs",
                900.0,
                vs_hf=4.5,
                vs_weights_floor=0.21,
                weights_floor_rate=4200.0,
            ),
        ],  # fmt: skip  (no batch-8 rows: "not measured")
    }


def test_figures_json_and_summary_line_from_fake_results(gpu_check) -> None:
    figures = gpu_check.figures(fake_bench())
    assert figures["gpt2_medium_mfu"] | {} == {
        "value": 0.5, "goal": 0.45, "met": True, "hf": 0.4, "zoo_tokens_s": 1e5,
    }  # fmt: skip
    assert figures["transformer_base_vs_hf"]["met"] is False  # 1.1x against a goal of 1.2x
    assert figures["decode_b1_cuda_graphs_vs_hf"]["value"] == 4.5
    assert figures["decode_b1_cuda_graphs_vs_hf"]["eager_vs_hf"] == 1.5
    assert figures["decode_b8_cuda_graphs_vs_hf"] == {
        "value": None, "goal": 1.5, "met": None, "eager_vs_hf": None, "tokens_s": None,
    }  # fmt: skip
    assert [m["ratio"] for m in figures["training_memory_vs_estimate"]] == [30000 / 32000, 36000 / 32000]

    phases = [
        gpu_check.Phase("pytest", ["pytest"], rc=1, seconds=100.0),
        gpu_check.Phase("demo", ["zoo"], rc=0, seconds=50.0),
        gpu_check.Phase("bench", ["bench"], rc=124, seconds=190.0, timed_out=True),
    ]
    tests = gpu_check.count_tests(PYTEST_LOG)
    record, line = gpu_check.summarize(phases, tests, figures, device="NVIDIA H100 80GB HBM3", total_s=351.2)
    json.dumps(record)  # serialisable as it is
    assert record["ok"] is False and record["tests"]["failed"] == 1
    assert line == (
        "gpu-check FAILED on NVIDIA H100 80GB HBM3 in 351 s: tests 2 passed, 1 failed, 1 errors, 2 skipped; "
        "MFU gpt2-medium 50.0% (hf 40.0%); transformer-base 1.10x hf; decode b1 4.50x hf, 0.21x floor; "
        "b8 not measured hf; failed steps: pytest (exit 1), bench (timed out)"
    )
    assert figures["serve_32_clients"]["clients"] is None  # no serve record: nothing said of it in the line
    table = gpu_check.markdown(record, "(bench tables)")
    assert "| gpt2-medium bf16 + compile training MFU | 50.0% | hf 40.0% | 45.0% | yes |" in table
    assert (
        "| bf16 greedy, batch 8, CUDA graphs vs transformers | not measured | eager not measured |" in table
    )
    assert table.endswith("(bench tables)")


def test_the_serve_figure_is_zoo_at_its_most_clients_beside_one_at_a_time_and_transformers(gpu_check) -> None:
    def level(server: str, clients: int, rate: float) -> dict:
        return {
            "server": server,
            "clients": clients,
            "tokens_per_s": rate,
            "ttft_p50_s": 0.1,
            "ttft_p99_s": 0.2,
        }

    serve = {
        "machine": {"gpu": "GPU", "device": "cuda"},
        "new_tokens": 64,
        "requests": 2,
        "model": "llama-shaped",
        "results": [
            level("zoo max-batch 32", 1, 36.0),
            level("zoo max-batch 32", 32, 600.0),
            level("zoo max-batch 1", 32, 150.0),
            level("transformers serve --continuous-batching", 32, 500.0),
        ],
    }
    figure = gpu_check.figures(fake_bench(), serve)["serve_32_clients"]
    assert figure["clients"] == 32 and figure["tokens_s"] == 600.0
    assert figure["vs_one_at_a_time"] == 4.0 and figure["vs_transformers"] == 1.2
    phases = [gpu_check.Phase("serve", ["serve"], rc=0, seconds=90.0)]
    record, line = gpu_check.summarize(
        phases, gpu_check.TestCounts(), gpu_check.figures(fake_bench(), serve), device="GPU", total_s=95.0
    )
    assert record["ok"] is True
    assert line.endswith("; serve 32 clients 4.00x one-at-a-time, 1.20x transformers")
    assert "zoo max-batch 32 | 32 | 600" in gpu_check.markdown_serve(serve)


def test_only_refuses_an_unknown_step(gpu_check, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        gpu_check.main(["--only", "bench", "lint"])
    assert stopped.value.code == 2 and "invalid choice: 'lint'" in capsys.readouterr().err


@pytest.mark.slow
def test_the_whole_flow_runs_on_the_cpu_with_the_fake(tmp_path: Path) -> None:
    """~20 s: pytest (the cuda tests skip), the demo for 2 steps and the tiny bench, as on the GPU."""
    done = run_check({"OUT": str(tmp_path), "ZOO_GPU_CHECK_FAKE": "1"}, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    line = done.stdout.strip().splitlines()[-1]
    assert line.startswith("gpu-check OK on cpu (ZOO_GPU_CHECK_FAKE) in ") and "tests 0 passed" in line
    files = {p.name for p in tmp_path.iterdir()}
    assert files == {
        "gpu-check.json",
        "gpu-check.md",
        "pytest.log",
        "demo.log",
        "bench.log",
        "bench-results.json",
        "bench-results.md",
        "serve.log",
    }  # fmt: skip  (at most 8 files, none in folders: what the device tool brings back)
    record = json.loads((tmp_path / "gpu-check.json").read_text())
    assert [p["name"] for p in record["phases"]] == ["pytest", "demo", "bench", "serve"]
    assert all(p["rc"] == 0 for p in record["phases"])
    assert record["tests"]["skipped"] == 5
    assert record["figures"]["transformer_base_vs_hf"]["value"] > 0
    assert "reloaded from disk: same translations" in (tmp_path / "demo.log").read_text()
    assert record["serve"]["results"] and record["figures"]["serve_32_clients"]["clients"] == 2
