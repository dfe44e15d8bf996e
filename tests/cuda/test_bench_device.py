"""`python -m bench --device cuda`: refused in one line without a GPU, MFU against a known peak, and (on a GPU)
the bf16 training rows carry their MFU. The first two run everywhere; the last is a `cuda` test."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


def bench(*args: str, timeout: int = 60) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "bench", *args]
    return subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=timeout)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_bench_on_cuda_without_a_gpu_stops_with_one_line() -> None:
    done = bench("--device", "cuda")
    assert done.returncode == 2
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "--device cuda needs a CUDA GPU" in lines[0], done.stderr


@pytest.mark.parametrize(
    ("name", "peak"),
    [
        ("NVIDIA H100 80GB HBM3", 989.0),
        ("NVIDIA H100 PCIe", 756.0),
        ("NVIDIA H100 NVL", 835.0),
        ("NVIDIA H200", 989.0),
        ("NVIDIA A100-SXM4-80GB", 312.0),
        ("NVIDIA A100 80GB PCIe", 312.0),
        ("NVIDIA A100-SXM4-40GB MIG 1g.5gb", None),  # a slice of the GPU: its peak is not the GPU's
        ("NVIDIA GeForce RTX 3090", None),  # not in the table: MFU "n/a", never a guess
    ],
)
def test_mfu_peak_is_looked_up_by_device_name(
    name: str, peak: float | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(ROOT))
    from bench.peaks import bf16_peak_tflops

    assert bf16_peak_tflops(name) == peak


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available())")
def test_bench_on_cuda_reports_bf16_training_with_mfu(tmp_path: Path) -> None:
    done = bench(
        "--device", "cuda", "--only", "train", "--match", "transformer-base", "--repeats", "1",
        "--no-memory", "--out", str(tmp_path), timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    record = json.loads((tmp_path / "results.json").read_text())
    rows = record["results"]
    assert {r["contender"] for r in rows} == {"zoo", "hf", "torch"}
    for row in rows:
        assert row["rate"] > 0 and row["tflops"] > 0
        assert row["mfu"] is None or 0 < row["mfu"] < 1
    assert "| MFU |" in (tmp_path / "results.md").read_text()
