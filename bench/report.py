"""The benchmark's outputs: a JSON record and a Markdown table, with the machine they were measured on.

Where they go: ``bench/results/local/`` by default (ignored by git, so a bench run never changes the work
tree), ``--out DIR`` anywhere, ``--update`` into ``bench/results/`` itself, the tracked results that
bench/README.md and the README quote.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
from pathlib import Path
from typing import Any

import torch

TRACKED = Path(__file__).resolve().parent / "results"
LOCAL = TRACKED / "local"


def add_output_options(parser: argparse.ArgumentParser) -> None:
    """``--out DIR`` or ``--update``: where the JSON record and the Markdown table are written."""
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--out",
        type=Path,
        default=None,
        help="write the results here (default: bench/results/local/, ignored by git)",
    )
    where.add_argument(
        "--update", action="store_true", help="write into bench/results/: the tracked results the docs quote"
    )


def output_dir(args: argparse.Namespace) -> Path:
    """The folder `add_output_options`'s flags chose."""
    return TRACKED if args.update else args.out or LOCAL


def machine(device: str, *, peak_tflops: float | None = None) -> dict[str, Any]:
    cpu = platform.processor() or "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info = {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "device": device,
    }
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except ImportError:
        pass
    if device.startswith("cuda"):
        info["gpu"] = torch.cuda.get_device_name()
        info["bf16_peak_tflops"] = peak_tflops  # MFU's denominator; None: unknown GPU, MFU "n/a"
    return info


def mfu_text(row: dict[str, Any]) -> str:
    """A row's MFU as a percentage, "n/a" when the GPU's peak is unknown, "–" when not measured."""
    if "mfu" not in row:
        return "–"
    return f"{100 * row['mfu']:.1f}%" if row["mfu"] is not None else "n/a"


def markdown(record: dict[str, Any]) -> str:
    m = record["machine"]
    gpu = ""
    if "gpu" in m:
        peak = m.get("bf16_peak_tflops")
        gpu = f" ({m['gpu']}, dense bf16 peak {f'{peak:g} TFLOP/s' if peak else 'unknown'})"
    bandwidth = f", device copy {m['copy_bandwidth_gbs']:,.0f} GB/s" if m.get("copy_bandwidth_gbs") else ""
    lines = [
        f"Measured on {m['cpu']} ({m['cores']} cores, {m['torch_threads']} torch threads), {m['device']}{gpu}{bandwidth}, "
        f"torch {m['torch']}, transformers {m.get('transformers', '-')}; median of {record['repeats']} alternating "
        f"repetitions after {record['warmup']} warm-up, (slowest–fastest) in brackets.",
        "",
    ]
    for section, unit in (("train", "tokens/s"), ("generate", "new tokens/s")):
        rows = [r for r in record["results"] if r["kind"] == section and r["rate"] is not None]
        if not rows:
            continue
        title = (
            "Training step (forward + backward + fused AdamW)"
            if section == "train"
            else "Greedy generation, 128 new tokens, KV cache"
        )
        mfu = any("mfu" in r for r in rows)  # GPU bf16 training rows: model TFLOP/s and MFU columns
        process = any("process_mib" in r for r in rows)  # generation on CPU: the whole process's peak too
        memory_title = "peak memory over the model" if section == "generate" else "peak memory"
        floor = any("vs_weights_floor" in r for r in rows)  # gpu-check: rate over the weights-read floor
        estimate = any("estimate_mib" in r for r in rows)  # gpu-check: zoo.summary's training estimate
        lines += [
            f"**{title}**",
            "",
            f"| workload | contender | {unit} | vs HF |{' vs weights floor |' if floor else ''}"
            f"{' TFLOP/s | MFU |' if mfu else ''} {memory_title} |{' zoo.summary estimate |' if estimate else ''}"
            f"{' process peak |' if process else ''} parameters |",
            f"|---|---|---:|---:|{'---:|' if floor else ''}{'---:|---:|' if mfu else ''}---:|"
            f"{'---:|' if estimate else ''}{'---:|' if process else ''}---:|",
        ]
        for r in rows:
            ratio = f"{r['vs_hf']:.2f}x" if r.get("vs_hf") else "–"
            memory = f"{r['peak_mib']:.0f} MiB" if r.get("peak_mib") else "–"
            params = f"{r['parameters']:,}" if r.get("parameters") else "–"
            flops = f" {r['tflops']:,.1f} | {mfu_text(r)} |" if "tflops" in r else (" – | – |" if mfu else "")
            whole = (f" {r['process_mib']:.0f} MiB |" if r.get("process_mib") else " – |") if process else ""
            to_floor = (
                (f" {r['vs_weights_floor']:.2f}x |" if "vs_weights_floor" in r else " – |") if floor else ""
            )
            estimated = (
                (f" {r['estimate_mib']:.0f} MiB |" if "estimate_mib" in r else " – |") if estimate else ""
            )
            marked = " **below 0.9x eager**" if r.get("below_eager") else ""  # run.guard_compiled
            lines.append(
                f"| {r['workload']} | {r['contender']}{marked} | {r['rate']:,.0f} ({r['slowest']:,.0f}–{r['fastest']:,.0f}) "
                f"| {ratio} |{to_floor}{flops} {memory} |{estimated}{whole} {params} |"
            )
        lines.append("")
    return "\n".join(lines + _memory_only(record))


def _memory_only(record: dict[str, Any]) -> list[str]:
    """The table of the rows measured for memory only (`GenerateWorkload.from_checkpoint`: not timed)."""
    rows = [r for r in record["results"] if r["kind"] == "generate" and r["rate"] is None]
    if not rows:
        return []
    lines = [
        "**Greedy generation from a loaded checkpoint, memory only (8-token prompt, 4 new tokens)**",
        "",
        "| workload | contender | peak memory over the model | process peak | parameters |",
        "|---|---|---:|---:|---:|",
    ]
    for r in rows:
        over = f"{r['peak_mib']:,.0f} MiB" if r.get("peak_mib") is not None else "failed"
        whole = f"{r['process_mib']:,.0f} MiB" if r.get("process_mib") else "–"
        lines.append(f"| {r['workload']} | {r['contender']} | {over} | {whole} | {r['parameters']:,} |")
    return [*lines, ""]


def write(record: dict[str, Any], out_dir: Path) -> tuple[Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out_dir / "results.json", out_dir / "results.md"
    json_path.write_text(json.dumps(record, indent=2) + "\n")
    md_path.write_text(markdown(record) + "\n")
    return json_path, md_path
