"""``zoo serve`` under load: generated tokens/s and time to first token at 1, 8 and 32 concurrent clients,
continuous batching (``--max-batch 32``) against the same model served one request at a time
(``--max-batch 1``), and against ``transformers serve --continuous-batching`` on the same weights (exported
with ``zoo.to_hf``) where transformers has it (``--no-transformers`` leaves it out).

    python -m bench.serve                          # 4 layers, d_model 256, 32 new tokens: about a minute
    python -m bench.serve --new-tokens 64 --clients 1 8 32 --requests 2
    python -m bench.serve --device cuda --dtype bfloat16   # on a GPU (`make gpu-check` runs this)

Localhost only and bounded: a model (llama-shaped, random weights, float32) and a BPE tokenizer are saved to a
temporary folder, each server is a ``python -m zoo serve`` subprocess on a free port, and each level runs
``--requests`` streamed completions per client (the `openai` client, one thread per client; greedy, every
prompt a different length, 16-64 tokens, ``max_tokens`` = ``--new-tokens``). Throughput counts the
completion tokens of every request (``usage``) over the level's wall time; time to first token is from
sending a request to its first chunk of text. Every server runs on ``--device`` in ``--dtype``. Writes
serve.json and serve.md to bench/results/local/, or --out DIR, after every level (a run stopped by a time
limit keeps the levels it finished); --update writes the tracked bench/results/.

The prefix-cache row (``--prefix-rounds``, ``--prefix-only`` for it alone): a chat whose system prompt is
~900 tokens (``--prefix-words``), asked one question (cold: nothing of it cached) then another (warm: the
system prompt's blocks cached), ``--prefix-rounds`` times with a new system prompt each round, cold and warm
interleaved; the time to first token of each (streamed, one client, nothing else running), medians and their
ratio, on a server with the prefix cache (the default 1G) and one with ``--prefix-cache-bytes 0``. The
model is the one above with 2048 positions. Written to serve-prefix.json and serve-prefix.md.

The encoder-decoder row (``--seq2seq-rounds``, ``--seq2seq-only`` for it alone): a T5-shaped translator
(relative bias; ``--layers`` / ``--width``, random weights, no end token so every request runs to its
``max_tokens``) served with ``--max-batch 32`` and with ``--max-batch 1``; 32 concurrent completions
(sources of 4-60 words; ``max_tokens`` spread over 1/4 to 7/4 of ``--new-tokens``, as translations end at
different lengths) to each, and the same 32 requests through transformers' ``generate`` on the same weights
(exported with ``zoo.to_hf``), batched by hand: one right-padded batch run to the longest ``max_tokens``, in
this process, each request counted for its own tokens. Then the acceptance figure: 12 completions of
``--new-tokens`` sent one after another, then the same 12 at once, to the batching server: the wall-time
ratio, and whether the texts are equal. Rounds are interleaved; medians.
With ``--seq2seq-compile`` two compiled contenders join each round: the same server with ``--compile`` (every
slot in one static shape, the decode step through torch.compile), its texts checked equal to the eager
server's, and transformers' ``generate`` with ``cache_implementation="static"``, which compiles the model's
forward (transformers does so only on accelerators unless ``compile_config`` allows every device); each
one's compile time is the first run of the 32 requests, reported apart and left out of tokens/s.
Written to serve-seq2seq.json and serve-seq2seq.md.

The beam row (``--beam-rounds``, ``--beams-only`` for it alone): the same translator served with
``--max-batch 32``; 8 beam requests (``use_beam_search``, ``best_of`` 4, sources of 4-60 words,
``max_tokens`` = ``--new-tokens``) sent one after another, then the same 8 at once (32 slots: every group
runs in one batch): the wall-time ratio, and whether the texts are equal; and transformers' ``generate``
with ``num_beams`` 4 on the same weights, the 8 batched by hand (as the encoder-decoder row). Rounds are
interleaved; medians.
Written to serve-beams.json and serve-beams.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # `python bench/serve.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import report

ROOT = Path(__file__).resolve().parent.parent
ONE_AT_A_TIME = "zoo max-batch 1"
WORDS = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "a",
    "is",
    "that",
    "for",
    "it",
    "as",
    "was",
    "with",
    "be",
    "by",
    "on",
    "not",
    "he",
    "this",
    "are",
    "or",
    "his",
    "from",
    "at",
    "which",
]


def make_model(folder: Path, *, layers: int, width: int, positions: int = 512) -> None:
    import torch

    import zoo
    from zoo.io.tokenizer import train_tokenizer

    lines = [" ".join(WORDS[(i * 7 + j * 3) % len(WORDS)] for j in range(12)) + f" {i}" for i in range(2000)]
    tok = train_tokenizer(iter(lines), kind="bpe", vocab_size=1000)
    ids = tok.special_ids()
    spec = zoo.preset(
        "llama-tiny",
        num_layers=layers,
        d_model=width,
        vocab_size=tok.vocab_size,
        max_positions=positions,
        eos_token_id=None,  # random weights: every request runs to max_tokens
        pad_token_id=ids["pad"],
        bos_token_id=ids["bos"],
        **{"attention.num_heads": width // 64, "attention.num_kv_heads": width // 64, "ffn.d_ff": 4 * width},
    )
    torch.manual_seed(0)
    zoo.save(zoo.build(spec), folder, tokenizer=tok)


def make_translator(folder: Path, *, layers: int, width: int) -> None:
    """A T5-shaped encoder-decoder (random weights, no end token) and a BPE tokenizer, saved."""
    import torch

    import zoo
    from zoo.io.tokenizer import train_tokenizer

    lines = [" ".join(WORDS[(i * 7 + j * 3) % len(WORDS)] for j in range(12)) + f" {i}" for i in range(2000)]
    tok = train_tokenizer(iter(lines), kind="bpe", vocab_size=1000)
    ids = tok.special_ids()
    spec = zoo.preset(
        "t5-small",
        num_layers=layers,
        d_model=width,
        vocab_size=tok.vocab_size,
        eos_token_id=None,  # random weights: every request runs to max_tokens
        pad_token_id=ids["pad"],
        decoder_start_token_id=ids["pad"],
        dropout=0.0,
        **{"attention.num_heads": width // 64, "ffn.d_ff": 4 * width},
    )
    torch.manual_seed(0)
    zoo.save(zoo.build(spec), folder, tokenizer=tok)


def export_hf(folder: Path, out: Path) -> Path:
    """The zoo checkpoint as a Hugging Face folder (weights and tokenizer), for transformers serve."""
    import zoo

    model, tokenizer, _ = zoo.load_pretrained(folder)
    zoo.to_hf(model, out)
    tokenizer.save_pretrained(out)
    return out


def start_server(
    folder: Path, max_batch: int, device: str, dtype: str, *extra: str
) -> tuple[subprocess.Popen[str], str]:
    command = [
        sys.executable,
        "-m",
        "zoo",
        "serve",
        str(folder),
        "--port",
        "0",
        "--max-batch",
        str(max_batch),
    ]
    command += ["--max-queue", "256", "--model-name", "bench", "--device", device, "--dtype", dtype, *extra]
    return launch(command)


def launch(command: list[str], env: dict[str, str] | None = None) -> tuple[subprocess.Popen[str], str]:
    """Run a ``zoo serve`` command line; (the process, its /v1 url) once it says where it listens."""
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, text=True, env=env)
    assert process.stdout is not None
    line = process.stdout.readline()
    if " at http" not in line:
        process.kill()
        raise RuntimeError(f"zoo serve did not start: {line!r}")
    return process, line.split(" at ")[1].strip()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_transformers(hf_folder: Path, device: str, dtype: str) -> tuple[subprocess.Popen[str], str]:
    """``transformers serve FOLDER --continuous-batching`` on ``device``, on a free localhost port, once it
    answers."""
    import urllib.request

    port = free_port()
    command = [sys.executable, "-m", "transformers.cli.transformers", "serve", str(hf_folder)]
    command += ["--continuous-batching", "--device", device, "--dtype", dtype]
    command += ["--host", "127.0.0.1", "--port", str(port)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    process = subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env
    )
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"transformers serve exited with {process.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                return process, f"http://127.0.0.1:{port}/v1"
        except OSError:
            time.sleep(0.5)
    process.kill()
    raise RuntimeError("transformers serve did not answer within 180 s")


def has_transformers_serve() -> bool:
    try:
        import fastapi  # noqa: F401
        import transformers.cli.transformers  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        return False
    return True


def run_level(
    url: str, clients: int, requests: int, new_tokens: int, *, model: str = "bench"
) -> dict[str, Any]:
    import openai

    client = openai.OpenAI(base_url=url, api_key="-", max_retries=0, timeout=600)
    ttft: list[float] = []
    tokens: list[int] = []
    lock = threading.Lock()

    def worker(index: int) -> None:
        for r in range(requests):
            words = 16 + (index * 13 + r * 7) % 48
            prompt = " ".join(WORDS[(index + j) % len(WORDS)] for j in range(words))
            sent, first, used, pieces = time.perf_counter(), None, 0, 0
            for chunk in client.completions.create(
                model=model,
                prompt=prompt,
                max_tokens=new_tokens,
                temperature=0,
                stream=True,
                stream_options={"include_usage": True},
            ):
                if chunk.choices and chunk.choices[0].text:
                    first = first if first is not None else time.perf_counter() - sent
                    pieces += 1
                if chunk.usage is not None:
                    used = chunk.usage.completion_tokens
            with lock:
                ttft.append(first if first is not None else time.perf_counter() - sent)
                tokens.append(used or pieces)  # a server that sends no usage: one chunk per token

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(clients)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - start
    ordered = sorted(ttft)
    return {
        "clients": clients,
        "requests": len(tokens),
        "tokens": sum(tokens),
        "wall_s": wall,
        "tokens_per_s": sum(tokens) / wall,
        "ttft_p50_s": statistics.median(ordered),
        "ttft_p99_s": ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))],
    }


def chat_ttft(client: Any, system: str, question: str, new_tokens: int) -> tuple[float, int]:
    """(seconds from sending to the first text, prompt tokens) of one streamed greedy chat."""
    sent, first, prompt_tokens = time.perf_counter(), None, 0
    for chunk in client.chat.completions.create(
        model="bench",
        messages=[{"role": "system", "content": system}, {"role": "user", "content": question}],
        max_tokens=new_tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    ):
        if first is None and chunk.choices and chunk.choices[0].delta.content:
            first = time.perf_counter() - sent
        if chunk.usage is not None:
            prompt_tokens = chunk.usage.prompt_tokens
    return (first if first is not None else time.perf_counter() - sent), prompt_tokens


def run_prefix(url: str, rounds: int, words: int, new_tokens: int) -> dict[str, Any]:
    """Cold and warm time to first token of a chat with a long system prompt, ``rounds`` times interleaved
    (a new system prompt each round: its first question is cold, its second warm)."""
    import openai

    client = openai.OpenAI(base_url=url, api_key="-", max_retries=0, timeout=600)
    chat_ttft(client, "a warm-up", "hello", 2)  # the server's first request pays its own start-up
    cold: list[float] = []
    warm: list[float] = []
    tokens: list[int] = []
    for r in range(rounds):
        pick = random.Random(r)
        system = " ".join(pick.choice(WORDS) for _ in range(words))
        seconds, used = chat_ttft(client, system, "which word comes first?", new_tokens)
        cold.append(seconds)
        tokens.append(used)
        warm.append(chat_ttft(client, system, "and which word comes last?", new_tokens)[0])
    return {
        "rounds": rounds,
        "prompt_tokens": statistics.median(tokens),
        "ttft_cold_s": statistics.median(cold),
        "ttft_warm_s": statistics.median(warm),
        "warm_vs_cold": statistics.median(warm) / statistics.median(cold),
        "cold_s": cold,
        "warm_s": warm,
    }


def prefix_markdown(record: dict[str, Any]) -> str:
    m = record["machine"]
    lines = [
        f"Measured on {m.get('gpu') or m.get('cpu', '?')}, {m.get('device', 'cpu')}; model: {record['model']}; "
        "a chat with a long system prompt, one client, cold (first question) and warm (second question) "
        "interleaved, medians.",
        "",
        "| server | rounds | prompt tokens | TTFT cold | TTFT warm | warm / cold |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in record["results"]:
        lines.append(
            f"| {r['server']} | {r['rounds']} | {r['prompt_tokens']:,.0f} | {r['ttft_cold_s'] * 1000:,.0f} ms | "
            f"{r['ttft_warm_s'] * 1000:,.0f} ms | {r['warm_vs_cold']:.2f}x |"
        )
    return "\n".join(lines) + "\n"


def bench_prefix(args: argparse.Namespace, out: Path) -> None:
    """The prefix-cache row: servers with and without the cache, on a model with room for the prompt."""
    started = time.perf_counter()
    record: dict[str, Any] = {
        "machine": report.machine(args.device),
        "model": f"llama-shaped, {args.layers} layers, d_model {args.width}, {args.dtype}, 2048 positions",
        "results": [],
    }
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "model"
        make_model(folder, layers=args.layers, width=args.width, positions=2048)
        for name, size in (("zoo, prefix cache 1G", "1G"), ("zoo, --prefix-cache-bytes 0", "0")):
            process, url = start_server(
                folder, 8, args.device, args.dtype, "--max-length", "1536", "--prefix-cache-bytes", size
            )
            try:
                row = {"server": name, **run_prefix(url, args.prefix_rounds, args.prefix_words, 8)}
            finally:
                process.terminate()
                process.wait(timeout=60)
            record["results"].append(row)
            print(
                f"{name:28s} {row['prompt_tokens']:5.0f} prompt tokens  TTFT cold {row['ttft_cold_s'] * 1000:6.0f} ms"
                f"  warm {row['ttft_warm_s'] * 1000:6.0f} ms  {row['warm_vs_cold']:.2f}x",
                flush=True,
            )
    record["elapsed_s"] = time.perf_counter() - started
    (out / "serve-prefix.json").write_text(json.dumps(record, indent=2) + "\n")
    (out / "serve-prefix.md").write_text(prefix_markdown(record))


def seq2seq_sources(count: int, *, seed: int = 0) -> list[str]:
    """``count`` sources of 4-60 words, each different."""
    pick = random.Random(seed)
    return [" ".join(pick.choice(WORDS) for _ in range(pick.randint(4, 60))) for _ in range(count)]


def complete(
    url: str,
    prompts: list[str],
    new_tokens: list[int],
    *,
    together: bool,
    extra: dict[str, Any] | None = None,
) -> tuple[float, list[str]]:
    """(wall seconds, texts) of greedy completions of ``prompts`` (``new_tokens`` each): all at once (a
    thread each), or one after another; ``extra``: more fields (beam search's)."""
    import openai

    client = openai.OpenAI(base_url=url, api_key="-", max_retries=0, timeout=600)
    texts = [""] * len(prompts)

    def one(i: int) -> None:
        out = client.completions.create(
            model="bench", prompt=prompts[i], max_tokens=new_tokens[i], temperature=0, extra_body=extra
        )
        texts[i] = out.choices[0].text

    start = time.perf_counter()
    if together:
        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    else:
        for i in range(len(prompts)):
            one(i)
    return time.perf_counter() - start, texts


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system, every thread) process ``pid`` has used so far; NaN where /proc has none."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def served(
    process: subprocess.Popen[str], run: Callable[[], tuple[float, list[str]]]
) -> tuple[float, float, list[str]]:
    """(wall seconds, the server's CPU seconds, texts) of ``run``, requests to ``process``."""
    before = cpu_seconds(process.pid)
    wall, texts = run()
    return wall, cpu_seconds(process.pid) - before, texts


