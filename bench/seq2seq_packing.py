"""Packed seq2seq training against padded batches: target tokens trained per second.

On one corpus of (source, target) pairs, three ways of batching the same training step (forward, backward,
gradient clipping, Adam), interleaved round by round (the machine is shared), medians reported:

    zoo padded        zoo's own batches: pairs sorted by length, cut under ``batch.max_tokens`` padded
                      tokens (`zoo.training.data.planning`), the model transformer-tiny
    zoo packed        ``data.packing``: whole pairs several to a row, 64 tokens a side on the demo's
                      short pairs, 256 on the skewed ones
                      (`zoo.training.tasks.seq2seq`), the same model and ``max_tokens``
    HF group_by_length  transformers' MarianMTModel of the same shape (d_model 128, 4 + 4 post-norm
                      layers, 4 heads, FFN 512 ReLU, tied embeddings, sinusoids), batches as
                      Seq2SeqTrainer's ``group_by_length`` makes them (shuffled, megabatches of 50 batches
                      sorted by source length, a fixed number of pairs a batch, padded to the longest of
                      each), loss on the full logits with label smoothing 0.1 as its LabelSmoother
    HF shuffled       (``--shuffled``) the same model in Seq2SeqTrainer's default batches (``group_by_length``
                      off): shuffled pairs, as many a batch, padded to the longest of each

The corpora: the demo's toy English-Korean pairs (6,000, its 1,000-token BPE), and a generated
length-skewed one (source lengths log-uniform in 5..200 tokens, so most pairs are short; the target
0.8-1.25x the source; random ids over 1,000 tokens). Every contender trains on the same pairs: a round is
one epoch over them in its own batches, collated before the clock starts.

    python -m bench.seq2seq_packing                    # both corpora, 3 rounds (an epoch each) per contender
    python -m bench.seq2seq_packing --rounds 5 --skewed-pairs 2000 --update
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from bench import report

MAX_TOKENS = 4096
BLOCK = 256  # the model's positions, the length limit, and the skewed corpus's rows
DEMO_BLOCK = 64  # the demo's pairs are short (at most 15 tokens a side): rows of 64 hold several
VOCAB = 1000
EOS, PAD, START = 2, 0, 0
WARMUP = 2  # steps per contender before the first round, not timed


class Specials:
    """The tokenizer as the task sees it: eos only (sources and targets end with it)."""

    bos_id, eos_id, mask_id, pad_id, vocab_size = None, EOS, None, PAD, VOCAB

    def special_ids(self) -> dict[str, int]:
        return {"pad": PAD, "eos": EOS}


def skewed_pairs(n: int, seed: int = 0) -> list[tuple[list[int], list[int]]]:
    rng = np.random.default_rng(seed)
    sources = np.exp(rng.uniform(math.log(5), math.log(200), n)).astype(int)
    targets = np.clip(np.rint(sources * rng.uniform(0.8, 1.25, n)), 5, 200).astype(int)
    return [
        (rng.integers(4, VOCAB, s).tolist(), rng.integers(4, VOCAB, t).tolist())
        for s, t in zip(sources, targets)
    ]


def demo_pairs() -> list[tuple[list[int], list[int]]]:
    from zoo.demo import toy_corpus
    from zoo.io.tokenizer import train_tokenizer

    corpus = toy_corpus(seed=0, train_size=6000, valid_size=300).train
    tok = train_tokenizer(iter([t for pair in corpus for t in pair]), kind="bpe", vocab_size=VOCAB)
    sources = tok.encode_ids([s for s, _ in corpus])
    targets = tok.encode_ids([t for _, t in corpus])
    return list(zip(sources, targets))


def zoo_batches(
    pairs: list[tuple[list[int], list[int]]], folder: Path, *, packed: bool, block: int
) -> list[Any]:
    """Every batch of zoo's epoch 0 over ``pairs``, collated."""
    from zoo.training.config import PackingConfig
    from zoo.training.data.planning import plan_batches
    from zoo.training.data.shards import ShardWriter, SideInfo, open_prepared
    from zoo.training.task_settings import settings_for
    from zoo.training.tasks import build_task
    from zoo.training.tasks.base import Limits, Split, Tokenizers

    path = folder / "pairs"
    if not path.exists():
        with ShardWriter(
            path, {"source": SideInfo(vocab_size=VOCAB), "target": SideInfo(vocab_size=VOCAB)}
        ) as w:
            w.write(
                {"source": [s for s, _ in pairs], "target": [t for _, t in pairs]},
                origins=[(0, i + 1) for i in range(len(pairs))],
            )
            w.close(sources=[{"path": "pairs.tsv", "bytes": 0, "mtime_ns": 0, "sha256": ""}])
    split = Split("train", open_prepared(path))
    task = build_task(settings_for("seq2seq"), packing=PackingConfig(block_size=block) if packed else None)
    tokenizers, limits = Tokenizers(Specials()), Limits(BLOCK)  # type: ignore[arg-type]
    units = task.units(split, tokenizers=tokenizers, limits=limits)
    collate = task.collator(split, units, spec=model_spec(), tokenizers=tokenizers, limits=limits)
    plan = plan_batches(units.lengths, max_tokens=MAX_TOKENS, seed=0, epoch=0)
    return [collate(b) for b in plan]


