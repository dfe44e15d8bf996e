"""The chunked loss (``loss.chunk_tokens``, `zoo.losses.chunked`): peak memory and time of one full
fine-tuning step at 2,048 tokens with Llama 3's 128,256-token vocabulary, the loss through the LM head in
chunks against all logits at once.

    python -m bench.chunked_loss                        # 2,048 tokens, float32: a few minutes on 2 cores
    python -m bench.chunked_loss --tokens 512 --steps 1   # a quick look

The model is Llama 3.2 1B's architecture (tied embeddings, 128,256-token vocabulary) narrowed to width 512
and 4 layers (``--width``, ``--layers``), so the logits dominate, as they do for a 1B model at long sequences.
Each contender runs in a fresh process (`bench.memory`'s allocator settings, so freed memory is given
back) through zoo's own trainer: a ``causal_lm`` `zoo.training.Trainer` whose only difference is
``loss.chunk_tokens`` (``null``: the plain loss; ``auto``: chunks of 64M logits), each step
`Trainer._train_step` on one 2,048-token row of random ids: forward, backward, gradient clipping and the
AdamW step, float32 weights and compute. After one warm-up step (the optimizer's states exist from there),
the step's peak resident set over the one before it (`bench.timing.PeakMemory`), the process's whole peak,
and the wall time of ``--steps`` further steps (median). Writes chunked_loss.json and chunked_loss.md to
bench/results/local/ (ignored by git), or --out DIR; --update writes the tracked bench/results/.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

if __package__ in (None, ""):  # `python bench/chunked_loss.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import report
from bench.memory import _ENV

ROOT = Path(__file__).resolve().parent.parent
CONTENDERS = {"plain": None, "chunked": "auto"}  # name -> loss.chunk_tokens


def config(folder: Path, chunk_tokens: str | None, args: argparse.Namespace) -> Any:
    """A causal_lm run of the narrowed Llama 3.2 shape on a few lines of text (the batches are given by
    hand: the data only has to exist), its vocabulary kept at 128,256 whatever the tokenizer's size."""
    from zoo.training import TrainConfig

    text = folder / "lines.txt"
    text.write_text("\n".join(["the cat sees the dog", "a dog eats the fish", "the bird sings"] * 40))
    return TrainConfig.from_dict(
        {
            "model": {
                "preset": "llama-3.2-1b",
                "overrides": {
                    "d_model": args.width,
                    "num_layers": args.layers,
                    "attention.num_heads": args.width // 64,
                    "attention.num_kv_heads": max(1, args.width // 256),
                    "ffn.d_ff": 4 * args.width,
                    "vocab_size": args.vocab,
                    "max_positions": args.tokens,
                },
            },
            "task": "causal_lm",
            "data": {"train": str(text)},
            "tokenizer": {"kind": "bpe", "vocab_size": 200, "min_frequency": 1},
            "batch": {"max_tokens": args.tokens},
            "schedule": {"kind": "constant", "lr": 1e-4, "warmup_steps": 0},
            "loss": {"chunk_tokens": chunk_tokens},
            "max_steps": 100,
            "num_threads": args.threads,
            "output_dir": str(folder / "run"),
        }
    )


def child(contender: str, args: argparse.Namespace) -> dict[str, Any]:
    """One contender in this (fresh) process: the step's peak over the resident set before it, the
    process's peak, and the step times."""
    from bench.timing import PeakMemory
    from zoo.losses import shift_labels_left
    from zoo.training import Trainer
    from zoo.training.batching import Batch
    from zoo.training.report.reporting import Interval

    with tempfile.TemporaryDirectory() as folder:
        trainer = Trainer(config(Path(folder), CONTENDERS[contender], args), progress=False, overwrite=True)
        try:
            trainer.interval = Interval(trainer.runtime.device)  # what fit() sets up before its first step
            ids = torch.randint(0, args.vocab, (1, args.tokens), generator=torch.Generator().manual_seed(0))
            batch = Batch({"input_ids": ids}, shift_labels_left(ids), args.tokens)
            loss = float(trainer._train_step([batch]))  # warm-up: AdamW's states exist from here on
            with PeakMemory("cpu") as memory:
                trainer._train_step([batch])
            seconds, cpu = [], []
            for _ in range(args.steps):
                start, start_cpu = time.perf_counter(), time.process_time()
                trainer._train_step([batch])
                seconds.append(time.perf_counter() - start)
                cpu.append(time.process_time() - start_cpu)
            parameters = sum(p.numel() for p in trainer.model.parameters())
            chunk = getattr(trainer.objective, "chunk_tokens", None)
        finally:
            trainer.close()
    return {
        "step_peak_mib": memory.peak / 2**20,
        "process_peak_mib": (memory.process or 0) / 2**20,
        "step_s": statistics.median(seconds) if seconds else None,
        "step_times_s": seconds,
        "step_cpu_s": statistics.median(cpu) if cpu else None,  # steadier than wall time on a shared machine
        "first_loss": loss,
        "parameters": parameters,
        "chunk_tokens": chunk,
    }


def run_child(contender: str, argv: list[str]) -> dict[str, Any]:
    command = [sys.executable, "-m", "bench.chunked_loss", "--child", contender, *argv]
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, **_ENV}, cwd=ROOT)
    if done.returncode:
        raise RuntimeError(f"bench.chunked_loss child {contender} failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def markdown(record: dict[str, Any]) -> str:
    m, plain = record["machine"], record["results"]["plain"]
    lines = [
        f"Measured on {m['cpu']} ({m['cores']} cores, {record['threads']} torch threads), torch {m['torch']}; "
        f"{record['model']}; one full fine-tuning step (`Trainer._train_step`: forward, backward, clipping, "
        f"AdamW) on {record['tokens']:,} tokens, float32; each contender in a fresh process; step time the "
        f"median of {record['steps']}, wall (the process's CPU time in brackets: steadier on a shared machine).",
        "",
        "| loss | chunk | step peak over the model | vs plain | process peak | vs plain | step time (CPU) | vs plain |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, row in record["results"].items():
        chunk = f"{row['chunk_tokens']} tokens" if row["chunk_tokens"] else "–"
        time_ = f"{row['step_s']:.1f} s ({row['step_cpu_s']:.1f} s)" if row["step_s"] else "–"
        time_ratio = (
            f"{row['step_s'] / plain['step_s']:.2f}x ({row['step_cpu_s'] / plain['step_cpu_s']:.2f}x)"
            if row["step_s"] and plain["step_s"]
            else "–"
        )
        lines.append(
            f"| {name} | {chunk} | {row['step_peak_mib']:,.0f} MiB | "
            f"{row['step_peak_mib'] / plain['step_peak_mib']:.2f}x | {row['process_peak_mib']:,.0f} MiB | "
            f"{row['process_peak_mib'] / plain['process_peak_mib']:.2f}x | {time_} | {time_ratio} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.chunked_loss", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--tokens", type=int, default=2048, help="tokens in the step's one row (default 2048)"
    )
    parser.add_argument("--vocab", type=int, default=128_256, help="vocabulary (default Llama 3's 128,256)")
    parser.add_argument("--width", type=int, default=512, help="model width (default 512)")
    parser.add_argument("--layers", type=int, default=4, help="decoder layers (default 4)")
    parser.add_argument("--steps", type=int, default=2, help="timed steps after the measured one (default 2)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1: steadier)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    report.add_output_options(parser)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args)))
        return 0
    started = time.perf_counter()
    shape = [
        *("--tokens", str(args.tokens), "--vocab", str(args.vocab), "--width", str(args.width)),
        *("--layers", str(args.layers), "--steps", str(args.steps), "--threads", str(args.threads)),
    ]
    results = {}
    for name in CONTENDERS:  # one at a time: each its own process, never two beside each other
        results[name] = run_child(name, shape)
        row = results[name]
        print(
            f"{name:8s} step peak {row['step_peak_mib']:8,.0f} MiB  process peak "
            f"{row['process_peak_mib']:8,.0f} MiB  step {row['step_s'] or 0:.2f} s, CPU {row['step_cpu_s'] or 0:.2f} s",
            flush=True,
        )
    parameters = results["plain"]["parameters"]
    record: dict[str, Any] = {
        "machine": report.machine("cpu"),
        "model": (
            f"Llama 3.2 1B's architecture at width {args.width}, {args.layers} layers, tied "
            f"{args.vocab:,}-token embeddings ({parameters:,} parameters)"
        ),
        "tokens": args.tokens,
        "threads": args.threads,
        "steps": args.steps,
        "results": results,
        "step_peak_ratio": results["chunked"]["step_peak_mib"] / results["plain"]["step_peak_mib"],
        "process_peak_ratio": results["chunked"]["process_peak_mib"] / results["plain"]["process_peak_mib"],
    }
    record["elapsed_s"] = time.perf_counter() - started
    out = report.output_dir(args)
    out.mkdir(parents=True, exist_ok=True)
    (out / "chunked_loss.json").write_text(json.dumps(record, indent=2) + "\n")
    (out / "chunked_loss.md").write_text(markdown(record))
    print(
        f"\n{markdown(record)}\nwrote {out}/chunked_loss.json and chunked_loss.md in {record['elapsed_s']:.0f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
