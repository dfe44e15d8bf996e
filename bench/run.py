"""Side-by-side benchmark of zoo against Hugging Face `transformers` and `torch.nn.Transformer`.

    python -m bench --quick             # < 5 minutes on 2 CPU cores
    python -m bench --device cuda       # adds bf16 + torch.compile variants and MFU on a GPU
    python -m bench --only generate     # one section

Writes bench/results/results.json and results.md (the README's tables come from there).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import torch

if __package__ in (None, ""):  # `python bench/run.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import contenders, report
from bench.memory import measure
from bench.timing import alternate
from bench.workloads import GenerateWorkload, TrainWorkload, suite

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def run_train(workload: TrainWorkload, args: argparse.Namespace) -> list[dict[str, Any]]:
    dtype = torch.float32
    models = {name: contenders.build(name, workload.spec, args.device, dtype) for name in workload.contenders}
    parameters = contenders.check_same_size(models)
    batch = contenders.train_batch(workload, args.device)
    runs = {name: contenders.train_step_fn(name, workload, model, batch) for name, model in models.items()}
    timings = alternate(runs, device=args.device, warmup=args.warmup, repeats=args.repeats)
    rows = _rows("train", workload.name, timings, workload.tokens_per_step, parameters)
    if not args.no_memory:
        for row in rows:
            row["peak_mib"] = measure("train", workload.name, row["contender"], device=args.device)
    return rows


def run_generate(workload: GenerateWorkload, args: argparse.Namespace) -> list[dict[str, Any]]:
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
    return _rows("generate", workload.name, timings, workload.batch * workload.new_tokens, parameters)


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
        "--quick", action="store_true", help="fewer repetitions and workloads (< 5 min on 2 cores)"
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--only", choices=["train", "generate"], help="run one section")
    parser.add_argument("--match", default="", help="only workloads whose name contains this text")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory subprocesses")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    args = parser.parse_args(argv)
    args.repeats = args.repeats or (2 if args.quick else 5)
    args.no_memory = args.no_memory or args.quick
    torch.manual_seed(0)
    workloads = suite(quick=args.quick, device=args.device)
    record: dict[str, Any] = {
        "machine": report.machine(args.device),
        "quick": args.quick,
        "repeats": args.repeats,
        "warmup": args.warmup,
        "results": [],
    }
    started = time.perf_counter()
    sections = [("train", workloads.train, run_train), ("generate", workloads.generate, run_generate)]
    for section, items, runner in sections:
        if args.only and args.only != section:
            continue
        for workload in items:
            if args.match not in workload.name:
                continue
            rows = runner(workload, args)
            record["results"] += rows
            for row in rows:
                ratio = f"  {row['vs_hf']:.2f}x HF" if row["vs_hf"] else ""
                print(
                    f"{row['workload']:45s} {row['contender']:6s} {row['rate']:10,.0f}/s{ratio}", flush=True
                )
    record["elapsed_s"] = time.perf_counter() - started
    json_path, md_path = report.write(record, args.out)
    print(f"\n{report.markdown(record)}\nwrote {json_path} and {md_path} in {record['elapsed_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