def model_spec() -> Any:
    from zoo.spec import preset

    return preset("transformer-tiny").override(
        vocab_size=VOCAB,
        pad_token_id=PAD,
        eos_token_id=EOS,
        decoder_start_token_id=START,
        max_positions=BLOCK,
    )


def hf_batches(
    pairs: list[tuple[list[int], list[int]]], *, seed: int = 0, by_length: bool = True
) -> list[dict[str, Any]]:
    """Seq2SeqTrainer's group_by_length batches (transformers' LengthGroupedSampler), padded to the longest,
    as many pairs a batch as fill ``MAX_TOKENS`` real tokens on average; ``by_length=False``: its default
    batches, the shuffled pairs in order."""
    lengths = np.array([len(s) + 1 for s, _ in pairs])
    mean = np.mean([len(s) + len(t) + 2 for s, t in pairs])
    size = max(1, int(MAX_TOKENS // mean))
    order = np.random.default_rng(seed).permutation(len(pairs))
    mega = size * 50
    batches = []
    for start in range(0, len(order), mega):
        chunk = order[start : start + mega]
        if by_length:
            chunk = chunk[np.argsort(-lengths[chunk], kind="stable")]
        batches += [chunk[i : i + size] for i in range(0, len(chunk), size)]
    out = []
    for batch in batches:
        sources = [torch.tensor([*pairs[i][0], EOS]) for i in batch]
        targets = [torch.tensor([*pairs[i][1], EOS]) for i in batch]
        ids = torch.nn.utils.rnn.pad_sequence(sources, batch_first=True, padding_value=PAD)
        labels = torch.nn.utils.rnn.pad_sequence(targets, batch_first=True, padding_value=-100)
        out.append({"input_ids": ids, "attention_mask": (ids != PAD).long(), "labels": labels})
    return out


def hf_model() -> torch.nn.Module:
    import transformers

    config = transformers.MarianConfig(
        vocab_size=VOCAB, d_model=128, encoder_layers=4, decoder_layers=4, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=512, decoder_ffn_dim=512, activation_function="relu",
        max_position_embeddings=BLOCK, scale_embedding=True, dropout=0.1, attention_dropout=0.0,
        activation_dropout=0.0, pad_token_id=PAD, decoder_start_token_id=START, eos_token_id=EOS,
    )  # fmt: skip
    return transformers.MarianMTModel(config)


def zoo_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> Callable[[Any], int]:
    from zoo.training.objectives import TokenCrossEntropy

    objective = TokenCrossEntropy(label_smoothing=0.1)

    def step(batch: Any) -> int:
        count = objective.count(batch)
        sums = objective(model, batch, device=torch.device("cpu"))
        (sums.loss / count).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return count

    return step


def hf_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> Callable[[Any], int]:
    def step(batch: dict[str, Any]) -> int:
        labels = batch["labels"]
        logits = model(**batch).logits  # (B, T, V): the whole head, as Seq2SeqTrainer computes it
        loss = F.cross_entropy(logits.transpose(1, 2), labels, ignore_index=-100, label_smoothing=0.1)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return int((labels != -100).sum())

    return step


def timed(step: Callable[[Any], int], batches: list[Any]) -> tuple[float, float]:
    """Target tokens per second and per CPU-second of this process (what the other work on a shared machine
    takes from the wall clock, it takes less from this) over one epoch of ``batches``."""
    tokens, start, cpu = 0, time.perf_counter(), time.process_time()
    for batch in batches:
        tokens += step(batch)
    return tokens / (time.perf_counter() - start), tokens / (time.process_time() - cpu)


def fill(batches: list[Any], *, hf: bool) -> float:
    """Real tokens over padded places, both sides."""
    real = padded = 0
    for b in batches:
        if hf:
            real += int(b["attention_mask"].sum() + (b["labels"] != -100).sum())
            padded += b["input_ids"].numel() + b["labels"].numel()
        else:
            real += b.num_tokens
            padded += b.inputs["input_ids"].numel() + b.inputs["decoder_input_ids"].numel()
    return real / padded


def pairs_in(batch: Any, *, hf: bool) -> int:
    if hf:
        return len(batch["input_ids"])
    documents = batch.inputs.get("decoder_document_ids")
    return len(batch.targets) if documents is None else int((documents.max(dim=1).values + 1).sum())


def measure(
    name: str, pairs: list[tuple[list[int], list[int]]], *, rounds: int, block: int, shuffled: bool = False
) -> list[dict[str, Any]]:
    from zoo.models.build import build_model

    with tempfile.TemporaryDirectory() as tmp:
        batches = {
            "zoo padded": zoo_batches(pairs, Path(tmp), packed=False, block=block),
            "zoo packed": zoo_batches(pairs, Path(tmp), packed=True, block=block),
            "HF group_by_length": hf_batches(pairs),
        }
        if shuffled:
            batches["HF shuffled"] = hf_batches(pairs, by_length=False)
    torch.manual_seed(0)
    models = {"zoo padded": build_model(model_spec()), "zoo packed": build_model(model_spec()),
              "HF group_by_length": hf_model()}  # fmt: skip
    if shuffled:
        models["HF shuffled"] = hf_model()
    steps_of = {
        key: (hf_step if key.startswith("HF") else zoo_step)(
            m.train(), torch.optim.Adam(m.parameters(), lr=1e-4)
        )
        for key, m in models.items()
    }
    for key in models:  # warm-up: the allocator, the first calls
        for batch in batches[key][:WARMUP]:
            steps_of[key](batch)
    rates: dict[str, list[float]] = {key: [] for key in models}
    cpu_rates: dict[str, list[float]] = {key: [] for key in models}
    for _ in range(rounds):  # interleaved: the load the machine is under falls on every contender alike
        for key in models:
            wall, cpu = timed(steps_of[key], batches[key])
            rates[key].append(wall)
            cpu_rates[key].append(cpu)
    rows = []
    for key, values in rates.items():
        rows.append({
            "corpus": name, "contender": key, "rate": statistics.median(values), "slowest": min(values),
            "cpu_rate": statistics.median(cpu_rates[key]),
            "fastest": max(values), "fill": fill(batches[key], hf=key.startswith("HF")),
            "pairs_per_batch": statistics.mean(pairs_in(b, hf=key.startswith("HF")) for b in batches[key]),
        })  # fmt: skip
    padded = next(r for r in rows if r["contender"] == "zoo padded")
    hf = next(r["rate"] for r in rows if r["contender"] == "HF group_by_length")
    for r in rows:
        r["vs_padded"], r["vs_hf"] = r["rate"] / padded["rate"], r["rate"] / hf
        r["cpu_vs_padded"] = r["cpu_rate"] / padded["cpu_rate"]
        r["block"] = block
    return rows


def markdown(record: dict[str, Any]) -> str:
    m = record["machine"]
    lines = [
        f"Measured on {m['cpu']} ({m['cores']} cores, {m['torch_threads']} torch thread), {record['load']}; "
        f"torch {m['torch']}, transformers {m.get('transformers', '-')}; transformer-tiny shape, "
        f"batch.max_tokens {MAX_TOKENS}; median of {record['rounds']} interleaved rounds "
        "each an epoch over the same pairs for every contender (slowest–fastest).",
        "",
        "| corpus | batching | block | target tokens/s | vs zoo padded | vs HF | per CPU-second vs zoo padded "
        "| real / padded places | pairs a batch |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in record["results"]:
        lines.append(
            f"| {r['corpus']} | {r['contender']} | {r['block'] if 'packed' in r['contender'] else '–'} | {r['rate']:,.0f} ({r['slowest']:,.0f}–{r['fastest']:,.0f}) | "
            f"{r['vs_padded']:.2f}x | {r['vs_hf']:.2f}x | {cpu_ratio(r)} | {100 * r['fill']:.0f}% | "
            f"{r['pairs_per_batch']:.0f} |"
        )
    return "\n".join(lines) + "\n"


def cpu_ratio(row: dict[str, Any]) -> str:
    """Target tokens per CPU-second against zoo padded's (records before it was measured: -)."""
    return f"{row['cpu_vs_padded']:.2f}x" if "cpu_vs_padded" in row else "–"


def loadavg() -> str:
    """The one-minute load average: the other work the shared machine carried."""
    return Path("/proc/loadavg").read_text().split()[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.seq2seq_packing", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--demo-pairs", type=int, default=2000, help="the demo corpus's first N pairs")
    parser.add_argument("--skewed-pairs", type=int, default=600, help="generated length-skewed pairs")
    parser.add_argument("--corpus", choices=["demo", "skewed", "both"], default="both")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--shuffled",
        action="store_true",
        help="also Seq2SeqTrainer's default batches (not grouped by length)",
    )
    report.add_output_options(parser)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    load = f"load average {loadavg()} at the start"
    results = []
    if args.corpus in ("demo", "both"):
        pairs = demo_pairs()[: args.demo_pairs]
        results += measure(
            f"demo ({len(pairs):,} toy pairs)",
            pairs,
            rounds=args.rounds,
            block=DEMO_BLOCK,
            shuffled=args.shuffled,
        )
    if args.corpus in ("skewed", "both"):
        results += measure(
            f"skewed ({args.skewed_pairs:,} pairs, 5-200)",
            skewed_pairs(args.skewed_pairs),
            rounds=args.rounds,
            block=BLOCK,
            shuffled=args.shuffled,
        )
    load += f", {loadavg()} at the end"
    record = {"machine": report.machine("cpu"), "load": load, "rounds": args.rounds,
              "results": results}  # fmt: skip
    out = report.output_dir(args)
    out.mkdir(parents=True, exist_ok=True)
    (out / "seq2seq-packing.json").write_text(json.dumps(record, indent=2) + "\n")
    (out / "seq2seq-packing.md").write_text(markdown(record))
    print(markdown(record))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