class HFBatched:
    """transformers' ``generate`` of the same sources, batched by hand (one right-padded batch)."""

    def __init__(self, folder: Path, hf_folder: Path, device: str, dtype: str) -> None:
        import torch
        import transformers

        import zoo

        self.tokenizer = zoo.load_pretrained(folder).tokenizer
        self.model = (
            transformers.AutoModelForSeq2SeqLM.from_pretrained(hf_folder, dtype=getattr(torch, dtype))
            .to(device)
            .eval()
        )
        self.device = device

    def run(
        self, prompts: list[str], new_tokens: list[int], *, num_beams: int = 1, static: bool = False
    ) -> tuple[float, list[str]]:
        """(wall seconds, texts): one batch generates the most new tokens any request asks for; each
        request's text is its own first ``new_tokens[i]`` (with beams: the best hypothesis's). ``static``:
        a static decoder cache, and the forward compiled (torch.compile, on any device)."""
        import torch
        import transformers

        sources = [self.tokenizer.encode(p, add_eos=True) for p in prompts]  # as `zoo serve` encodes them
        S, pad = max(len(s) for s in sources), self.model.config.pad_token_id
        ids = torch.tensor([s + [pad] * (S - len(s)) for s in sources], device=self.device)
        mask = torch.tensor([[1] * len(s) + [0] * (S - len(s)) for s in sources], device=self.device)
        start, cpu = time.perf_counter(), time.process_time()
        with torch.inference_mode():
            out = self.model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=max(new_tokens),
                min_new_tokens=max(new_tokens),
                do_sample=False,
                num_beams=num_beams,
                eos_token_id=None,
                **(self._static(transformers) if static else {}),
            )
        if self.device.startswith("cuda"):
            torch.cuda.synchronize()
        wall, self.cpu_s = time.perf_counter() - start, time.process_time() - cpu
        return wall, [self.tokenizer.decode(row[1 : 1 + n].tolist()) for row, n in zip(out, new_tokens)]

    @staticmethod
    def _static(transformers: Any) -> dict[str, Any]:
        """generate's arguments for a static cache with the forward compiled: transformers compiles only on
        accelerators unless its CompileConfig's ``_compile_all_devices`` is set (the CPU bench sets it)."""
        config = transformers.CompileConfig()
        config._compile_all_devices = True
        return {"cache_implementation": "static", "compile_config": config}


