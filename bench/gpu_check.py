"""`make gpu-check`: on an offline CUDA machine, the CUDA tests, the GPU bench and the demo, in under 7 minutes.

    python3 bench/gpu_check.py            # what `make gpu-check` runs (plain python3: no venv there)

The machine's Python has torch, transformers and most of zoo's dependencies, but not pydantic and its three
helpers; `make gpu-wheels` (on a machine with network) downloads those as wheels into `.whl/`, and this
script installs them into a temporary folder without network (``pip install --no-index --no-deps
--target``) and runs zoo from the working tree (``PYTHONPATH=.``). Steps, each a subprocess capped by a
timeout so a hang cannot eat the budget, and none stopping the others:

    1. CUDA?       torch.cuda.is_available(), before anything heavy: without it, one line and exit 2
    2. wheels      .whl/*.whl into a temporary --target (skipped when pydantic already imports)
    3. pytest      pytest -m cuda over the files with cuda tests (xdist workers where installed)  } in
       demo        python3 -m zoo demo --device cuda, its run folder under /tmp                     } parallel
    4. bench       python -m bench --device cuda --gpu-check: bf16 training with MFU, greedy decoding with
                   CUDA graphs, peak memory against `zoo.summary`; alone on the GPU, so timings are clean
    5. serve       python -m bench.serve --device cuda: `zoo serve`'s tokens/s at 1 and 32 clients, continuous
                   batching against one request at a time and transformers serve (where it starts); only
                   where FastAPI, uvicorn and the openai client import (the second line of GPU_WHEELS)

Writes to $OUT when set (else bench/results/local/gpu-check/): each step's log, the bench's results.json /
results.md, and one gpu-check.json (+ gpu-check.md) with the figures; prints one summary line.
``ZOO_GPU_CHECK_FAKE=1`` (tests only) runs the same orchestration on the CPU with test-sized steps.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
WHEELS = ROOT / ".whl"
LOCAL = ROOT / "bench" / "results" / "local" / "gpu-check"
# Seconds per step. The whole must stay under 9 minutes on one H100: 10 s of checks and wheels, pytest and
# the demo side by side (at most 170 s), then the bench alone (at most 190 s), then the serve bench (150 s).
LIMITS = {"pytest": 170, "demo": 150, "bench": 190, "serve": 150}
# The test files that hold `cuda`-marked tests (pytest -m cuda over the whole tree would import every test
# module, some of which need packages the GPU machine lacks).
CUDA_TESTS = [
    "tests/cuda",
    "tests/generation/test_cuda_graphs.py",
    "tests/blocks/test_gqa_kernels.py",
    "tests/quant/test_quantize.py",
]
# Goals of issue #26 (figures beside them in the JSON and the table; never estimated).
GOALS = {
    "gpt2_medium_mfu": 0.45,
    "transformer_base_vs_hf": 1.2,
    "decode_b1_cuda_graphs_vs_hf": 3.0,
    "decode_b8_cuda_graphs_vs_hf": 1.5,
    "decode_b1_vs_weights_floor": 0.3,
}


@dataclass
class Phase:
    """One step's outcome."""

    name: str
    command: list[str]
    rc: int | None = None  # None: not run
    seconds: float = 0.0
    timed_out: bool = False
    log: str = ""

    @property
    def ok(self) -> bool:
        return self.rc == 0 and not self.timed_out


@dataclass
class TestCounts:
    passed: int = 0
    failed: int = 0
    errors: int = 0
    skipped: int = 0
    failed_names: list[str] = field(default_factory=list)


def fake() -> bool:
    return os.environ.get("ZOO_GPU_CHECK_FAKE") == "1"


def out_dir() -> Path:
    return Path(os.environ["OUT"]) if os.environ.get("OUT") else LOCAL


def check_cuda() -> str | None:
    """Why this machine cannot run the check (one line), or None when it can."""
    try:
        import torch
    except ImportError as error:
        return f"gpu-check: {sys.executable} cannot import torch ({error}); run it with the Python that has torch"
    if fake() or torch.cuda.is_available():
        return None
    return (
        f"gpu-check: needs a CUDA GPU, and torch {torch.__version__} sees none "
        "(torch.cuda.is_available() is False); run `make gpu-check` on the CUDA machine"
    )


