"""Scale runs of ``zoo serve``: the same workload at 1x, 10x and 100x, the server's peak RSS and wall time.

    python -m bench.scale beams --sizes 8 80 800                 # the T5-shaped translator, beam requests
    python -m bench.scale beams --decoder --sizes 8 80 800       # the llama-shaped model, beam requests
    python -m bench.scale lookup --sizes 20 200 2000             # greedy, --prompt-lookup 4
    python -m bench.scale draft --sizes 20 200 2000              # greedy, --draft (a smaller model)
    python -m bench.scale plain --sizes 20 200 2000              # greedy, no speculation (the baseline)

Each size runs on a fresh server (``python -m zoo serve``, ``--max-batch 32``, under ``/usr/bin/time -v``,
so its peak RSS is that size's alone); the requests go from a pool of ``--in-flight`` threads (the `openai`
client, not streamed). Every response is checked: ``n`` choices (``n`` 2 for a beam request), each run to
``max_tokens`` (the models have no end token). Then a sample (``--sample``, spread over the run) is sent
again one at a time (beams: to the same server; speculative: to a plain server started for it) and must
give the same texts. Models: bench.serve's (random weights; ``--layers`` / ``--width``; the draft is 1 layer,
d_model 128, over the same tokenizer). Prints one line per size and a Markdown table at the end; --json
FILE writes the rows.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # `python bench/scale.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.serve import WORDS, launch, make_model, make_translator, seq2seq_sources


def start_timed(folder: Path, log: Path, *extra: str) -> tuple[subprocess.Popen[str], str]:
    """``zoo serve FOLDER --max-batch 32`` under ``/usr/bin/time -v -o LOG``; (process, its /v1 url)."""
    command = ["/usr/bin/time", "-v", "-o", str(log), sys.executable, "-m", "zoo", "serve", str(folder)]
    command += ["--port", "0", "--max-batch", "32", "--max-queue", "4096", "--model-name", "bench", *extra]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    return launch(command, env)


def stop_timed(process: subprocess.Popen[str], log: Path) -> dict[str, float]:
    """Stop the server (SIGTERM to ``zoo serve``, not to ``time``) -> its peak RSS (MB), wall and CPU
    seconds (user + system, start-up included)."""
    children = Path(f"/proc/{process.pid}/task/{process.pid}/children").read_text().split()
    for child in children:
        os.kill(int(child), signal.SIGTERM)
    process.wait(timeout=120)
    text = log.read_text()
    rss = float(_field(text, r"Maximum resident set size \(kbytes\): (\d+)"))
    clock = _field(text, r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): ([\d:.]+)")
    seconds = sum(float(part) * 60**i for i, part in enumerate(reversed(clock.split(":"))))
    cpu = sum(float(_field(text, rf"{kind} time \(seconds\): ([\d.]+)")) for kind in ("User", "System"))
    return {"peak_rss_mb": rss / 1024, "server_wall_s": seconds, "server_cpu_s": cpu}


def _field(text: str, pattern: str) -> str:
    """The first group of ``pattern`` in ``/usr/bin/time -v``'s report."""
    found = re.search(pattern, text)
    if found is None:
        raise RuntimeError(f"/usr/bin/time -v wrote no {pattern!r}: {text[-300:]!r}")
    return found.group(1)


def prompts(kind: str, count: int) -> list[str]:
    """``count`` different prompts (random words, seeded): sources of 4-60 words (beams) or prompts of 16-63
    words (greedy). All differ, so the prefix cache (a decoder's) keeps every one: its worst case."""
    if kind == "beams":
        return seq2seq_sources(count, seed=2)
    pick = random.Random(3)
    return [" ".join(pick.choice(WORDS) for _ in range(pick.randint(16, 63))) for _ in range(count)]


def send(url: str, texts: list[str], body: dict[str, Any], in_flight: int) -> tuple[float, list[Any]]:
    """(wall seconds, responses) of one completion per text, ``in_flight`` at a time."""
    import openai

    client = openai.OpenAI(base_url=url, api_key="-", max_retries=0, timeout=1200)

    def one(text: str) -> Any:
        return client.completions.create(model="bench", prompt=text, **body)

    start = time.perf_counter()
    with ThreadPoolExecutor(in_flight) as pool:
        out = list(pool.map(one, texts))
    return time.perf_counter() - start, out


def check(responses: list[Any], body: dict[str, Any]) -> int:
    """How many responses are well-formed: ``n`` choices (indices 0..n-1), each run to ``max_tokens`` (the
    models have no end token: finish reason "length", ``n * max_tokens`` completion tokens in all). A text
    may be empty: a random model's hypothesis can be special tokens, which are not detokenised."""
    n, good = body.get("n", 1), 0
    for response in responses:
        indices = sorted(choice.index for choice in response.choices)
        ok = indices == list(range(n)) and all(c.finish_reason == "length" for c in response.choices)
        good += ok and response.usage.completion_tokens == body["max_tokens"] * n
    return good