def seq2seq_markdown(record: dict[str, Any]) -> str:
    m, r = record["machine"], record["summary"]
    return (
        f"Measured on {m.get('gpu') or m.get('cpu', '?')}, {m.get('device', 'cpu')}; model: {record['model']}; "
        f"{record['new_tokens']} new tokens a request on average ({min(record['news'])}-{max(record['news'])}), "
        f"sources of 4-60 words; OMP_NUM_THREADS {record.get('omp_num_threads', '?')}; {record['rounds']} rounds "
        "interleaved, medians.\n\n"
        "| encoder-decoder | tokens/s | zoo (max-batch 32) vs this | tokens per CPU-second | zoo vs this |\n"
        "|---|---:|---:|---:|---:|\n"
        f"| zoo serve, max-batch 32, 32 concurrent | {r['batched_tps']:,.0f} | – | {r['batched_cpu_tps']:,.0f} | – |\n"
        f"| zoo serve, max-batch 1 (one at a time), 32 concurrent | {r['one_tps']:,.0f} | "
        f"**{r['batched_vs_one']:.2f}x** | {r['one_cpu_tps']:,.0f} | {r['batched_vs_one_cpu']:.2f}x |\n"
        f"| transformers `generate`, the 32 batched by hand | {r['hf_tps']:,.0f} | **{r['batched_vs_hf']:.2f}x** | "
        f"{r['hf_cpu_tps']:,.0f} | {r['batched_vs_hf_cpu']:.2f}x |\n"
        "\n"
        f"12 completions of {record['new_tokens']} new tokens at once / one after another (wall time): "
        f"**{r['together_vs_sequential']:.2f}x** "
        f"({r['together_s']:.2f} s / {r['sequential_s']:.2f} s); texts equal: {r['equal']}; "
        f"transformers' texts equal zoo's: {r['hf_equal']}.\n" + seq2seq_compiled_markdown(record)
    )


