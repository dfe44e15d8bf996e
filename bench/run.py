"""Side-by-side benchmark of zoo against Hugging Face `transformers` and `torch.nn.Transformer`.

    python -m bench --quick             # GPT and BERT shapes, eager decoding: ~3 minutes on 2 CPU cores
    python -m bench                     # every shape, compiled decoding too, peak memory: ~15 minutes
    python -m bench --device cuda       # on a GPU: adds bf16 training (+ torch.compile) with its MFU
    python -m bench --only generate     # one section
    python -m bench --device cuda --gpu-check   # `make gpu-check`'s rows, ~3 minutes on one H100

Writes results.json and results.md to bench/results/local/ (ignored by git), or --out DIR; --update writes
the tracked bench/results/, which the README's tables come from.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

if __package__ in (None, ""):  # `python bench/run.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import contenders, report
from bench.memory import measure, write_checkpoint
from bench.peaks import bf16_peak_tflops
from bench.timing import PeakMemory, alternate
from bench.workloads import GenerateWorkload, TrainWorkload, gpu_check_suite, suite

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def run_train(workload: TrainWorkload, args: argparse.Namespace) -> list[dict[str, Any]]:
    if workload.compile:
        torch._dynamo.reset()  # the previous workloads' graphs (and the memory they hold) go
    dtype = torch.float32  # the weights; bf16 workloads autocast around them (mixed precision)
    models = {name: contenders.build(name, workload.spec, args.device, dtype) for name in workload.contenders}
    parameters = contenders.check_same_size(models)
    batch = contenders.train_batch(workload, args.device)
    runs = {name: contenders.train_step_fn(name, workload, model, batch) for name, model in models.items()}
    # A compiled step compiles forward and backward on its first call and may recompile once on its second.
    warmup = max(args.warmup, 2) if workload.compile else args.warmup
    timings = alternate(runs, device=args.device, warmup=warmup, repeats=args.repeats)
    rows = _rows("train", workload.name, timings, workload.tokens_per_step, parameters)
    if workload.precision == "bf16" and args.device.startswith("cuda"):
        _add_mfu(rows, workload, args.peak_tflops)
    if args.gpu_check:
        _train_memory_in_process(rows, runs, workload, args.device, parameters)
    elif not args.no_memory:
        for row in rows:
            row.update(measure("train", workload.name, row["contender"], device=args.device) or {})
    return rows


# Bytes a parameter holds through a training step outside the activations: float32 weight and gradient and
# Adam's two float32 moments (bf16 autocast keeps all four in float32).
STATE_BYTES = 16


def _train_memory_in_process(
    rows: list[dict[str, Any]], runs: dict[str, Any], workload: TrainWorkload, device: str, parameters: int
) -> None:
    """``peak_mib`` of one more step of each contender, measured in this process (a compiled step is not
    compiled again, as a fresh process would): the step's peak over what was allocated before it, plus the
    model's own states (`STATE_BYTES` a parameter), as tests/cuda measures it; beside it ``estimate_mib``,
    `zoo.summary`'s ``training_step_bytes`` for the same shape (dtype bf16 for mixed precision: the same 16
    bytes a parameter, bf16 activations)."""
    import zoo

    dtype = "bf16" if workload.precision == "bf16" else "float32"
    estimate = zoo.summary(workload.spec, seq_len=workload.seq, batch=workload.batch, dtype=dtype)
    for row in rows:
        with PeakMemory(device) as memory:
            runs[row["contender"]]()
        row["peak_mib"] = (memory.peak + STATE_BYTES * parameters) / 2**20
        row["estimate_mib"] = estimate.training_step_bytes / 2**20


def _add_mfu(rows: list[dict[str, Any]], workload: TrainWorkload, peak_tflops: float | None) -> None:
    """Model TFLOP/s and MFU of each row: training FLOPs per token as ``zoo show`` counts them (3 x forward:
    2 per weight per token, plus attention scores and weighted sums) times tokens/s, over the dense bf16
    peak. The same model FLOPs for every contender, whatever each one computes (or recomputes)."""
    import zoo

    flops_per_token = zoo.summary(workload.spec, seq_len=workload.seq, batch=workload.batch).flops.training
    for row in rows:
        row["tflops"] = row["rate"] * flops_per_token / 1e12
        row["mfu"] = row["tflops"] / peak_tflops if peak_tflops else None  # None: "n/a", peak unknown


def run_generate(workload: GenerateWorkload, args: argparse.Namespace) -> list[dict[str, Any]]:
    if workload.from_checkpoint:
        return _memory_rows(workload, args)
    # Each workload compiles its own models during warm-up; drop the previous workloads' graphs so dynamo's
    # per-function recompile limit (8) is never reached in a process that builds this many models.
    torch._dynamo.reset()
    dtype = DTYPES[workload.dtype]
    models = {
        name: contenders.build(name, workload.spec, args.device, dtype)
        for name in workload.contenders
        if name != "floor"
    }
    parameters = contenders.check_same_size(models)
    runs: dict[str, Any] = {
        name: contenders.generate_fn(name, workload, m, args.device) for name, m in models.items()
    }
    runs["floor"] = contenders.floor_fn(workload, args.device, dtype)
    with torch.inference_mode():
        timings = alternate(runs, device=args.device, warmup=1, repeats=args.repeats)
    rows = _rows("generate", workload.name, timings, workload.batch * workload.new_tokens, parameters)
    if args.gpu_check:
        _weights_floor(rows, workload, models["zoo"], args)
        for row in rows:
            if row["contender"] != "floor":
                with torch.inference_mode(), PeakMemory(args.device) as memory:
                    runs[row["contender"]]()
                row["peak_mib"] = memory.peak / 2**20  # the call's peak over everything resident before it
    elif not args.no_memory:
        for row in rows:
            if row["contender"] != "floor":
                row.update(measure("generate", workload.name, row["contender"], device=args.device) or {})
    return rows


def _memory_rows(workload: GenerateWorkload, args: argparse.Namespace) -> list[dict[str, Any]]:
    """A workload loaded from a checkpoint, measured for memory only (`bench.memory`): one row per contender,
    no timing. The checkpoint is written once per run into a temporary folder (``args.checkpoints``), which
    `main` removes at the end."""
    if args.no_memory:
        return []
    key = json.dumps(workload.spec, sort_keys=True)
    if key not in args.checkpoints:
        folder = Path(tempfile.mkdtemp(prefix="zoo-bench-"))
        args.checkpoints[key] = folder
        if not write_checkpoint(workload.name, folder, device=args.device):
            print(f"{workload.name}: writing its checkpoint failed; no memory rows", file=sys.stderr)
    import zoo

    parameters = zoo.build(workload.spec, device="meta").num_parameters()
    rows = []
    for contender in workload.contenders:
        row = {
            "kind": "generate", "workload": workload.name, "contender": contender, "rate": None,
            "slowest": None, "fastest": None, "seconds": [], "vs_hf": None, "parameters": parameters,
        }  # fmt: skip
        measured = measure(
            "generate", workload.name, contender, device=args.device, checkpoint=args.checkpoints[key]
        )
        rows.append(row | (measured or {}))
    return rows


# A compiled decode step slower than this fraction of eager decoding is a regression (issue: float32 at batch 8
# once ran ~25x slower under inference_mode): its row is marked and the run exits with status 1.
COMPILED_FLOOR = 0.9


def guard_compiled(rows: list[dict[str, Any]]) -> list[str]:
    """Mark every compiled row (``zoo-compiled``, ``zoo-cuda-graphs``) slower than ``COMPILED_FLOOR`` x its
    workload's eager ``zoo`` row (``below_eager``: its ratio); one line per marked row."""
    eager = {r["workload"]: r["rate"] for r in rows if r["contender"] == "zoo"}
    problems = []
    for row in rows:
        base = eager.get(row["workload"])
        if row["contender"] in ("zoo-compiled", "zoo-cuda-graphs") and base:
            row["vs_eager"] = row["rate"] / base
            if row["vs_eager"] < COMPILED_FLOOR:
                row["below_eager"] = True
                problems.append(
                    f"{row['workload']}: {row['contender']} runs at {row['vs_eager']:.2f}x eager zoo "
                    f"({row['rate']:,.0f} vs {base:,.0f} tokens/s), below the {COMPILED_FLOOR}x guard"
                )
    return problems


