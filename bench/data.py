"""Data at scale: `prepare` against the tokenizers library's own batch encoding, and peak memory per size.

    python -m bench.data                                 # 100k, 1M and 5M pairs (5M: ~1.6 GB of TSV)
    python -m bench.data --sizes 100000 1000000          # what fits in a few minutes on 2 cores

Corpora are generated here, nothing is downloaded: a TSV of ``source<TAB>target`` pairs, 5-45 random words
a side (two made-up vocabularies of 20,000 words each, Zipf-distributed, seed 0), written once per size into
the work folder and reused. One 8,000-token BPE tokenizer (zoo's ``train_tokenizer``) is trained on the first
50,000 pairs of the smallest corpus.

For each size, each in a fresh process so that peak memory is its own (the child's VmHWM: a child's
``ru_maxrss`` starts from the parent's resident set at the fork, so it would report the parent's when that
is larger), one after the other:

    encode_batch   the baseline: lines read chunk by chunk (untimed), ``tokenizers.Tokenizer.encode_batch``
                   on each side of each chunk (timed): the library's own batch encoding, nothing written
    prepare        `zoo.training.data.prepare.prepare` of the TSV, end to end: reading, encoding, writing
                   the shards, hashing the source; timed whole, from a fresh output folder

Throughput is pairs/s and MB/s of TSV; ``vs encode_batch`` is prepare's pairs/s over the baseline's
(goal >= 0.8x), by wall-clock time and by CPU time (``time.process_time``, every thread of the child): on a
machine shared with other work the CPU ratio is the steadier one. Peak RSS includes the interpreter, numpy and the imports (torch among them, through the
package); the goal is that it stays flat as the corpus grows.

Training measures (the tasks helper's part, see ``TRAINING``): peak RSS of a training run at each size,
time from ``zoo train`` to the first step, tokens/s from shards against the in-memory path.

Writes ``runs/bench-data/data.json`` and ``data.md`` (``--out``); corpora, tokenizer and prepared folders
live under ``runs/bench-data/work`` (``--work``), kept between runs; ``runs/`` is not tracked.
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

if __package__ in (None, ""):  # `python bench/data.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

ROOT = Path(__file__).resolve().parent.parent
SIZES = (100_000, 1_000_000, 5_000_000)
WORDS_PER_SIDE = (5, 45)
VOCAB_WORDS = 20_000
TOKENIZER_VOCAB = 8_000
TOKENIZER_SAMPLE = 50_000
CHUNK = 10_000


# --- corpora -----------------------------------------------------------------------------------------------


def _words(rng: np.random.Generator, count: int) -> tuple[np.ndarray, np.ndarray]:
    """(count, 12) uint8 table of made-up words, each followed by a space, and their byte lengths."""
    letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz", dtype=np.uint8)
    lengths = np.clip(rng.geometric(0.22, size=count) + 1, 2, 11)
    table = letters[rng.integers(0, 26, size=(count, 12))]
    table[np.arange(count), lengths] = ord(" ")
    return table, lengths + 1


def write_corpus(path: Path, pairs: int, *, seed: int = 0) -> None:
    """Write ``pairs`` lines of ``source<TAB>target`` random words, vectorised chunk by chunk."""
    rng = np.random.default_rng(seed)
    source_table, source_lengths = _words(rng, VOCAB_WORDS)
    target_table, target_lengths = _words(rng, VOCAB_WORDS)
    table = np.concatenate([source_table, target_table])  # (2W, 12); target ids are offset by W
    word_bytes = np.concatenate([source_lengths, target_lengths])
    zipf = 1.0 / np.arange(1, VOCAB_WORDS + 1)
    cdf = np.cumsum(zipf / zipf.sum())
    low, high = WORDS_PER_SIDE
    temp = path.with_name(path.name + ".partial")
    with temp.open("wb") as f:
        for start in range(0, pairs, 100_000):
            n = min(100_000, pairs - start)
            counts = rng.integers(low, high + 1, size=(n, 2)).ravel()  # per pair: source words, target words
            side = np.tile([0, 1], n)
            words_side = np.repeat(side, counts)
            draws = np.minimum(np.searchsorted(cdf, rng.random(len(words_side))), VOCAB_WORDS - 1)
            ids = draws + VOCAB_WORDS * words_side
            lengths = word_bytes[ids]
            keep = np.arange(12) < lengths[:, None]
            flat = table[ids][keep]  # the words end to end, each with its trailing space
            last_word = np.cumsum(counts) - 1
            ends = np.cumsum(lengths)[last_word] - 1
            flat[ends] = np.where(side == 0, ord("\t"), ord("\n")).astype(np.uint8)
            f.write(flat.tobytes())
    temp.replace(path)


def corpus(work: Path, pairs: int) -> Path:
    path = work / f"pairs-{pairs}.tsv"
    if not path.is_file():
        write_corpus(path, pairs)
    return path


def tokenizer(work: Path, sample_from: Path) -> Path:
    """An 8,000-token BPE tokenizer trained on the first pairs of ``sample_from`` (once; kept)."""
    path = work / f"bpe-{TOKENIZER_VOCAB}.json"
    if not path.is_file():
        from zoo.io.tokenizer import train_tokenizer

        with sample_from.open(encoding="utf-8") as f:
            lines = [line.rstrip("\n") for _, line in zip(range(TOKENIZER_SAMPLE), f)]
        train_tokenizer(iter(lines), kind="bpe", vocab_size=TOKENIZER_VOCAB).save(path)
    return path


# --- children: one measure each, in a fresh process --------------------------------------------------------


def child_encode_batch(tsv: Path, tokenizer_path: Path) -> dict[str, Any]:
    """The baseline: the library's own encode_batch over both sides, chunk by chunk; only encoding timed."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_path))
    pairs = tokens = 0
    seconds = cpu = 0.0
    with tsv.open(encoding="utf-8") as f:
        while True:
            lines = [line for _, line in zip(range(CHUNK), f)]
            if not lines:
                break
            sources, targets = zip(*(line.rstrip("\n").split("\t") for line in lines))
            start, start_cpu = time.perf_counter(), time.process_time()
            encoded = [tok.encode_batch(list(side), add_special_tokens=False) for side in (sources, targets)]
            seconds += time.perf_counter() - start
            cpu += time.process_time() - start_cpu
            pairs += len(lines)
            tokens += sum(len(e.ids) for side in encoded for e in side)
    return {"pairs": pairs, "tokens": tokens, "seconds": seconds, "cpu_seconds": cpu}