def seq2seq_compiled_markdown(record: dict[str, Any]) -> str:
    """The compiled contenders' table (``--seq2seq-compile``), or nothing."""
    r = record["summary"]
    if "compiled_tps" not in r:
        return ""
    return (
        "\nCompiled (`--seq2seq-compile`; compile time: the first run of the 32, left out of tokens/s):\n\n"
        "| encoder-decoder, compiled | tokens/s | compile | tokens per CPU-second | texts equal zoo eager's |\n"
        "|---|---:|---:|---:|---:|\n"
        f"| zoo serve --compile, max-batch 32, 32 concurrent | {r['compiled_tps']:,.0f} | "
        f"{record['compile_s']:.0f} s | {r['compiled_cpu_tps']:,.0f} | {r['compiled_equal']} |\n"
        f"| transformers `generate`, static cache + compile, batched by hand | {r['hf_static_tps']:,.0f} | "
        f"{record['hf_compile_s']:.0f} s | {r['hf_static_cpu_tps']:,.0f} | {r['hf_static_equal']} |\n"
        "\n"
        f"zoo --compile vs transformers eager `generate`: **{r['compiled_vs_hf']:.2f}x** "
        f"({r['compiled_vs_hf_cpu']:.2f}x per CPU-second); vs transformers static + compile: "
        f"{r['compiled_vs_hf_static']:.2f}x ({r['compiled_vs_hf_static_cpu']:.2f}x); zoo eager vs transformers "
        f"static + compile: {r['batched_vs_hf_static']:.2f}x ({r['batched_vs_hf_static_cpu']:.2f}x).\n"
    )


