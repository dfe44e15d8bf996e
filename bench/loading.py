"""Peak memory of loading a checkpoint and running one forward: zoo against transformers, on the same files.

    python -m bench.loading          # Llama 3.2 1B's shape, bf16, one 2.47 GB file: ~3 minutes on 2 cores
    python -m bench.loading --7b     # also Llama 2 7B's shape, bf16 in ~2 GB shards (13.5 GB written; run only
                                     # with 16 GB of memory available, checked first): ~10 minutes more

Each checkpoint gets random weights, written into a temporary folder that is deleted at the end: a Hugging
Face folder from transformers' ``LlamaConfig``, tensor by tensor and shard by shard (writing never holds more
than one shard) and, for the 1B shape, zoo's own checkpoint of the same weights (``zoo.save`` of
``zoo.from_hf``: zoo's ~2 GB shards, q/k/v and gate/up fused). Each measurement is a fresh process (``python
-m bench.loading child CONTENDER FOLDER``, glibc told to return freed memory as `bench.memory` does) that
imports its library, loads as a user would and runs one forward of 16 tokens under ``inference_mode``; its
peak resident set (VmHWM) counts everything: interpreter, libraries, weights (a memory-mapped file's pages
once read) and the forward.

    transformers   AutoModelForCausalLM.from_pretrained(hf, dtype=torch.bfloat16)
    zoo.from_hf    zoo.from_hf(hf)            the same files
    zoo.load       zoo.load(zoo)              zoo's checkpoint of the same weights (1B only)

Writes loading.json and loading.md (`bench.report`'s ``--out`` / ``--update``).
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

if __package__ in (None, ""):  # `python bench/loading.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import report
from bench.memory import _ENV, ROOT

GB = 10**9
# transformers' LlamaConfig arguments of each shape; max_position_embeddings kept to what the rows need
# (the rotary tables stay small; every weight is the real model's).
SHAPES: dict[str, dict[str, Any]] = {
    "llama-3.2-1b": {
        "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32,
        "num_key_value_heads": 8, "vocab_size": 128256, "tie_word_embeddings": True, "rope_theta": 500000.0,
        "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "bos_token_id": 128000, "eos_token_id": 128001,
    },
    "llama-2-7b": {
        "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32, "num_attention_heads": 32,
        "num_key_value_heads": 32, "vocab_size": 32000, "tie_word_embeddings": False, "rope_theta": 10000.0,
        "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "bos_token_id": 1, "eos_token_id": 2,
    },
}  # fmt: skip
SHARD_BYTES = {"llama-3.2-1b": None, "llama-2-7b": 2 * GB}  # None: one model.safetensors
# "<how> [float32]": loaded in the file's bf16, or cast to float32 on the way in (dtype=torch.float32).
CONTENDERS = {
    "llama-3.2-1b": (
        "transformers", "zoo.from_hf", "zoo.load", "transformers float32", "zoo.from_hf float32", "zoo.load float32"
    ),
    "llama-2-7b": ("transformers", "zoo.from_hf"),
}  # fmt: skip
NEEDS_FREE = {"llama-3.2-1b": 6 * GB, "llama-2-7b": 16 * GB}  # MemAvailable before a shape's rows run
PROMPT = 16


def run(shapes: list[str], folder: Path) -> dict[str, Any]:
    """Write each shape's checkpoint into ``folder``, measure every contender, delete the checkpoint."""
    record: dict[str, Any] = {"machine": report.machine("cpu"), "prompt_tokens": PROMPT, "rows": []}
    record["machine"]["memory_gib"] = _meminfo("MemTotal") / 2**30
    for shape in shapes:
        available = _meminfo("MemAvailable")
        if available < NEEDS_FREE[shape]:
            print(
                f"{shape}: skipped, {available / GB:.1f} GB available < {NEEDS_FREE[shape] / GB:.0f} GB needed"
            )
            record["rows"].append({"shape": shape, "skipped": f"{available / GB:.1f} GB available"})
            continue
        target = folder / shape
        try:
            _child("write", shape, target, timeout=3600)
            file_bytes = sum(f.stat().st_size for f in (target / "hf").glob("*.safetensors"))
            shards = len(list((target / "hf").glob("*.safetensors")))
            for contender in CONTENDERS[shape]:
                available = _meminfo("MemAvailable")  # others share the machine: checked before each child
                if available < NEEDS_FREE[shape]:
                    print(f"{shape} {contender}: skipped, {available / GB:.1f} GB available")
                    record["rows"].append({"shape": shape, "skipped": f"{available / GB:.1f} GB available"})
                    continue
                measured = _child("child", contender, target)
                row = {"shape": shape, "contender": contender, "file_gb": file_bytes / GB, "shards": shards}
                row |= measured
                record["rows"].append(row)
                print(_line(row), flush=True)
        finally:
            shutil.rmtree(target, ignore_errors=True)
    return record