def install_wheels(target: Path) -> str | None:
    """Install .whl/*.whl into ``target`` without network; None when done (or not needed), else why not."""
    wheels = sorted(WHEELS.glob("*.whl"))
    if fake() and sys.version_info[:2] != (3, 12):
        return None  # the wheels are CPython 3.12's; a test on another Python checks the rest of the flow
    try:
        import pydantic  # noqa: F401

        if not wheels:
            return None  # this Python has zoo's dependencies already
    except ImportError:
        if not wheels:
            return f"gpu-check: pydantic is missing and {WHEELS} holds no wheels: run `make gpu-wheels` first"
    command = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile"]
    command += ["--no-cache-dir", "--upgrade", "--target", str(target), *map(str, wheels)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        return f"gpu-check: installing {len(wheels)} wheels failed: {done.stderr.strip()[-300:]}"
    return None


def phases(device: str, out: Path, work: Path) -> tuple[list[Phase], Phase, Phase]:
    """The parallel steps (pytest, demo), the bench and the serve bench, as commands."""
    py = sys.executable
    pytest = [py, "-m", "pytest", "-m", "cuda", "-vv", "-rs", "-p", "no:randomly", *CUDA_TESTS]
    if fake():  # the orchestration on CPU: the cuda tests collect and skip
        pytest = [py, "-m", "pytest", "-m", "cuda", "-vv", "-rs", "tests/cuda/test_cuda_graphs.py"]
    else:
        if _importable("xdist"):  # the tests are small; workers share the GPU and compile in parallel
            pytest += ["-n", "6"]
        if _importable("pytest_timeout"):
            pytest += ["--timeout", "150"]
    steps = "2" if fake() else "300"
    demo = [py, "-m", "zoo", "demo", "--device", device, "--steps", steps, "--output-dir", str(work / "demo")]
    bench = [py, "-m", "bench", "--device", device, "--gpu-check", "--out", str(work / "bench")]
    if fake():
        bench += ["--tiny"]
    # the prefix-cache and encoder-decoder rows (more servers) are the CPU bench's: left out to keep this
    # check's time
    serve = [
        py,
        "-m",
        "bench.serve",
        "--device",
        device,
        "--out",
        str(work / "serve"),
        "--prefix-rounds",
        "0",
        "--seq2seq-rounds",
        "0",
    ]
    if fake():
        serve += ["--clients", "2", "--requests", "1", "--new-tokens", "4", "--layers", "1", "--width", "64"]
        serve += ["--no-transformers"]
    else:  # a model large enough (8 x 1024, ~100M parameters) that a step is more than launch overhead
        serve += ["--dtype", "bfloat16", "--clients", "1", "32", "--requests", "2", "--new-tokens", "64"]
        serve += ["--layers", "8", "--width", "1024"]
    return [Phase("pytest", pytest), Phase("demo", demo)], Phase("bench", bench), Phase("serve", serve)


def _importable(module: str, env: dict[str, str] | None = None) -> bool:
    done = subprocess.run(
        [sys.executable, "-c", f"import {module}"], capture_output=True, timeout=60, env=env
    )
    return done.returncode == 0


def run_phase(phase: Phase, *, env: dict[str, str], out: Path, limit: float) -> Phase:
    """Run one step under ``timeout`` (its log in ``out``); whatever happens, return how it went."""
    log = out / f"{phase.name}.log"
    phase.log = log.name
    started = time.perf_counter()
    with log.open("w") as handle:
        try:
            done = subprocess.run(
                phase.command, stdout=handle, stderr=subprocess.STDOUT, env=env, cwd=ROOT, timeout=limit
            )
            phase.rc = done.returncode
        except subprocess.TimeoutExpired:
            phase.timed_out, phase.rc = True, 124
            handle.write(f"\ngpu-check: {phase.name} stopped after its limit of {limit:.0f} s\n")
        except OSError as error:
            phase.rc = 127
            handle.write(f"\ngpu-check: {phase.name} could not start: {error}\n")
    phase.seconds = time.perf_counter() - started
    return phase


_VERBOSE = re.compile(
    r"(tests/\S+::\S+) (PASSED|FAILED|ERROR|SKIPPED)|(PASSED|FAILED|ERROR|SKIPPED) (tests/\S+::\S+)"
)
_MODULE_SKIP = re.compile(r"SKIPPED \[\d+\] (tests/[^:]+):\d+: ")
_FIELD = {"PASSED": "passed", "FAILED": "failed", "ERROR": "errors", "SKIPPED": "skipped"}


def count_tests(log: str) -> TestCounts:
    """Tests by outcome from pytest's -v lines (``path::test PASSED``; with xdist ``PASSED path::test``), so
    a run stopped by its timeout still counts what finished. A module skipped whole (its -rs line) counts
    once; a teardown ERROR after a FAILED keeps FAILED."""
    seen: dict[str, str] = {}
    for line in log.splitlines():
        match = _VERBOSE.search(line)
        if match:
            name, status = (match[1], match[2]) if match[1] else (match[4], match[3])
            seen[name] = "FAILED" if seen.get(name) == "FAILED" else status
    for line in log.splitlines():
        match = _MODULE_SKIP.match(line)
        if match and not any(name.startswith(match[1] + "::") for name in seen):
            seen[match[1]] = "SKIPPED"
    counts = TestCounts()
    for name, status in seen.items():
        key = _FIELD[status]
        setattr(counts, key, getattr(counts, key) + 1)
        if status in ("FAILED", "ERROR"):
            counts.failed_names.append(name)
    return counts


def figures(bench: dict[str, Any] | None, serve: dict[str, Any] | None = None) -> dict[str, Any]:
    """The issue's figures from the bench record (and the serve bench's), each with its goal; None where a row
    was not measured."""
    from bench.workloads import GPT2_MEDIUM_TRAIN, TRANSFORMER_BASE_TRAIN, gpt2_medium_greedy

    rows = bench["results"] if bench else []

    def row(workload: str, contender: str) -> dict[str, Any] | None:
        return next((r for r in rows if r["workload"] == workload and r["contender"] == contender), None)

    def figure(value: float | None, goal: float, **beside: Any) -> dict[str, Any]:
        return {"value": value, "goal": goal, "met": None if value is None else value >= goal, **beside}

    def get(r: dict[str, Any] | None, key: str) -> Any:
        return r.get(key) if r else None

    zoo_mfu, hf_mfu = row(GPT2_MEDIUM_TRAIN, "zoo"), row(GPT2_MEDIUM_TRAIN, "hf")
    base = row(TRANSFORMER_BASE_TRAIN, "zoo")
    b1, b8 = row(gpt2_medium_greedy(1), "zoo-cuda-graphs"), row(gpt2_medium_greedy(8), "zoo-cuda-graphs")
    memory = [
        {k: r.get(k) for k in ("workload", "contender", "peak_mib", "estimate_mib")}
        | {"ratio": r["peak_mib"] / r["estimate_mib"] if r.get("estimate_mib") else None}
        for r in rows
        if "estimate_mib" in r
    ]
    return {
        "gpt2_medium_mfu": figure(
            get(zoo_mfu, "mfu"),
            GOALS["gpt2_medium_mfu"],
            hf=get(hf_mfu, "mfu"),
            zoo_tokens_s=get(zoo_mfu, "rate"),
        ),
        "transformer_base_vs_hf": figure(
            get(base, "vs_hf"),
            GOALS["transformer_base_vs_hf"],
            zoo_tokens_s=get(base, "rate"),
            hf_tokens_s=get(row(TRANSFORMER_BASE_TRAIN, "hf"), "rate"),
        ),
        "decode_b1_cuda_graphs_vs_hf": figure(
            get(b1, "vs_hf"),
            GOALS["decode_b1_cuda_graphs_vs_hf"],
            eager_vs_hf=get(row(gpt2_medium_greedy(1), "zoo"), "vs_hf"),
            tokens_s=get(b1, "rate"),
        ),
        "decode_b8_cuda_graphs_vs_hf": figure(
            get(b8, "vs_hf"),
            GOALS["decode_b8_cuda_graphs_vs_hf"],
            eager_vs_hf=get(row(gpt2_medium_greedy(8), "zoo"), "vs_hf"),
            tokens_s=get(b8, "rate"),
        ),
        "decode_b1_vs_weights_floor": figure(
            get(b1, "vs_weights_floor"),
            GOALS["decode_b1_vs_weights_floor"],
            floor_tokens_s=get(b1, "weights_floor_rate"),
        ),
        "training_memory_vs_estimate": memory,
        "serve_32_clients": serve_figure(serve),
    }


def serve_figure(serve: dict[str, Any] | None) -> dict[str, Any]:
    """`zoo serve`'s tokens/s at its most clients, beside one request at a time and transformers serve."""
    rows = serve["results"] if serve else []
    clients = max((r["clients"] for r in rows), default=None)

    def rate(prefix: str) -> float | None:
        return next(
            (r["tokens_per_s"] for r in rows if r["clients"] == clients and r["server"].startswith(prefix)),
            None,
        )

    from bench.serve import ONE_AT_A_TIME

    batched = next(
        (
            r["tokens_per_s"]
            for r in rows
            if r["clients"] == clients and r["server"].startswith("zoo") and r["server"] != ONE_AT_A_TIME
        ),
        None,
    )
    one, hf = rate(ONE_AT_A_TIME), rate("transformers")
    return {
        "clients": clients,
        "tokens_s": batched,
        "one_at_a_time_tokens_s": one,
        "transformers_tokens_s": hf,
        "vs_one_at_a_time": batched / one if batched and one else None,
        "vs_transformers": batched / hf if batched and hf else None,
        "not_started": serve.get("not_started") if serve else None,
        "model": serve.get("model") if serve else None,
    }


def summarize(
    phases: Sequence[Phase], tests: TestCounts, figs: dict[str, Any], *, device: str, total_s: float
) -> tuple[dict[str, Any], str]:
    """The JSON record and the one summary line."""
    failed = [p.name + (" (timed out)" if p.timed_out else f" (exit {p.rc})") for p in phases if not p.ok]
    record = {
        "device": device,
        "ok": not failed and tests.failed == 0 and tests.errors == 0,
        "total_s": total_s,
        "phases": [asdict(p) for p in phases],
        "tests": asdict(tests),
        "figures": figs,
    }

    def pct(value: float | None) -> str:
        return "not measured" if value is None else f"{100 * value:.1f}%"

    def times(value: float | None) -> str:
        return "not measured" if value is None else f"{value:.2f}x"

    line = (
        f"gpu-check {'OK' if record['ok'] else 'FAILED'} on {device} in {total_s:.0f} s: tests {tests.passed} passed, "
        f"{tests.failed} failed, {tests.errors} errors, {tests.skipped} skipped; "
        f"MFU gpt2-medium {pct(figs['gpt2_medium_mfu']['value'])} (hf {pct(figs['gpt2_medium_mfu']['hf'])}); "
        f"transformer-base {times(figs['transformer_base_vs_hf']['value'])} hf; "
        f"decode b1 {times(figs['decode_b1_cuda_graphs_vs_hf']['value'])} hf, "
        f"{times(figs['decode_b1_vs_weights_floor']['value'])} floor; "
        f"b8 {times(figs['decode_b8_cuda_graphs_vs_hf']['value'])} hf"
        + _serve_text(figs["serve_32_clients"], times)
        + (f"; failed steps: {', '.join(failed)}" if failed else "")
    )
    return record, line


def _serve_text(serve: dict[str, Any], times: Any) -> str:
    if serve["clients"] is None:
        return ""  # not run
    return (
        f"; serve {serve['clients']} clients {times(serve['vs_one_at_a_time'])} one-at-a-time, "
        f"{times(serve['vs_transformers'])} transformers"
    )


def markdown(record: dict[str, Any], bench_md: str) -> str:
    """The figures against their goals, then the bench's own tables: what the next session pastes."""
    f = record["figures"]

    def cell(value: float | None, pct: bool = False) -> str:
        if value is None:
            return "not measured"
        return f"{100 * value:.1f}%" if pct else f"{value:.2f}x"

    lines = [
        f"gpu-check on {record['device']}, {record['total_s']:.0f} s; tests: {record['tests']['passed']} passed, "
        f"{record['tests']['failed']} failed, {record['tests']['errors']} errors, {record['tests']['skipped']} skipped",
        "",
        "| figure | zoo | beside it | goal | met |",
        "|---|---:|---:|---:|:-:|",
    ]
    rows = [
        ("gpt2-medium bf16 + compile training MFU", "gpt2_medium_mfu", True, "hf", True),
        (
            "transformer-base bf16 training vs transformers' Marian",
            "transformer_base_vs_hf",
            False,
            None,
            False,
        ),
        (
            "bf16 greedy, batch 1, CUDA graphs vs transformers",
            "decode_b1_cuda_graphs_vs_hf",
            False,
            "eager_vs_hf",
            False,
        ),
        (
            "bf16 greedy, batch 8, CUDA graphs vs transformers",
            "decode_b8_cuda_graphs_vs_hf",
            False,
            "eager_vs_hf",
            False,
        ),
        (
            "bf16 greedy, batch 1, CUDA graphs vs weights-read floor",
            "decode_b1_vs_weights_floor",
            False,
            None,
            False,
        ),
    ]
    for title, key, pct, beside, beside_pct in rows:
        item = f[key]
        other = f"{beside.replace('_vs_hf', '')} {cell(item.get(beside), beside_pct)}" if beside else "–"
        met = "–" if item["met"] is None else ("yes" if item["met"] else "no")
        lines.append(
            f"| {title} | {cell(item['value'], pct)} | {other} | {cell(item['goal'], pct)} | {met} |"
        )
    lines += ["", "Training peak memory against `zoo.summary` (zoo show's estimate):", ""]
    lines += ["| workload | contender | measured | estimate | ratio |", "|---|---|---:|---:|---:|"]
    for m in f["training_memory_vs_estimate"]:
        ratio = f"{m['ratio']:.2f}" if m["ratio"] else "–"
        lines.append(
            f"| {m['workload']} | {m['contender']} | {m['peak_mib']:,.0f} MiB | {m['estimate_mib']:,.0f} MiB | {ratio} |"
        )
    if not f["training_memory_vs_estimate"]:
        lines.append("| not measured | | | | |")
    return "\n".join([*lines, "", bench_md])


def markdown_serve(serve: dict[str, Any]) -> str:
    from bench.serve import markdown as serve_markdown

    return "`zoo serve` under load (bench.serve):\n\n" + serve_markdown(serve)


STEPS = ("pytest", "demo", "bench", "serve")


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="bench/gpu_check.py", description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=STEPS, default=list(STEPS), help="run these steps alone")
    only = set(parser.parse_args(argv).only)
    started = time.perf_counter()
    reason = check_cuda()
    if reason:
        print(reason, file=sys.stderr)
        return 2
    out = out_dir()
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="zoo-gpu-check-"))
    reason = install_wheels(work / "site")
    if reason:
        print(reason, file=sys.stderr)
        return 2
    sys.path.insert(0, str(ROOT))
    import torch

    device = "cpu" if fake() else "cuda"
    name = "cpu (ZOO_GPU_CHECK_FAKE)" if fake() else torch.cuda.get_device_name()
    paths = [str(ROOT), *([str(work / "site")] if (work / "site").exists() else [])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths), "PYTHONUNBUFFERED": "1", "COLUMNS": "200"}
    env |= {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    parallel, bench, serve = phases(device, out, work)
    side_by_side = [p for p in parallel if p.name in only]
    done: list[Phase] = []
    if side_by_side:
        with ThreadPoolExecutor(len(side_by_side)) as pool:  # correctness steps: the GPU is theirs to share
            done += pool.map(lambda p: run_phase(p, env=env, out=out, limit=LIMITS[p.name]), side_by_side)
    if "bench" in only:
        done.append(run_phase(bench, env=env, out=out, limit=LIMITS["bench"]))  # alone: clean timings
    serve_record, serve_skipped = None, None
    if "serve" in only:
        missing = [m for m in ("fastapi", "uvicorn", "openai") if not _importable(m, env)]
        if missing:
            serve_skipped = f"not run: {', '.join(missing)} not importable (the second line of GPU_WHEELS)"
        else:
            done.append(run_phase(serve, env=env, out=out, limit=LIMITS["serve"]))
            serve_path = work / "serve" / "serve.json"  # written after every level
            serve_record = json.loads(serve_path.read_text()) if serve_path.exists() else None
    # Written after every workload: a bench stopped by its limit still gives the rows it finished.
    record_path = work / "bench" / "results.json"
    bench_record = json.loads(record_path.read_text()) if record_path.exists() else None
    bench_md = (work / "bench" / "results.md").read_text() if bench_record else "(the bench wrote no results)"
    if bench_record:
        shutil.copy(record_path, out / "bench-results.json")
        shutil.copy(work / "bench" / "results.md", out / "bench-results.md")
    pytest_log = out / "pytest.log"
    tests = count_tests(pytest_log.read_text()) if pytest_log.exists() else TestCounts()
    record, line = summarize(
        done, tests, figures(bench_record, serve_record), device=name, total_s=time.perf_counter() - started
    )
    record["bench_machine"] = bench_record["machine"] if bench_record else None
    record["serve"] = (
        serve_record or serve_skipped
    )  # the whole serve record here: $OUT returns 8 files at most
    serve_md = (
        markdown_serve(serve_record) if serve_record else f"Serve bench: {serve_skipped or 'no results'}"
    )
    (out / "gpu-check.json").write_text(json.dumps(record, indent=2) + "\n")
    (out / "gpu-check.md").write_text(markdown(record, bench_md) + "\n\n" + serve_md)
    shutil.rmtree(work, ignore_errors=True)
    print(line, flush=True)
    return 0 if record["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