def bench_seq2seq(args: argparse.Namespace, out: Path) -> None:
    """The encoder-decoder row (see the module docstring)."""
    started = time.perf_counter()
    record: dict[str, Any] = {
        "machine": report.machine(args.device),
        "model": f"T5-shaped (relative bias), {args.layers} layers, d_model {args.width}, {args.dtype}",
        "new_tokens": args.new_tokens,
        "rounds": args.seq2seq_rounds,
        # torch's threads in every process (servers inherit it): on a shared machine 1 keeps the CPU-time
        # figures steady (no thread spinning at a barrier for a core another job holds)
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS", "torch's default"),
        "results": [],
    }
    prompts, twelve = seq2seq_sources(32), seq2seq_sources(12, seed=1)
    # the 32 ask for different lengths, as translations end at different lengths (mean --new-tokens)
    spread = args.new_tokens * 3 // 4
    # lengths new_tokens - spread .. + spread, spread over the 32 by a step prime to their count
    width = 2 * spread + 1
    step = next(k for k in (13, 11, 7, 5, 3, 2, 1) if math.gcd(k, width) == 1)  # 13 at the default (width 49)
    news = [args.new_tokens - spread + (i * step) % width for i in range(32)]
    record["news"], same = news, [args.new_tokens] * len(twelve)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "translator"
        make_translator(folder, layers=args.layers, width=args.width)
        hf = HFBatched(folder, export_hf(folder, Path(tmp) / "hf"), args.device, args.dtype)
        batched, batched_url = start_server(folder, 32, args.device, args.dtype)
        one, one_url = start_server(folder, 1, args.device, args.dtype)
        servers = [batched, one]
        try:
            complete(batched_url, twelve[:2], [4, 4], together=True)  # warm-up
            complete(one_url, twelve[:2], [4, 4], together=True)
            hf.run(prompts, news)  # its first call at a shape is several times slower
            tokens = sum(news)
            if args.seq2seq_compile:
                compiled, compiled_url = start_server(folder, 32, args.device, args.dtype, "--compile")
                servers.append(compiled)
                # the first run compiles (and any recompile the lengths cause): timed apart, not counted
                record["compile_s"] = complete(compiled_url, prompts, news, together=True)[0]
                record["hf_compile_s"] = hf.run(prompts, news, static=True)[0]
            for r in range(args.seq2seq_rounds):
                row: dict[str, Any] = {"round": r}
                wall, cpu, texts = served(
                    batched, lambda: complete(batched_url, prompts, news, together=True)
                )
                row["batched_tps"], row["batched_cpu_tps"] = tokens / wall, tokens / cpu
                wall, hf_texts = hf.run(prompts, news)
                row["hf_tps"], row["hf_cpu_tps"] = tokens / wall, tokens / hf.cpu_s
                row["hf_equal"] = sum(a == b for a, b in zip(texts, hf_texts))
                wall, cpu, _ = served(one, lambda: complete(one_url, prompts, news, together=True))
                row["one_tps"], row["one_cpu_tps"] = tokens / wall, tokens / cpu
                if args.seq2seq_compile:
                    wall, cpu, compiled_texts = served(
                        compiled, lambda: complete(compiled_url, prompts, news, together=True)
                    )
                    row["compiled_tps"], row["compiled_cpu_tps"] = tokens / wall, tokens / cpu
                    row["compiled_equal"] = sum(a == b for a, b in zip(texts, compiled_texts))
                    wall, static_texts = hf.run(prompts, news, static=True)
                    row["hf_static_tps"], row["hf_static_cpu_tps"] = tokens / wall, tokens / hf.cpu_s
                    row["hf_static_equal"] = sum(a == b for a, b in zip(texts, static_texts))
                row["sequential_s"], alone = complete(batched_url, twelve, same, together=False)
                row["together_s"], together = complete(batched_url, twelve, same, together=True)
                row["equal"] = alone == together
                record["results"].append(row)
                print(
                    f"seq2seq round {r}: max-batch 32 {row['batched_tps']:7.1f} tokens/s "
                    f"({row['batched_cpu_tps']:.0f} per CPU-s), max-batch 1 {row['one_tps']:7.1f} "
                    f"({row['one_cpu_tps']:.0f}), transformers generate batched {row['hf_tps']:7.1f} "
                    f"({row['hf_cpu_tps']:.0f}); 12 at once "
                    f"{row['together_s']:.2f} s vs one after another {row['sequential_s']:.2f} s "
                    f"(equal: {row['equal']})"
                    + (
                        f"; compiled {row['compiled_tps']:7.1f} ({row['compiled_cpu_tps']:.0f}, "
                        f"{row['compiled_equal']}/32 equal), transformers static+compile "
                        f"{row['hf_static_tps']:7.1f} ({row['hf_static_cpu_tps']:.0f}, "
                        f"{row['hf_static_equal']}/32 equal)"
                        if args.seq2seq_compile
                        else ""
                    ),
                    flush=True,
                )
        finally:
            for process in servers:
                process.terminate()
                process.wait(timeout=60)
    rows = record["results"]

    def median(key: str) -> float:
        return statistics.median(row[key] for row in rows)

    def ratio(a: str, b: str) -> float:
        return statistics.median(row[a] / row[b] for row in rows)

    record["summary"] = {
        **{key: median(key) for key in ("batched_tps", "one_tps", "hf_tps")},
        **{key: median(key) for key in ("batched_cpu_tps", "one_cpu_tps", "hf_cpu_tps")},
        "batched_vs_one": ratio("batched_tps", "one_tps"),
        "batched_vs_hf": ratio("batched_tps", "hf_tps"),
        "batched_vs_one_cpu": ratio("batched_cpu_tps", "one_cpu_tps"),
        "batched_vs_hf_cpu": ratio("batched_cpu_tps", "hf_cpu_tps"),
        "sequential_s": median("sequential_s"),
        "together_s": median("together_s"),
        "together_vs_sequential": statistics.median(row["together_s"] / row["sequential_s"] for row in rows),
        "equal": all(row["equal"] for row in rows),
        "hf_equal": f"{min(row['hf_equal'] for row in rows)}/{len(prompts)}",
    }
    if args.seq2seq_compile:
        record["summary"].update(
            {
                **{key: median(key) for key in ("compiled_tps", "compiled_cpu_tps")},
                **{key: median(key) for key in ("hf_static_tps", "hf_static_cpu_tps")},
                "compiled_vs_hf": ratio("compiled_tps", "hf_tps"),
                "compiled_vs_hf_cpu": ratio("compiled_cpu_tps", "hf_cpu_tps"),
                "compiled_vs_hf_static": ratio("compiled_tps", "hf_static_tps"),
                "compiled_vs_hf_static_cpu": ratio("compiled_cpu_tps", "hf_static_cpu_tps"),
                "batched_vs_hf_static": ratio("batched_tps", "hf_static_tps"),
                "batched_vs_hf_static_cpu": ratio("batched_cpu_tps", "hf_static_cpu_tps"),
                "compiled_equal": f"{min(row['compiled_equal'] for row in rows)}/{len(prompts)}",
                "hf_static_equal": f"{min(row['hf_static_equal'] for row in rows)}/{len(prompts)}",
            }
        )
    record["elapsed_s"] = time.perf_counter() - started
    (out / "serve-seq2seq.json").write_text(json.dumps(record, indent=2) + "\n")
    (out / "serve-seq2seq.md").write_text(seq2seq_markdown(record))
    print(seq2seq_markdown(record))