def markdown(record: dict[str, Any]) -> str:
    machine = record["machine"]
    lines = [
        f"Measured on {machine['cpu']} ({machine['cores']} cores, {machine['memory_gib']:.0f} GiB of memory), "
        f"torch {machine['torch']}, transformers {machine.get('transformers', '?')}; one forward of "
        f"{record['prompt_tokens']} tokens.",
        "",
        "| shape, bf16 file | contender | file | weights | load | peak RSS, load + forward | vs transformers "
        "| peak − weights |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    reference = {  # transformers' row of the same shape and dtype
        (r["shape"], r["contender"].replace("transformers", "")): r["peak_gb"]
        for r in record["rows"]
        if r.get("contender", "").startswith("transformers")
    }
    for row in record["rows"]:
        if "skipped" in row:
            lines.append(f"| {row['shape']} | – | – | – | – | skipped ({row['skipped']}) | – | – |")
            continue
        file = f"{row['file_gb']:.2f} GB" + (f", {row['shards']} shards" if row["shards"] > 1 else "")
        key = (
            row["shape"],
            row["contender"].replace("zoo.from_hf", "").replace("zoo.load", "").replace("transformers", ""),
        )
        ratio = row["peak_gb"] / reference[key] if key in reference else None
        lines.append(
            f"| {row['shape']} | {row['contender']} | {file} | {row['weights_gb']:.2f} GB | {row['load_s']:.1f} s "
            f"| {row['peak_gb']:.2f} GB | {f'{ratio:.2f}x' if ratio else '–'} "
            f"| {row['peak_gb'] - row['weights_gb']:+.2f} GB |"
        )
    return "\n".join(lines) + "\n"


def _line(row: dict[str, Any]) -> str:
    return (
        f"{row['shape']:14s} {row['contender']:21s} load {row['load_s']:5.1f} s  peak {row['peak_gb']:.2f} GB"
        f"  (file {row['file_gb']:.2f} GB)"
    )


def _child(*args: object, timeout: int = 1800) -> dict[str, Any]:
    result = subprocess.run(
        [sys.executable, "-m", "bench.loading", *map(str, args)],
        capture_output=True, text=True, env={**os.environ, **_ENV}, cwd=ROOT, timeout=timeout,
    )  # fmt: skip
    if result.returncode != 0:
        raise RuntimeError(f"bench.loading {' '.join(map(str, args))} failed:\n{result.stderr[-3000:]}")
    lines = result.stdout.strip().splitlines()
    return json.loads(lines[-1]) if lines else {}


def _meminfo(key: str) -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    return 0


