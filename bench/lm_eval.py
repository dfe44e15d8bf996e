"""lm-evaluation-harness on one local task: zoo's adapter (`ZooLM`, model "zoo") against lm-eval's own ``hf``
model (HFLM) on the same weights, exported with `zoo.to_hf`, at the same batch size.

    python -m bench.lm_eval                         # multiple choice, 100 questions x 4 choices: ~2 minutes
    python -m bench.lm_eval --task ppl --docs 100   # rolling perplexity over 100 long texts
    python -m bench.lm_eval --device cuda --batch-size 32

The model is Llama-shaped (RoPE, RMSNorm, SwiGLU, GQA 8:4; 4 layers, width 256, FFN 768, vocab 8192, 512 positions),
random weights (the speed does not depend on them), float32; the tokenizer is trained here on seeded
sentences (`bench.embed.make_texts`) and frames each text with its bos, as Llama's does. The task is
written here as JSON lines and a task YAML (lm-eval's ``dataset_path: json``): no download. Both models
are built once; each run is one ``lm_eval.simple_evaluate`` call (requests built, scored, metrics
aggregated), the two alternating, after a warm-up run each on a few documents; the scores of the two are
compared. Wall time and the process's CPU time are both recorded: on a shared machine the CPU time is the
steadier measure (lm-eval's own work, the same for both, is in both). Writes lm_eval.json and lm_eval.md to bench/results/local/ (ignored by git), or --out DIR;
--update writes the tracked bench/results/.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # `python bench/lm_eval.py`: this folder would shadow the lm_eval package
    _here = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _here]
    sys.path.insert(0, str(_here.parent))

import torch

from bench import report
from bench.embed import WORDS, make_texts

SHAPE: dict[str, Any] = dict(
    d_model=256,
    num_layers=4,
    max_positions=512,
    vocab_size=8192,
    attention={"num_heads": 8, "num_kv_heads": 4},
    ffn={"d_ff": 768},
)


def write_task(folder: Path, kind: str, docs: int) -> str:
    """A local task of ``docs`` documents in ``folder``; returns its name."""
    rng = random.Random(0)
    data = folder / f"{kind}.jsonl"
    with data.open("w") as file:
        for i in range(docs):
            if kind == "mc":
                question = make_texts(1, seed=i)[0]
                choices = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 12))) for _ in range(4)]
                row: dict[str, Any] = {"question": question, "choices": choices, "answer": i % 4}
            else:
                row = {"text": " ".join(make_texts(rng.randint(5, 40), seed=i))}
            file.write(json.dumps(row) + "\n")
    head = (
        f"task: bench_{kind}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\n"
        f"  cache_dir: {folder / 'datasets'}\ntest_split: test\n"
    )
    if kind == "mc":
        body = (
            'output_type: multiple_choice\ndoc_to_text: "{{question}}"\ndoc_to_target: "{{answer}}"\n'
            'doc_to_choice: "{{choices}}"\nmetric_list:\n  - metric: acc\n  - metric: acc_norm\n'
        )
    else:
        body = (
            'output_type: loglikelihood_rolling\ndoc_to_text: ""\ndoc_to_target: "{{text}}"\n'
            "metric_list:\n  - metric: word_perplexity\n"
        )
    (folder / f"{kind}.yaml").write_text(head + body)
    return f"bench_{kind}"


def build(folder: Path) -> tuple[Any, Any]:
    """The model and tokenizer, saved as a Hugging Face folder; returns (model, tokenizer)."""
    from tokenizers import processors

    import zoo
    from zoo.io.tokenizer import train_tokenizer

    tok = train_tokenizer(iter(make_texts(5000, seed=7)), kind="bpe", vocab_size=2000)
    tok.hf.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", tok.bos_id)]
    )
    ids = {f"{name}_token_id": tok.special_ids()[name] for name in ("pad", "bos", "eos")}
    spec = zoo.preset("llama-tiny", **SHAPE, **ids)
    torch.manual_seed(0)
    model = zoo.build(spec).eval()
    zoo.to_hf(model, folder / "hf")
    tok.save_pretrained(folder / "hf")
    return model, tok


def markdown(record: dict[str, Any]) -> str:
    m = record["machine"]
    lines = [
        f"Measured on {m['cpu']} ({m['cores']} cores, {m['torch_threads']} torch threads), {record['device']}, "
        f"torch {m['torch']}, transformers {m.get('transformers', '?')}, lm-eval {record['lm_eval']}; "
        f"{record['task']} ({record['requests']} requests), batch {record['batch_size']}, float32; "
        f"median of {record['repeats']} alternating runs, (slowest–fastest) in brackets.",
        "",
        "| contender | seconds per run (wall) | speed vs hf | CPU seconds per run | vs hf |",
        "|---|---:|---:|---:|---:|",
    ]
    base, base_cpu = record["results"]["hf"]["median_s"], record["results"]["hf"]["median_cpu_s"]
    for name, row in record["results"].items():
        lines.append(
            f"| {name} | {row['median_s']:.2f} ({row['slowest_s']:.2f}–{row['fastest_s']:.2f}) | "
            f"{base / row['median_s']:.2f}x | {row['median_cpu_s']:.2f} | {base_cpu / row['median_cpu_s']:.2f}x |"
        )
    lines += ["", f"Scores: zoo {record['scores']['zoo']}, hf {record['scores']['hf']}."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.lm_eval", description=__doc__.splitlines()[0])
    parser.add_argument("--task", choices=("mc", "ppl"), default="mc", help="multiple choice or perplexity")
    parser.add_argument("--docs", type=int, default=100, help="documents in the task (default 100)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    report.add_output_options(parser)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    if args.threads:
        torch.set_num_threads(args.threads)

    import lm_eval
    import transformers
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    from zoo.evaluation import ZooLM

    transformers.utils.logging.disable_progress_bar()
    with tempfile.TemporaryDirectory() as temp:
        folder = Path(temp)
        model, tok = build(folder)
        name = write_task(folder, args.task, args.docs)
        manager = TaskManager(include_path=str(folder), include_defaults=False)
        contenders = {
            "zoo": ZooLM(model, tokenizer=tok, batch_size=args.batch_size, device=args.device),
            "hf": HFLM(
                pretrained=str(folder / "hf"), batch_size=args.batch_size, device=args.device, dtype="float32"
            ),
        }

        def run(lm: Any, limit: int | None = None) -> Any:
            return lm_eval.simple_evaluate(
                model=lm,
                tasks=[name],
                task_manager=manager,
                limit=limit,
                bootstrap_iters=0,
                log_samples=False,
            )

        for lm in contenders.values():
            run(lm, limit=8)  # warm-up: one-off costs (kernels, the data set's arrow cache)
        wall: dict[str, list[float]] = {key: [] for key in contenders}
        cpu: dict[str, list[float]] = {key: [] for key in contenders}
        scores: dict[str, dict[str, float]] = {}
        for _ in range(args.repeats):
            for key, lm in contenders.items():
                start, start_cpu = time.perf_counter(), time.process_time()
                out = run(lm)
                wall[key].append(time.perf_counter() - start)
                cpu[key].append(time.process_time() - start_cpu)
                scores[key] = {
                    k: round(float(v), 6)
                    for k, v in out["results"][name].items()
                    if "," in k and "stderr" not in k
                }
        requests = args.docs * 4 if args.task == "mc" else args.docs
    record: dict[str, Any] = {
        "machine": report.machine(args.device),
        "device": args.device,
        "lm_eval": lm_eval.__version__ if hasattr(lm_eval, "__version__") else "?",
        "task": name,
        "requests": requests,
        "batch_size": args.batch_size,
        "repeats": args.repeats,
        "shape": SHAPE,
        "scores": scores,
        "results": {
            key: {
                "median_s": statistics.median(times),
                "slowest_s": max(times),
                "fastest_s": min(times),
                "median_cpu_s": statistics.median(cpu[key]),
            }
            for key, times in wall.items()
        },
    }
    for key, row in record["results"].items():
        print(f"{key:4s} {row['median_s']:7.2f} s per run", flush=True)
    record["elapsed_s"] = time.perf_counter() - started
    out_dir = report.output_dir(args)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "lm_eval.json").write_text(json.dumps(record, indent=2) + "\n")
    (out_dir / "lm_eval.md").write_text(markdown(record))
    print(f"\n{markdown(record)}\nwrote {out_dir}/lm_eval.json and lm_eval.md in {record['elapsed_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