def beams_markdown(record: dict[str, Any]) -> str:
    m, r = record["machine"], record["summary"]
    return (
        f"Measured on {m.get('gpu') or m.get('cpu', '?')}, {m.get('device', 'cpu')}; model: {record['model']}; "
        f"{record['requests']} beam requests (best_of {record['width']}) of {record['new_tokens']} new tokens, "
        f"sources of 4-60 words; OMP_NUM_THREADS {record.get('omp_num_threads', '?')}; {record['rounds']} "
        "rounds interleaved, medians.\n\n"
        "| beam requests | wall time | hypothesis tokens/s |\n"
        "|---|---:|---:|\n"
        f"| zoo serve (max-batch 32), one after another | {r['sequential_s']:.2f} s | {r['sequential_tps']:,.0f} |\n"
        f"| zoo serve (max-batch 32), all at once | {r['together_s']:.2f} s | {r['together_tps']:,.0f} |\n"
        f"| transformers `generate(num_beams={record['width']})`, the {record['requests']} batched by hand | "
        f"{r['hf_s']:.2f} s | {r['hf_tps']:,.0f} |\n"
        "\n"
        f"At once / one after another (wall time): **{r['together_vs_sequential']:.2f}x**; texts equal: "
        f"{r['equal']}; zoo at once / transformers (wall time): {r['together_vs_hf']:.2f}x; transformers' "
        f"texts equal zoo's: {r['hf_equal']}.\n"
    )


