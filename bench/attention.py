"""Attention patterns on the CPU: flex_attention's block-sparse kernel against SDPA with the dense bool mask.

    python -m bench.attention           # about 2-3 minutes on 2 cores
    python -m bench.attention --no-memory --repeats 2

Each workload is one inference forward (batch 1, float32, no gradients: torch has no CPU backward for flex)
of a model whose self-attention has the pattern, run with ``zoo.blocks.flex.attention_kernel("sdpa")`` and
``("flex")`` alternately in one process (`bench.timing.alternate`); compile time is warm-up. Peak memory is
measured per kernel in a fresh process (`bench.memory`'s method: fixed mmap threshold, resident-set
high-water mark over one forward after a warm-up one). Writes attention.json and attention.md to
bench/results/local/ (ignored by git), or --out DIR; --update writes the tracked bench/results/.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

if __package__ in (None, ""):  # `python bench/attention.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import report
from bench.timing import PeakMemory, alternate

ROOT = Path(__file__).resolve().parent.parent
KERNELS = ("sdpa", "flex")
# 2 layers, width 512, 8 heads (the rest of bench/'s shapes), no output head: the stack is what differs
BODY = dict(
    vocab_size=8192, d_model=512, num_layers=2, attention={"num_heads": 8}, ffn={"d_ff": 2048}, dropout=0.0
)
WORKLOADS = {  # name -> (family, position, pattern)
    "sliding_window 256, causal decoder": ("decoder", "rotary", {"kind": "sliding_window", "window": 256}),
    "block_sparse 64 (3 window, 1+1 global, 3 random), encoder": (
        "encoder",
        "learned",
        {
            "kind": "block_sparse",
            "block_size": 64,
            "window_blocks": 3,
            "global_blocks": 1,
            "random_blocks": 3,
        },
    ),
}
LENGTHS = (2048, 4096)


def build(name: str, length: int) -> Any:
    import zoo

    family, position, pattern = WORKLOADS[name]
    stack = "decoder" if family == "decoder" else "encoder"
    head = {"lm_head": None} if family == "decoder" else {}
    spec = zoo.parse_spec(
        {
            "family": family,
            **BODY,
            "max_positions": length,
            "position": {"kind": position},
            stack: {"pattern": pattern},
        }
        | head
    )
    torch.manual_seed(0)
    return zoo.build(spec).eval()


def forward_fn(model: Any, length: int, kernel: str) -> Any:
    from zoo.blocks.flex import attention_kernel

    ids = torch.randint(3, 8192, (1, length), generator=torch.Generator().manual_seed(1))

    def run() -> None:
        with attention_kernel(kernel), torch.no_grad():  # type: ignore[arg-type]
            model(ids)

    return run


def measure(name: str, length: int, kernel: str) -> float | None:
    """Peak MiB of one forward in a fresh process (None if the child failed)."""
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-m", "bench.attention", "--child", name, str(length), kernel],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=600,
    )  # fmt: skip
    if result.returncode != 0:
        return None
    return json.loads(result.stdout.strip().splitlines()[-1])["peak_mib"]


def _child(name: str, length: int, kernel: str) -> float:
    torch.set_num_threads(1)
    run = forward_fn(build(name, length), length, kernel)
    run()  # warm-up: compiles flex, allocates what stays
    with PeakMemory("cpu") as memory:
        run()
    return memory.peak / 2**20


def markdown(record: dict[str, Any]) -> str:
    m = record["machine"]
    lines = [
        f"Measured on {m['cpu']} ({m['cores']} cores, {m['torch_threads']} torch threads), torch {m['torch']}; "
        f"batch 1, float32, inference; median of {record['repeats']} alternating repetitions, "
        "(slowest–fastest) in brackets.",
        "",
        "| pattern | sequence | SDPA + dense mask, tokens/s | flex, tokens/s | flex / SDPA | SDPA peak | flex peak | "
        "SDPA / flex memory |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in record["results"]:
        dense, sparse = row["sdpa"], row["flex"]
        memory = [row.get(f"{k}_peak_mib") for k in KERNELS]
        mem_ratio = f"{memory[0] / memory[1]:.1f}x" if all(memory) else "–"
        lines.append(
            f"| {row['workload']} | {row['length']:,} | {_rate(dense)} | {_rate(sparse)} | "
            f"{dense['median_s'] / sparse['median_s']:.2f}x | {_mib(memory[0])} | {_mib(memory[1])} | {mem_ratio} |"
        )
    return "\n".join(lines) + "\n"


def _rate(timing: dict[str, float]) -> str:
    return f"{timing['rate']:,.0f} ({timing['slowest']:,.0f}–{timing['fastest']:,.0f})"


def _mib(value: float | None) -> str:
    return f"{value:,.0f} MiB" if value is not None else "–"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.attention", description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory subprocesses")
    report.add_output_options(parser)
    parser.add_argument("--child", nargs=3, metavar=("WORKLOAD", "LENGTH", "KERNEL"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        name, length, kernel = args.child
        print(json.dumps({"peak_mib": _child(name, int(length), kernel)}))
        return 0
    started = time.perf_counter()
    record: dict[str, Any] = {"machine": report.machine("cpu"), "repeats": args.repeats, "results": []}
    for name in WORKLOADS:
        for length in LENGTHS:
            model = build(name, length)
            runs = {kernel: forward_fn(model, length, kernel) for kernel in KERNELS}
            timings = alternate(runs, device="cpu", warmup=1, repeats=args.repeats)
            row: dict[str, Any] = {"workload": name, "length": length}
            for kernel, timing in timings.items():
                rate, slowest, fastest = timing.rate(length)
                row[kernel] = {
                    "rate": rate,
                    "slowest": slowest,
                    "fastest": fastest,
                    "median_s": timing.median,
                }
                if not args.no_memory:
                    row[f"{kernel}_peak_mib"] = measure(name, length, kernel)
            record["results"].append(row)
            print(
                f"{name:55s} {length:5d}  sdpa {row['sdpa']['rate']:7,.0f}/s  flex {row['flex']['rate']:7,.0f}/s"
            )
    record["elapsed_s"] = time.perf_counter() - started
    out = report.output_dir(args)
    out.mkdir(parents=True, exist_ok=True)
    (out / "attention.json").write_text(json.dumps(record, indent=2) + "\n")
    (out / "attention.md").write_text(markdown(record))
    print(f"\n{markdown(record)}\nwrote {out}/attention.json and attention.md in {record['elapsed_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
