"""QLoRA and low-bit optimizer memory: one LoRA step on Llama 3.2 1B's shape, and optimizer-state bytes.

    python -m bench.qlora                 # both tables (~6 min and ~9 GB of temporary files on this CPU)
    python -m bench.qlora --only step     # the LoRA-step rows; --only optim: the optimizer rows

**LoRA step.** The bench writes Llama 3.2 1B's shape (1.24B parameters, tied 128256 x 2048 embedding) with
random weights in bfloat16 into a temporary folder, as a zoo checkpoint and its `zoo.to_hf` export (2.5 GB
each; deleted at the end). Each contender runs in a fresh process (glibc told to return large frees,
``MALLOC_MMAP_THRESHOLD_``) that loads the model in bfloat16 as a user would, adds LoRA r=8 (alpha 16) on
q/k/v/o, and runs one optimizer step (AdamW over the adapters) on one sequence of 256 tokens, the labels
its own ids. Reported: the process's peak resident set (VmHWM: interpreter, libraries, the load and the
step, as a user's process pays), and the seconds of the load and of the step.

    peft-bf16   transformers ``from_pretrained(dtype=bfloat16)`` + PEFT ``get_peft_model``
    peft-bnb    the same with bitsandbytes' 4-bit NF4 base (``BitsAndBytesConfig``): CUDA only
    zoo-bf16    ``zoo.load(dtype=bfloat16)`` + ``zoo.lora.apply``
    zoo-nf4     ``zoo.lora.load_base(dtype=bfloat16)`` + ``zoo.lora.apply(..., quantize_base="nf4")``:
                every attention and FFN projection NF4, as bitsandbytes' 4-bit loading does

**Optimizer state.** A 4-layer, 1,024-wide decoder (every matrix well over torchao's 4,096-element floor for
quantised states), one full fine-tuning step with each optimizer; the bytes of every tensor in its state
(quantised ones: their codes, scales and lookup table), divided by the trained parameters.

With ``--only``, the other table already in the output folder's qlora.json is kept. Writes qlora.json and qlora.md to bench/results/local/ (ignored by git), or --out DIR; --update writes the
tracked bench/results/.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from bench import report
from bench.workloads import LLAMA_1B

ROOT = Path(__file__).resolve().parent.parent
_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536", "PYTHONPATH": str(ROOT)}
TOKENS, RANK = 256, 8
CONTENDERS = ("peft-bf16", "peft-bnb", "zoo-bf16", "zoo-nf4")
OPTIMIZERS = ("adamw", "adamw8bit", "adamw4bit")


def _peak_gb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024 / 1e9
    return float("nan")


def _load(contender: str, folder: Path, device: str) -> torch.nn.Module:
    """The base with LoRA r=8 on q/k/v/o, as each library's user writes it."""
    if contender.startswith("zoo"):
        import zoo
        import zoo.lora

        if contender == "zoo-nf4":
            base = zoo.lora.load_base(folder / "zoo", device=device, dtype=torch.bfloat16)
        else:
            base = zoo.load(folder / "zoo", device=device, dtype=torch.bfloat16)
        quantize = "nf4" if contender == "zoo-nf4" else None
        return zoo.lora.apply(base, r=RANK, alpha=16, targets=["qkv", "out"], quantize_base=quantize)
    import peft
    import transformers

    extra: dict[str, Any] = {}
    if contender == "peft-bnb":
        extra["quantization_config"] = transformers.BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.bfloat16
        )
    model = transformers.AutoModelForCausalLM.from_pretrained(folder / "hf", dtype=torch.bfloat16, **extra)
    model = model.to(device) if contender == "peft-bf16" else model
    config = peft.LoraConfig(r=RANK, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
    return peft.get_peft_model(model, config)


def _step_child(contender: str, folder: Path, device: str) -> dict[str, float]:
    torch.manual_seed(0)
    start = time.perf_counter()
    model = _load(contender, folder, device)
    loaded = time.perf_counter()
    model.train()
    ids = torch.randint(0, LLAMA_1B["vocab_size"], (1, TOKENS), device=device)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    if contender.startswith("zoo"):  # the loss as zoo train computes it: chunked through the head
        from zoo.losses.chunked import ChunkedLoss, auto_chunk_tokens

        targets = torch.cat([ids[0, 1:], ids.new_full((1,), -100)])  # (T,) the next tokens; the last unscored
        chunked = ChunkedLoss(targets, chunk_tokens=auto_chunk_tokens(LLAMA_1B["vocab_size"]))
        loss = model(input_ids=ids, chunked_loss=chunked).token_losses.sum() / (TOKENS - 1)
    else:
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    done = time.perf_counter()
    row = {"peak_gb": _peak_gb(), "load_s": loaded - start, "step_s": done - loaded, "loss": float(loss)}
    if device == "cuda":
        row["cuda_peak_gb"] = torch.cuda.max_memory_allocated() / 1e9
    return row


def _write_child(folder: Path) -> None:
    import zoo

    torch.manual_seed(0)
    model = zoo.build({**LLAMA_1B, "name": "llama-3.2-1b-shaped"}, dtype=torch.bfloat16)
    zoo.save(model, folder / "zoo")
    zoo.to_hf(model, folder / "hf")


def _child(*args: str) -> dict[str, Any] | None:
    result = subprocess.run(
        [sys.executable, "-m", "bench.qlora", "--child", *args],
        capture_output=True, text=True, env={**os.environ, **_ENV}, cwd=ROOT, timeout=1800,
    )  # fmt: skip
    if result.returncode != 0:
        print(f"bench.qlora {' '.join(args)} failed:\n{result.stderr[-2000:]}", file=sys.stderr)
        return None
    return json.loads(result.stdout.strip().splitlines()[-1]) if result.stdout.strip() else {}


def step_rows(device: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="zoo-qlora-") as temp:
        folder = Path(temp)
        if _child("write", str(folder)) is None:
            return rows
        for contender in CONTENDERS:
            row: dict[str, Any] = {"contender": contender}
            skip = _skip(contender, device)
            if skip:
                rows.append(row | {"skipped": skip})
                continue
            measured = _child("step", contender, str(folder), device)
            rows.append(row | (measured if measured is not None else {"skipped": "failed (see stderr)"}))
        shutil.rmtree(folder, ignore_errors=True)
    base = next((r for r in rows if r["contender"] == "zoo-bf16" and "peak_gb" in r), None)
    for row in rows:
        if base is not None and "peak_gb" in row:
            row["vs_zoo_bf16"] = row["peak_gb"] / base["peak_gb"]
    return rows


def _skip(contender: str, device: str) -> str | None:
    if contender != "peft-bnb":
        return None
    if device != "cuda" or not torch.cuda.is_available():
        return "skipped: no CUDA"
    try:
        import bitsandbytes  # noqa: F401
    except ImportError:
        return "skipped: bitsandbytes not installed"
    return None


def _state_bytes(optimizer: torch.optim.Optimizer) -> int:
    total = 0
    for state in optimizer.state.values():
        for value in state.values():
            if not isinstance(value, torch.Tensor):
                continue
            if hasattr(value, "__tensor_flatten__") and type(value) is not torch.Tensor:
                parts, _ = value.__tensor_flatten__()
                total += sum(getattr(value, p).numel() * getattr(value, p).element_size() for p in parts)
            elif value.ndim > 0:  # the step counter is a 0-d scalar: not per-parameter memory
                total += value.numel() * value.element_size()
    return total


def optim_rows(device: str) -> list[dict[str, Any]]:
    import zoo
    from zoo.training.config import OptimConfig
    from zoo.training.optim import build_optimizer, set_learning_rate

    spec = {
        **LLAMA_1B,
        "vocab_size": 8192,
        "d_model": 1024,
        "num_layers": 4,
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    spec["ffn"] = {**LLAMA_1B["ffn"], "d_ff": 4096}
    rows = []
    for name in OPTIMIZERS:
        torch.manual_seed(0)
        model = zoo.build(spec, device=device)
        optimizer = build_optimizer(model, OptimConfig(name=name))  # type: ignore[arg-type]
        set_learning_rate(optimizer, 1e-4)
        ids = torch.randint(0, spec["vocab_size"], (1, 64), device=device)
        model(ids, labels=ids).loss.backward()
        optimizer.step()
        parameters = sum(p.numel() for p in model.parameters() if p.requires_grad)
        state = _state_bytes(optimizer)
        rows.append(
            {
                "optimizer": name,
                "parameters": parameters,
                "state_bytes": state,
                "bytes_per_parameter": state / parameters,
            }
        )
        del model, optimizer
    return rows


def markdown(record: dict[str, Any]) -> str:
    lines = [f"# QLoRA and optimizer memory ({record['machine'].get('device', record['device'])})", ""]
    if record.get("step"):
        lines += [
            f"One LoRA r={RANK} step on q/k/v/o, {TOKENS} tokens, Llama 3.2 1B's shape in bfloat16 (fresh process each; zoo's loss chunked through the head (`loss.chunk_tokens: auto`), PEFT's through transformers' `labels=`).",
            "",
            "| contender | peak RSS (GB) | vs zoo-bf16 | load (s) | step (s) |",
            "|---|---:|---:|---:|---:|",
        ]
        for row in record["step"]:
            if "skipped" in row:
                lines.append(f"| {row['contender']} | {row['skipped']} | | | |")
                continue
            ratio = f"{row['vs_zoo_bf16']:.2f}x" if "vs_zoo_bf16" in row else ""
            lines.append(
                f"| {row['contender']} | {row['peak_gb']:.2f} | {ratio} | {row['load_s']:.1f} | {row['step_s']:.1f} |"
            )
        lines.append("")
    if record.get("optim"):
        lines += ["| optimizer | state bytes / parameter |", "|---|---:|"]
        lines += [f"| {r['optimizer']} | {r['bytes_per_parameter']:.2f} |" for r in record["optim"]]
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--child":
        if argv[1] == "write":
            _write_child(Path(argv[2]))
            print("{}")
        else:
            print(json.dumps(_step_child(argv[2], Path(argv[3]), argv[4])))
        return 0
    parser = argparse.ArgumentParser(prog="python -m bench.qlora", description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=("step", "optim"), help="one table only")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    report.add_output_options(parser)
    args = parser.parse_args(argv)
    record: dict[str, Any] = {"bench": "qlora", "device": args.device, "machine": report.machine(args.device)}
    if args.only in (None, "step"):
        record["step"] = step_rows(args.device)
    if args.only in (None, "optim"):
        record["optim"] = optim_rows(args.device)
    out = report.output_dir(args)
    out.mkdir(parents=True, exist_ok=True)
    previous = out / "qlora.json"
    if args.only and previous.is_file():  # the table not run this time is kept from the file's last run
        kept = json.loads(previous.read_text())
        other = "optim" if args.only == "step" else "step"
        if other in kept:
            record[other] = kept[other]
    (out / "qlora.json").write_text(json.dumps(record, indent=2) + "\n")
    (out / "qlora.md").write_text(markdown(record))
    print(markdown(record))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