def child_prepare(tsv: Path, tokenizer_path: Path, out: Path) -> dict[str, Any]:
    """zoo's prepare of the TSV into ``out``, end to end."""
    from tokenizers import Tokenizer

    from zoo.training.data.prepare import encode_text_sides, prepare, tokenizer_fingerprint
    from zoo.training.data.shards import SideInfo
    from zoo.training.data.sources import Source

    tok = Tokenizer.from_file(str(tokenizer_path))
    side = SideInfo(vocab_size=tok.get_vocab_size(), tokenizer=tokenizer_fingerprint(tok))
    shutil.rmtree(out, ignore_errors=True)
    start, start_cpu = time.perf_counter(), time.process_time()
    manifest = prepare(
        Source("tsv", tsv, ("source", "target")),
        encode_text_sides(tok, ("source", "target")),
        out,
        sides={"source": side, "target": side},
        manifest_info={"task": "seq2seq"},
    )
    seconds, cpu = time.perf_counter() - start, time.process_time() - start_cpu
    start = time.perf_counter()
    again = prepare(
        Source("tsv", tsv, ("source", "target")),
        encode_text_sides(tok, ("source", "target")),
        out,
        sides={"source": side, "target": side},
        manifest_info={"task": "seq2seq"},
    )
    noop = time.perf_counter() - start
    assert again.created == manifest.created, "the second prepare was not a no-op"
    tokens = manifest.counts["source_tokens"] + manifest.counts["target_tokens"]
    shard_bytes = sum(p.stat().st_size for p in out.iterdir())
    return {
        "pairs": manifest.num_examples,
        "tokens": tokens,
        "seconds": seconds,
        "cpu_seconds": cpu,
        "noop_seconds": noop,
        "shard_mb": shard_bytes / 1e6,
    }