def bench_beams(args: argparse.Namespace, out: Path) -> None:
    """The beam row (see the module docstring)."""
    started = time.perf_counter()
    width, count = 4, 8
    record: dict[str, Any] = {
        "machine": report.machine(args.device),
        "model": f"T5-shaped (relative bias), {args.layers} layers, d_model {args.width}, {args.dtype}",
        "new_tokens": args.new_tokens,
        "width": width,
        "requests": count,
        "rounds": args.beam_rounds,
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS", "torch's default"),
        "results": [],
    }
    prompts, news = seq2seq_sources(count, seed=2), [args.new_tokens] * count
    beams = {"use_beam_search": True, "best_of": width}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "translator"
        make_translator(folder, layers=args.layers, width=args.width)
        hf = HFBatched(folder, export_hf(folder, Path(tmp) / "hf"), args.device, args.dtype)
        server, url = start_server(folder, 32, args.device, args.dtype)
        try:
            complete(url, prompts[:2], [4, 4], together=True, extra=beams)  # warm-up
            hf.run(prompts, news, num_beams=width)
            for r in range(args.beam_rounds):
                row: dict[str, Any] = {"round": r}
                row["sequential_s"], alone = complete(url, prompts, news, together=False, extra=beams)
                row["together_s"], together = complete(url, prompts, news, together=True, extra=beams)
                row["hf_s"], hf_texts = hf.run(prompts, news, num_beams=width)
                row["equal"] = alone == together
                row["hf_equal"] = sum(a == b for a, b in zip(together, hf_texts))
                record["results"].append(row)
                print(
                    f"beams round {r}: {count} beam requests (best_of {width}) at once {row['together_s']:.2f} s, "
                    f"one after another {row['sequential_s']:.2f} s (equal: {row['equal']}); transformers "
                    f"generate batched {row['hf_s']:.2f} s ({row['hf_equal']}/{count} texts equal)",
                    flush=True,
                )
        finally:
            server.terminate()
            server.wait(timeout=60)
    rows, tokens = record["results"], sum(news)
    sequential = statistics.median(row["sequential_s"] for row in rows)
    together = statistics.median(row["together_s"] for row in rows)
    hf_s = statistics.median(row["hf_s"] for row in rows)
    record["summary"] = {
        "sequential_s": sequential,
        "together_s": together,
        "hf_s": hf_s,
        "sequential_tps": tokens / sequential,
        "together_tps": tokens / together,
        "hf_tps": tokens / hf_s,
        "together_vs_hf": statistics.median(row["together_s"] / row["hf_s"] for row in rows),
        "hf_equal": f"{min(row['hf_equal'] for row in rows)}/{count}",
        "together_vs_sequential": statistics.median(row["together_s"] / row["sequential_s"] for row in rows),
        "equal": all(row["equal"] for row in rows),
    }
    record["elapsed_s"] = time.perf_counter() - started
    (out / "serve-beams.json").write_text(json.dumps(record, indent=2) + "\n")
    (out / "serve-beams.md").write_text(beams_markdown(record))
    print(beams_markdown(record))