def _weights_floor(rows: list[dict[str, Any]], workload: GenerateWorkload, model: Any, args: Any) -> None:
    """``vs_weights_floor`` of each row: its rate over the weights-read floor, the tokens/s of a decoder that
    does nothing but read every weight once per step at the device's measured copy bandwidth
    (``batch x bandwidth / weight bytes``)."""
    from bench.bandwidth import copy_bandwidth

    if args.bandwidth is None:
        args.bandwidth = copy_bandwidth(args.device)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())  # tied: counted once
    floor = workload.batch * args.bandwidth / weight_bytes
    for row in rows:
        row["weights_floor_rate"] = floor
        row["vs_weights_floor"] = row["rate"] / floor


def _rows(kind: str, workload: str, timings: dict, units: int, parameters: int) -> list[dict[str, Any]]:
    hf = timings.get("hf")
    rows = []
    for name, timing in timings.items():
        rate, slowest, fastest = timing.rate(units)
        rows.append(
            {
                "kind": kind,
                "workload": workload,
                "contender": name,
                "rate": rate,
                "slowest": slowest,
                "fastest": fastest,
                "seconds": timing.seconds,
                "vs_hf": hf.median / timing.median if hf is not None else None,
                "parameters": parameters if name != "floor" else None,
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help="GPT and BERT shapes only, no compiled decoding, fewer repetitions, no memory (~3 min on 2 cores)",
    )
    parser.add_argument("--device", default="cpu", help="cpu (default), cuda or cuda:N")
    parser.add_argument(
        "--peak-tflops",
        type=float,
        default=None,
        help="the GPU's dense bf16 peak for MFU (default: looked up by device name; unknown: MFU n/a)",
    )
    parser.add_argument("--only", choices=["train", "generate"], help="run one section")
    parser.add_argument("--match", default="", help="only workloads whose name contains this text")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory subprocesses")
    parser.add_argument(
        "--gpu-check",
        action="store_true",
        help="`make gpu-check`'s rows (bf16 training with MFU, bf16 decoding with CUDA graphs, memory against "
        "zoo.summary, the weights-read floor), sized for ~3 minutes on one H100",
    )
    parser.add_argument("--tiny", action="store_true", help="with --gpu-check: test-sized shapes (CPU tests)")
    report.add_output_options(parser)
    args = parser.parse_args(argv)
    if not re.fullmatch(r"cpu|cuda(:\d+)?", args.device):
        parser.error(f"--device {args.device}: expected cpu, cuda or cuda:N")
    if args.device.startswith("cuda"):
        # Never fall back to the CPU: a GPU run's numbers are the point.
        if not torch.cuda.is_available():
            parser.exit(
                2,
                f"python -m bench: --device {args.device} needs a CUDA GPU, and torch {torch.__version__} "
                "sees none (torch.cuda.is_available() is False); leave out --device for the CPU benchmark\n",
            )
        # An index is needed: torch 2.11's set_device refuses a bare "cuda" (2.13 takes it as the current GPU).
        torch.cuda.set_device(torch.device(args.device).index or 0)
        args.peak_tflops = args.peak_tflops or bf16_peak_tflops(torch.cuda.get_device_name())
    if args.tiny and not args.gpu_check:
        parser.error("--tiny goes with --gpu-check")
    args.repeats = args.repeats or (3 if args.gpu_check else 2 if args.quick else 5)
    args.no_memory = args.no_memory or args.quick
    args.bandwidth = None  # bytes/s of a device copy, measured once when a row needs it
    args.checkpoints = {}  # spec -> the temporary folder its checkpoint was written to (`_memory_rows`)
    torch.manual_seed(0)
    if args.gpu_check:
        workloads = gpu_check_suite(tiny=args.tiny)
    else:
        workloads = suite(quick=args.quick, device=args.device)
    record: dict[str, Any] = {
        "machine": report.machine(args.device, peak_tflops=args.peak_tflops),
        "quick": args.quick,
        "repeats": args.repeats,
        "warmup": args.warmup,
        "results": [],
    }
    started = time.perf_counter()
    sections = [("train", workloads.train, run_train), ("generate", workloads.generate, run_generate)]
    if args.gpu_check:  # under a time limit: the quick rows first, compiling GPT-2 medium's training last
        sections.reverse()
    out = report.output_dir(args)
    try:
        for section, items, runner in sections:
            if args.only and args.only != section:
                continue
            for workload in items:
                if args.match not in workload.name:
                    continue
                rows = runner(workload, args)
                record["results"] += rows
                for row in rows:
                    print(_progress_line(row), flush=True)
                if args.gpu_check:  # a run stopped by its time limit keeps the rows it finished
                    record["elapsed_s"] = time.perf_counter() - started
                    report.write(record, out)
    finally:
        for folder in args.checkpoints.values():
            shutil.rmtree(folder, ignore_errors=True)
    record["elapsed_s"] = time.perf_counter() - started
    if args.bandwidth is not None:
        record["machine"]["copy_bandwidth_gbs"] = args.bandwidth / 1e9
    problems = guard_compiled(record["results"])
    json_path, md_path = report.write(record, out)
    print(f"\n{report.markdown(record)}\nwrote {json_path} and {md_path} in {record['elapsed_s']:.0f} s")
    for problem in problems:
        print(f"python -m bench: REGRESSION: {problem}", file=sys.stderr)
    return 1 if problems else 0


def _progress_line(row: dict[str, Any]) -> str:
    ratio = f"  {row['vs_hf']:.2f}x HF" if row["vs_hf"] else ""
    mfu = f"  MFU {report.mfu_text(row)}" if "mfu" in row else ""
    if row["rate"] is None:  # a memory-only row
        memory = f"{row['peak_mib']:,.0f} MiB over the model" if row.get("peak_mib") is not None else "failed"
        return f"{row['workload']:45s} {row['contender']:6s} {memory}"
    return f"{row['workload']:45s} {row['contender']:6s} {row['rate']:10,.0f}/s{ratio}{mfu}"


if __name__ == "__main__":
    sys.exit(main())