def prefix_cache_mb(url: str) -> float:
    """What the server's prefix cache holds now (MB; ``zoo_prefix_cache_bytes``), 0 when it has none."""
    import urllib.request

    with urllib.request.urlopen(url.removesuffix("/v1") + "/metrics", timeout=30) as answer:
        text = answer.read().decode()
    found = re.search(r"^zoo_prefix_cache_bytes (\S+)$", text, re.MULTILINE)
    return float(found.group(1)) / 2**20 if found else 0.0


def texts_of(response: Any) -> list[str]:
    return [choice.text for choice in sorted(response.choices, key=lambda c: c.index)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("kind", choices=["beams", "lookup", "draft", "plain"])
    parser.add_argument("--sizes", type=int, nargs="+", default=[8, 80, 800])
    parser.add_argument("--decoder", action="store_true", help="beams: the llama-shaped model")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--in-flight", type=int, default=32)
    parser.add_argument("--sample", type=int, default=6, help="requests sent again alone and compared")
    parser.add_argument(
        "--server-args", default="", help='more zoo serve options, e.g. "--prefix-cache-bytes 0"'
    )
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    greedy = {"max_tokens": args.new_tokens, "temperature": 0}
    if args.kind == "beams":
        body = {**greedy, "n": 2, "extra_body": {"use_beam_search": True, "best_of": 4}}
        extra: list[str] = []
    else:
        body = greedy
        extra = {"lookup": ["--prompt-lookup", "4"], "plain": []}.get(args.kind, [])
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "model"
        if args.kind == "beams" and not args.decoder:
            make_translator(folder, layers=args.layers, width=args.width)
        else:
            make_model(folder, layers=args.layers, width=args.width)
        if args.kind == "draft":
            make_model(Path(tmp) / "draft", layers=1, width=128)
            extra = ["--draft", str(Path(tmp) / "draft")]
        for size in args.sizes:
            texts = prompts(args.kind, size)
            log = Path(tmp) / f"time-{size}.txt"
            loaded = time.perf_counter()
            server, url = start_timed(folder, log, *extra, *args.server_args.split())
            startup = time.perf_counter() - loaded
            try:
                wall, responses = send(url, texts, body, args.in_flight)
                cached = prefix_cache_mb(url)
                picks = sorted({round(i * (size - 1) / max(1, args.sample - 1)) for i in range(args.sample)})
                alone_url, alone_server = url, None
                if args.kind in ("lookup", "draft"):
                    alone_server, alone_url = start_timed(
                        folder, Path(tmp) / "plain.txt", *args.server_args.split()
                    )
                try:
                    alone = [send(alone_url, [texts[i]], body, 1)[1][0] for i in picks]
                finally:
                    if alone_server is not None:
                        stop_timed(alone_server, Path(tmp) / "plain.txt")
            finally:
                timed = stop_timed(server, log)
            tokens = sum(r.usage.completion_tokens for r in responses)
            row = {
                "kind": args.kind + (" decoder" if args.decoder else ""),
                "requests": size,
                "wall_s": wall,
                "startup_s": startup,
                "requests_per_s": size / wall,
                "tokens_per_s": tokens / wall,
                "well_formed": check(responses, body),
                "sample_equal": sum(texts_of(a) == texts_of(responses[i]) for a, i in zip(alone, picks)),
                "sample": len(picks),
                "prefix_cache_mb": cached,
                **timed,
            }
            rows.append(row)
            print(
                f"{row['kind']} {size:5d} requests: {wall:7.1f} s, {row['requests_per_s']:6.2f} req/s, "
                f"{row['tokens_per_s']:7.1f} tokens/s, peak RSS {row['peak_rss_mb']:,.0f} MB (prefix cache "
                f"{cached:,.0f} MB; server CPU {timed['server_cpu_s']:.1f} s; start-up "
                f"{startup:.1f} s), well-formed {row['well_formed']}/{size}, alone = batched "
                f"{row['sample_equal']}/{row['sample']}",
                flush=True,
            )
    print("\n| requests | wall | req/s | tokens/s | peak RSS | prefix cache | well-formed | sample equal |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['requests']} | {r['wall_s']:.1f} s | {r['requests_per_s']:.2f} | {r['tokens_per_s']:.0f} | "
            f"{r['peak_rss_mb']:,.0f} MB | {r['prefix_cache_mb']:,.0f} MB | {r['well_formed']}/{r['requests']} | {r['sample_equal']}/{r['sample']} |"
        )
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