def markdown(record: dict[str, Any]) -> str:
    m = record["machine"]
    lines = [
        f"Measured on {m.get('gpu') or m.get('cpu', '?')}, {m.get('device', 'cpu')}; model: {record['model']}, "
        f"{record['new_tokens']} new tokens a request, {record['requests']} requests per client.",
        "",
        "| server | clients | tokens/s | vs one at a time | zoo vs this | TTFT p50 | TTFT p99 |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    by = {(r["server"], r["clients"]): r for r in record["results"]}
    zoo_name = next(
        (server for server, _ in by if server.startswith("zoo") and server != ONE_AT_A_TIME), None
    )
    for (server, clients), r in sorted(by.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        base, ours = by.get((ONE_AT_A_TIME, clients)), by.get((zoo_name, clients)) if zoo_name else None
        ratio = f"{r['tokens_per_s'] / base['tokens_per_s']:.2f}x" if base else "–"
        versus = f"{ours['tokens_per_s'] / r['tokens_per_s']:.2f}x" if ours and server != zoo_name else "–"
        lines.append(
            f"| {server} | {clients} | {r['tokens_per_s']:,.0f} | {ratio} | {versus} | "
            f"{r['ttft_p50_s'] * 1000:,.0f} ms | {r['ttft_p99_s'] * 1000:,.0f} ms |"
        )
    return "\n".join(lines) + "\n"


def write(record: dict[str, Any], out: Path, started: float) -> None:
    record["elapsed_s"] = time.perf_counter() - started
    (out / "serve.json").write_text(json.dumps(record, indent=2) + "\n")
    (out / "serve.md").write_text(markdown(record))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--requests", type=int, default=4, help="requests per client at each level")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--max-batch", type=int, default=32, help="the continuous-batching server's slots")
    parser.add_argument(
        "--device", default="cpu", help="cpu (default), cuda or cuda:N: where every server runs"
    )
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument(
        "--no-transformers", action="store_true", help="leave out transformers serve --continuous-batching"
    )
    parser.add_argument(
        "--prefix-rounds",
        type=int,
        default=5,
        help="cold/warm pairs of the prefix-cache row (0: leave it out)",
    )
    parser.add_argument(
        "--prefix-words", type=int, default=880, help="words of its system prompt (~900 tokens)"
    )
    parser.add_argument("--prefix-only", action="store_true", help="run the prefix-cache row alone")
    parser.add_argument(
        "--seq2seq-rounds", type=int, default=3, help="rounds of the encoder-decoder row (0: leave it out)"
    )
    parser.add_argument("--seq2seq-only", action="store_true", help="run the encoder-decoder row alone")
    parser.add_argument(
        "--seq2seq-compile",
        action="store_true",
        help="add zoo serve --compile and transformers' static cache + compile to the encoder-decoder row",
    )
    parser.add_argument("--beam-rounds", type=int, default=3, help="rounds of the beam row (0: leave it out)")
    parser.add_argument("--beams-only", action="store_true", help="run the beam row alone")
    report.add_output_options(parser)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    if args.beams_only:
        out = report.output_dir(args)
        out.mkdir(parents=True, exist_ok=True)
        bench_beams(args, out)
        print(f"wrote {out}/serve-beams.json and serve-beams.md")
        return 0
    if args.seq2seq_only:
        out = report.output_dir(args)
        out.mkdir(parents=True, exist_ok=True)
        bench_seq2seq(args, out)
        print(f"wrote {out}/serve-seq2seq.json and serve-seq2seq.md")
        return 0
    if args.prefix_only:
        out = report.output_dir(args)
        out.mkdir(parents=True, exist_ok=True)
        bench_prefix(args, out)
        print(f"wrote {out}/serve-prefix.json and serve-prefix.md")
        return 0
    record: dict[str, Any] = {
        "machine": report.machine(args.device),
        "model": f"llama-shaped, {args.layers} layers, d_model {args.width}, {args.dtype}",
        "new_tokens": args.new_tokens,
        "requests": args.requests,
        "results": [],
    }
    out = report.output_dir(args)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "model"
        make_model(folder, layers=args.layers, width=args.width)
        servers: list[tuple[str, Callable[[], tuple[subprocess.Popen[str], str]], str]] = [
            (
                f"zoo max-batch {args.max_batch}",
                lambda: start_server(folder, args.max_batch, args.device, args.dtype),
                "bench",
            ),
            (ONE_AT_A_TIME, lambda: start_server(folder, 1, args.device, args.dtype), "bench"),
        ]
        if not args.no_transformers and has_transformers_serve():
            hf = export_hf(folder, Path(tmp) / "hf")
            servers.append(
                (
                    "transformers serve --continuous-batching",
                    lambda: start_transformers(hf, args.device, args.dtype),
                    str(hf),
                )
            )
        else:
            record["transformers"] = "not run (--no-transformers, or transformers serve is not installed)"
        for name, start, model in servers:
            try:
                process, url = start()
            except RuntimeError as error:  # one server that cannot start leaves the others' rows standing
                record.setdefault("not_started", {})[name] = str(error)
                print(f"{name}: {error}", flush=True)
                continue
            try:
                run_level(url, 2, 1, 4, model=model)  # warm-up
                for clients in args.clients:
                    level = run_level(url, clients, args.requests, args.new_tokens, model=model)
                    row = {"server": name, **level}
                    record["results"].append(row)
                    print(
                        f"{name:14s} {clients:3d} clients  {row['tokens_per_s']:8.1f} tokens/s  "
                        f"TTFT p50 {row['ttft_p50_s'] * 1000:7.0f} ms  p99 {row['ttft_p99_s'] * 1000:7.0f} ms",
                        flush=True,
                    )
                    write(record, out, started)
            finally:
                process.terminate()
                process.wait(timeout=60)
    write(record, out, started)
    print(f"\n{markdown(record)}\nwrote {out}/serve.json and serve.md in {record['elapsed_s']:.0f} s")
    if args.prefix_rounds > 0:
        bench_prefix(args, out)
    if args.seq2seq_rounds > 0:
        bench_seq2seq(args, out)
    if args.beam_rounds > 0:
        bench_beams(args, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