def _status(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    return 0


# -- in the child processes ---------------------------------------------------------------------------------


def _write(shape: str, folder: Path) -> None:
    """A Hugging Face folder ``folder/hf`` of ``shape`` with random bf16 weights, written shard by shard;
    for a shape zoo.load is measured on, zoo's checkpoint of the same weights in ``folder/zoo``."""
    import torch
    from safetensors.torch import save_file
    from transformers import LlamaConfig

    config = LlamaConfig(**SHAPES[shape])
    config.dtype = "bfloat16"
    hf = folder / "hf"
    hf.mkdir(parents=True)
    config.save_pretrained(hf)
    generator = torch.Generator().manual_seed(0)
    limit, shards, shard, size = SHARD_BYTES[shape], [], {}, 0

    def flush() -> None:
        nonlocal shard, size
        name = f"part-{len(shards)}.safetensors"
        save_file(shard, str(hf / name), metadata={"format": "pt"})
        shards.append((name, list(shard)))
        shard, size = {}, 0

    for name, shape_of in _tensors(config):
        tensor = torch.empty(shape_of, dtype=torch.bfloat16)
        if name.endswith("norm.weight"):
            tensor.fill_(1.0)
        else:
            tensor.normal_(0.0, 0.02, generator=generator)
        if limit is not None and shard and size + tensor.nbytes > limit:
            flush()
        shard[name], size = tensor, size + tensor.nbytes
    flush()
    if len(shards) == 1:
        (hf / shards[0][0]).rename(hf / "model.safetensors")
    else:
        weight_map = {}
        for i, (name, held) in enumerate(shards, 1):
            final = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
            (hf / name).rename(hf / final)
            weight_map |= dict.fromkeys(held, final)
        index = {"metadata": {"total_size": sum(f.stat().st_size for f in hf.glob("*.safetensors"))}}
        (hf / "model.safetensors.index.json").write_text(
            json.dumps(index | {"weight_map": weight_map}, indent=2)
        )
    if "zoo.load" in CONTENDERS[shape]:
        import zoo

        zoo.save(zoo.from_hf(hf), folder / "zoo")


def _tensors(config: Any) -> list[tuple[str, tuple[int, ...]]]:
    """Every weight of a LlamaForCausalLM of ``config``, with its shape, in the order transformers lists them."""
    C, F, V = config.hidden_size, config.intermediate_size, config.vocab_size
    D = C // config.num_attention_heads
    Q, K = config.num_attention_heads * D, config.num_key_value_heads * D
    names = [("model.embed_tokens.weight", (V, C))]
    for i in range(config.num_hidden_layers):
        layer = f"model.layers.{i}"
        names += [
            (f"{layer}.input_layernorm.weight", (C,)),
            (f"{layer}.self_attn.q_proj.weight", (Q, C)),
            (f"{layer}.self_attn.k_proj.weight", (K, C)),
            (f"{layer}.self_attn.v_proj.weight", (K, C)),
            (f"{layer}.self_attn.o_proj.weight", (C, Q)),
            (f"{layer}.post_attention_layernorm.weight", (C,)),
            (f"{layer}.mlp.gate_proj.weight", (F, C)),
            (f"{layer}.mlp.up_proj.weight", (F, C)),
            (f"{layer}.mlp.down_proj.weight", (C, F)),
        ]
    names.append(("model.norm.weight", (C,)))
    if not config.tie_word_embeddings:
        names.append(("lm_head.weight", (V, C)))
    return names


def _measure(contender: str, folder: Path) -> dict[str, float]:
    """Load ``folder``'s checkpoint as ``contender`` does and run one forward; the peak resident set."""
    import torch

    torch.set_num_threads(1)  # memory, not speed: one thread keeps the child quiet on a shared machine
    started = time.perf_counter()
    how, _, cast = contender.partition(" ")
    dtype = torch.float32 if cast == "float32" else None  # None: the file's bf16
    if how == "transformers":
        import transformers

        model = transformers.AutoModelForCausalLM.from_pretrained(
            folder / "hf", dtype=dtype or torch.bfloat16
        )
    else:
        import zoo

        load = zoo.from_hf if how == "zoo.from_hf" else zoo.load
        model = load(folder / ("hf" if how == "zoo.from_hf" else "zoo"), dtype=dtype)
    loaded, load_peak = time.perf_counter() - started, _status("VmHWM")
    ids = torch.arange(PROMPT)[None] + 100  # (1, T)
    with torch.inference_mode():
        model(ids)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    return {
        "load_s": loaded,
        "load_peak_gb": load_peak / GB,
        "peak_gb": _status("VmHWM") / GB,
        "weights_gb": weights / GB,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.loading", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--7b",
        dest="seven",
        action="store_true",
        help="also Llama 2 7B's shape, sharded (13.5 GB written; needs 16 GB of memory available)",
    )
    parser.add_argument("--only-7b", action="store_true", help="Llama 2 7B's shape alone")
    parser.add_argument(
        "--dir", type=Path, default=None, help="where to write the checkpoints (a temp folder)"
    )
    report.add_output_options(parser)
    args = parser.parse_args(argv)
    shapes = ["llama-2-7b"] if args.only_7b else ["llama-3.2-1b", *(["llama-2-7b"] if args.seven else [])]
    started = time.perf_counter()
    folder = Path(tempfile.mkdtemp(prefix="zoo-bench-loading-", dir=args.dir))
    try:
        record = run(shapes, folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    record["elapsed_s"] = time.perf_counter() - started
    out = report.output_dir(args)
    out.mkdir(parents=True, exist_ok=True)
    (out / "loading.json").write_text(json.dumps(record, indent=2) + "\n")
    (out / "loading.md").write_text(markdown(record))
    print(f"\n{markdown(record)}\nwrote {out}/loading.json and loading.md in {record['elapsed_s']:.0f} s")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "write":
        _write(sys.argv[2], Path(sys.argv[3]))
    elif len(sys.argv) > 1 and sys.argv[1] == "child":
        print(json.dumps(_measure(sys.argv[2], Path(sys.argv[3]))))
    else:
        sys.exit(main())