def child_open(out: Path) -> dict[str, Any]:
    """Open the prepared folder and plan one epoch of batches from its lengths."""
    from zoo.training.data.planning import plan_batches
    from zoo.training.data.shards import open_prepared

    start = time.perf_counter()
    data = open_prepared(out)
    opened = time.perf_counter() - start
    start = time.perf_counter()
    lengths = np.stack([data.lengths("source"), data.lengths("target")], axis=1)
    batches = plan_batches(lengths, max_tokens=4096, seed=0, epoch=0)
    planned = time.perf_counter() - start
    return {"open_seconds": opened, "plan_seconds": planned, "batches": len(batches)}


CHILDREN: dict[str, Callable[..., dict[str, Any]]] = {
    "encode_batch": child_encode_batch,
    "prepare": child_prepare,
    "open": child_open,
}


def peak_rss_mb() -> float | None:
    """This process's peak resident set (VmHWM), from its own start: after exec, not the parent's."""
    try:
        status = Path("/proc/self/status").read_text(encoding="utf-8")
    except OSError:
        return None
    line = next((line for line in status.splitlines() if line.startswith("VmHWM:")), None)
    return int(line.split()[1]) / 1024 if line else None


def run_child(name: str, *args: Path) -> dict[str, Any]:
    """Run one child measure in a fresh process; its JSON result, with ``peak_rss_mb`` its peak resident
    set (VmHWM: ``ru_maxrss`` would carry the parent's resident set from the fork)."""
    command = [sys.executable, "-m", "bench.data", "--child", name, *map(str, args)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(command, stdout=out, stderr=err, env=env, cwd=ROOT)
        _, status, usage = os.wait4(proc.pid, 0)  # reaped here, so its rusage is this child's alone
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(), err.read().decode(errors="replace")
    if proc.returncode:
        raise RuntimeError(f"bench.data child {name} failed:\n{stderr[-2000:]}")
    result: dict[str, Any] = json.loads(stdout.strip().splitlines()[-1])
    if result.get("peak_rss_mb") is None:  # no /proc: the child's ru_maxrss (KiB on Linux)
        # An upper bound only: a child's ru_maxrss starts from its parent's resident set at the fork.
        result["peak_rss_mb"] = usage.ru_maxrss / 1024
    return result


# --- training measures: the tasks helper's part ------------------------------------------------------------


def training_measures(
    pairs: int, tsv: Path, prepared: Path, tokenizer_path: Path, work: Path
) -> dict[str, Any]:
    """Training figures at one size; each a fresh process, as above. To be filled in with:

    ``train_peak_rss_mb``  peak RSS of ``zoo train`` from the prepared folder (a few steps)
    ``first_step_s``       time from ``zoo train`` start to the first optimizer step
    ``shards_tokens_s`` / ``memory_tokens_s``   training tokens/s from shards vs the in-memory path

    (`bench.data_training`.)
    """
    from bench.data_training import training_measures as measure

    return measure(pairs, tsv, prepared, tokenizer_path, work)


TRAINING: Callable[[int, Path, Path, Path, Path], dict[str, Any]] = training_measures


# --- the run -----------------------------------------------------------------------------------------------


def _best(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The fastest of repeated runs, with the highest peak memory of them all."""
    best = dict(min(runs, key=lambda run: run["seconds"]))
    best["peak_rss_mb"] = max(run["peak_rss_mb"] for run in runs)
    return best


def measure(sizes: list[int], work: Path, *, repeats: int = 1) -> list[dict[str, Any]]:
    work.mkdir(parents=True, exist_ok=True)
    tsvs = {pairs: corpus(work, pairs) for pairs in sizes}
    tok = tokenizer(work, tsvs[min(sizes)])
    rows = []
    for pairs in sizes:
        tsv, out = tsvs[pairs], work / f"prepared-{pairs}"
        runs: dict[str, list[dict[str, Any]]] = {"encode_batch": [], "prepare": []}
        for _ in range(repeats):  # alternating, so that a burst of other work hits both alike
            runs["encode_batch"].append(run_child("encode_batch", tsv, tok))
            runs["prepare"].append(run_child("prepare", tsv, tok, out))
        baseline, prepared = _best(runs["encode_batch"]), _best(runs["prepare"])
        opened = run_child("open", out)
        mb = tsv.stat().st_size / 1e6
        row = {
            "pairs": pairs,
            "tsv_mb": mb,
            "tokens": prepared["tokens"],
            "encode_batch_pairs_s": pairs / baseline["seconds"],
            "encode_batch_mb_s": mb / baseline["seconds"],
            "encode_batch_peak_rss_mb": baseline["peak_rss_mb"],
            "prepare_pairs_s": pairs / prepared["seconds"],
            "prepare_mb_s": mb / prepared["seconds"],
            "prepare_seconds": prepared["seconds"],
            "prepare_noop_seconds": prepared["noop_seconds"],
            "prepare_peak_rss_mb": prepared["peak_rss_mb"],
            "shard_mb": prepared["shard_mb"],
            "vs_encode_batch": baseline["seconds"] / prepared["seconds"],
            "encode_batch_cpu_s": baseline["cpu_seconds"],
            "prepare_cpu_s": prepared["cpu_seconds"],
            "vs_encode_batch_cpu": baseline["cpu_seconds"] / prepared["cpu_seconds"],
            "open_seconds": opened["open_seconds"],
            "plan_seconds": opened["plan_seconds"],
            "batches": opened["batches"],
        }
        row.update(TRAINING(pairs, tsv, out, tok, work))
        rows.append(row)
    return rows


def _machine() -> dict[str, Any]:
    import tokenizers

    from bench import report

    return {**report.machine("cpu"), "tokenizers": tokenizers.__version__}


def markdown(record: dict[str, Any]) -> str:
    m = record["machine"]
    lines = [
        f"Measured on {m['cpu']} ({m['cores']} cores), Python {m['python']}, tokenizers {m['tokenizers']}; "
        "random-word TSV pairs, 5-45 words a side, an 8,000-token BPE tokenizer; the fastest of "
        f"{record['repeats']} alternating run(s) of each, each in its own process.",
        "",
        "| pairs | TSV | encode_batch | prepare | vs encode_batch (wall, CPU) | prepare peak RSS "
        "| encode_batch peak RSS | shards | no-op | open + plan |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in record["results"]:
        lines.append(
            f"| {r['pairs']:,} | {r['tsv_mb']:,.0f} MB | {r['encode_batch_pairs_s']:,.0f} pairs/s "
            f"({r['encode_batch_mb_s']:.1f} MB/s) | {r['prepare_pairs_s']:,.0f} pairs/s ({r['prepare_mb_s']:.1f} MB/s) "
            f"| {r['vs_encode_batch']:.2f}x, {r['vs_encode_batch_cpu']:.2f}x | {r['prepare_peak_rss_mb']:,.0f} MB | "
            f"{r['encode_batch_peak_rss_mb']:,.0f} MB | {r['shard_mb']:,.0f} MB | {r['prepare_noop_seconds']:.2f} s | "
            f"{r['open_seconds'] * 1000:.0f} ms + {r['plan_seconds']:.2f} s |"
        )
    training = [r for r in record["results"] if "train_peak_rss_mb" in r]
    if training:
        lines += [
            "",
            "Training from the prepared folder (`zoo train`, transformer-tiny, `batch.max_tokens` 4096; "
            "`bench.data_training`):",
            "",
            "| pairs | peak RSS | vs the smallest | start to first step | tokens/s shards / in memory |",
            "|---:|---:|---:|---:|---:|",
        ]
        base = training[0]["train_peak_rss_mb"]
        for r in training:
            speed = f"{r['shards_vs_memory']:.3f}x" if "shards_vs_memory" in r else "–"
            lines.append(
                f"| {r['pairs']:,} | {r['train_peak_rss_mb']:,.0f} MB | {r['train_peak_rss_mb'] / base:.2f}x "
                f"| {r['first_step_s']:.1f} s | {speed} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.data", description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES), help="corpus sizes in pairs")
    parser.add_argument("--work", type=Path, default=ROOT / "runs" / "bench-data" / "work")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "bench-data")
    parser.add_argument("--repeats", type=int, default=1, help="alternating runs of each; the fastest counts")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        name, *paths = args.child
        result = CHILDREN[name](*map(Path, paths))
        print(json.dumps({**result, "peak_rss_mb": peak_rss_mb()}))
        return 0
    rows = measure(sorted(args.sizes), args.work, repeats=args.repeats)
    record = {"machine": _machine(), "repeats": args.repeats, "results": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "data.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    text = markdown(record)
    (args.out / "data.md").write_text(text, encoding="utf-8")
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
