"""Speculative decoding: plain greedy against an assistant model and prompt lookup, zoo and transformers.

    python -m bench.speculative                 # CPU; --device cuda on a GPU; --batch 1 8

The pair: a GPT-2-shaped target (4 layers, d_model 768, 12 heads, FFN 3072) and a gpt2-tiny-shaped draft
(2 layers, d_model 64), both over a byte vocabulary (512 ids, GPT-2's wiring), both fitted for ``--steps``
AdamW steps on one repeating paragraph, so the draft agrees with the target most of the time (the issue's
acceptance setup; a model trained on real text accepts less). Each contender continues the paragraph's
first 32 bytes by ``--new-tokens`` greedy tokens in float32; zoo's are checked to return plain greedy's
tokens. transformers runs the same weights through `zoo.to_hf` (``assistant_model=``,
``prompt_lookup_num_tokens=``; one row only, so at batch 1 only). ``--engine`` adds the serving engine
(`zoo.serving.Engine`, in process, no HTTP): ``batch`` concurrent requests of the same prompt, plain and
with ``Speculation`` (``zoo serve --prompt-lookup`` / ``--draft``), checked to return plain greedy's tokens.
Reported: tokens/s (median of the repetitions), the wall time against the same library's (or the engine's)
plain greedy, and the acceptance rate (accepted drafts / drafted tokens: for generate counted at the target's
verification forwards, for the engine its own counters). ``--models DIR`` keeps the fitted pair there
and reuses it on the next run.

``--target DIR --draft DIR`` runs a trained pair instead (saved zoo models with one tokenizer: the README's
GPT and a 1-layer draft trained the same way, realistic acceptance; `bench.speculative_trained` says how to
make them) and writes speculative-trained-{threads}t.json / .md.

Writes speculative.json and speculative.md to bench/results/local/ (or --out DIR; --update: bench/results/).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import torch

import zoo
from bench import report
from bench.timing import alternate
from zoo.generation.weight_layout import use_decoding_layout

TEXT = (
    "The quick brown fox jumps over the lazy dog while the five boxing wizards jump quickly; "
    "a journey of a thousand miles begins with a single step, and every step after it is shorter. "
)
OFFSET = 3  # byte b is token b + 3: 0, 1, 2 stay pad, bos, eos


def _ids(text: str) -> torch.Tensor:
    return torch.tensor([b + OFFSET for b in text.encode()])


def _fit(model: zoo.ZooModel, steps: int, device: str, seed: int) -> float:
    """AdamW on 4 random 96-token windows a step of the repeating text; returns the last loss."""
    corpus = _ids(TEXT * 40).to(device)
    g = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model.train()
    loss = torch.tensor(0.0)
    for _ in range(steps):
        starts = torch.randint(0, len(corpus) - 97, (4,), generator=g).tolist()
        batch = torch.stack([corpus[s : s + 97] for s in starts])
        logits = model(batch[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    return float(loss.detach())


class Counter:
    """Counts the target's verification forwards and drafted tokens (wraps ``all_token_logits``): each
    forward feeds the token not yet cached (the whole prompt, the first time) and its drafts."""

    def __init__(self, model: zoo.ZooModel, prompt_length: int) -> None:
        self.calls = self.drafted = 0
        inner = model.all_token_logits

        def counted(ids: torch.Tensor, *rest: Any) -> torch.Tensor:
            self.drafted += ids.shape[1] - (prompt_length if self.calls == 0 else 1)
            self.calls += 1
            return inner(ids, *rest)

        model.all_token_logits = counted  # type: ignore[method-assign]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--steps", type=int, default=60, help="training steps of each model")
    parser.add_argument(
        "--new-tokens", type=int, default=None, help="default 256 (--target: 48, each row stops at eos)"
    )
    parser.add_argument("--batch", type=int, nargs="+", default=[1])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--lookup", type=int, default=4, help="prompt_lookup_num_tokens")
    parser.add_argument("--no-hf", action="store_true", help="skip transformers")
    parser.add_argument("--engine", action="store_true", help="add the serving engine's rows")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("--models", type=Path, default=None, help="keep / reuse the fitted pair here")
    parser.add_argument("--target", type=Path, default=None, help="a trained zoo model (with --draft)")
    parser.add_argument("--draft", type=Path, default=None, help="its trained draft, same tokenizer")
    parser.add_argument("--prompts", type=int, default=32, help="--target: validation sentences per workload")
    parser.add_argument("--prompt-tokens", type=int, default=3, help="--target: each sentence's tokens given")
    parser.add_argument("--assistant-tokens", type=int, default=4, help="--target: a short draft's length")
    report.add_output_options(parser)
    args = parser.parse_args(argv)
    device = args.device
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if (args.target is None) != (args.draft is None):
        parser.error("--target and --draft go together")
    if args.target is not None:
        args.new_tokens = args.new_tokens or 48  # the pair's max_positions is 128
        return _trained(args)
    args.new_tokens = args.new_tokens or 256
    torch.manual_seed(0)
    base = zoo.preset("gpt2-tiny").override(max_positions=1024, dropout=0.0)
    target_spec = base.override(d_model=768, num_layers=4, **{"attention.num_heads": 12, "ffn.d_ff": 3072})
    kept = args.models
    if kept is not None and (kept / "target").exists():
        target, draft = zoo.load(kept / "target", device=device), zoo.load(kept / "draft", device=device)
        losses = json.loads((kept / "losses.json").read_text())
    else:
        target = zoo.build(target_spec).to(device)
        draft = zoo.build(base).to(device)
        losses = {"target": _fit(target, args.steps, device, 0), "draft": _fit(draft, args.steps, device, 1)}
        if kept is not None:
            zoo.save(target, kept / "target")
            zoo.save(draft, kept / "draft")
            (kept / "losses.json").write_text(json.dumps(losses))
    target.eval()
    draft.eval()
    print(f"fitted: final loss target {losses['target']:.4f}, draft {losses['draft']:.4f}", flush=True)
    hf = hf_draft = None
    if not args.no_hf:
        import transformers

        folder = Path(tempfile.mkdtemp())
        zoo.to_hf(target, folder / "target")
        zoo.to_hf(draft, folder / "draft")
        hf = transformers.AutoModelForCausalLM.from_pretrained(folder / "target").to(device).eval()
        hf_draft = transformers.AutoModelForCausalLM.from_pretrained(folder / "draft").to(device).eval()
    rows: list[dict[str, Any]] = []
    for batch in args.batch:
        prompt = _ids(TEXT[:32])[None].repeat(batch, 1).to(device)
        zoo_runs = _zoo_runs(target, draft, prompt, args)
        plain = zoo_runs["zoo greedy"]()
        acceptance = {}
        for name, run in list(zoo_runs.items())[1:]:
            counter = Counter(target, prompt.shape[1])
            out = run()
            del target.all_token_logits  # the class's method again
            if not torch.equal(out, plain):
                raise SystemExit(f"{name}: not plain greedy's tokens")
            # every verification forward feeds 1 known token (after the prefill: the prompt) + its drafts
            # each forward yields its accepted drafts + 1: accepted = new tokens - forwards
            accepted = args.new_tokens - counter.calls
            acceptance[name] = accepted / counter.drafted if counter.drafted else float("nan")
        runs: dict[str, Any] = dict(zoo_runs)
        if args.engine:
            engine_runs, engine_accept = _engine_runs(target, draft, prompt, args, plain)
            runs |= engine_runs
            acceptance |= engine_accept
        if hf is not None:
            runs |= _hf_runs(hf, hf_draft, prompt, args)
        if hf is not None:  # the same weights give the same greedy tokens
            hf_out = hf.generate(
                prompt, max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, do_sample=False
            )
            same = torch.equal(hf_out, plain)
            print(
                f"batch {batch}: transformers' greedy tokens {'equal' if same else 'differ from'} zoo's",
                flush=True,
            )
        with torch.inference_mode():
            timings = alternate(runs, device=device, warmup=1, repeats=args.repeats)
        for name, timing in timings.items():
            library = " ".join(name.split()[:2]) if name.startswith("zoo engine") else name.split()[0]
            rate, slow, fast = timing.rate(args.new_tokens * batch)
            rows.append(
                {
                    "contender": name,
                    "batch": batch,
                    "tokens_per_s": rate,
                    "range": [slow, fast],
                    "seconds": timing.median,
                    "vs_greedy": timing.median / timings[f"{library} greedy"].median,
                    "acceptance": acceptance.get(name),
                }
            )
            print(_line(rows[-1]), flush=True)
    for engine in _ENGINES:
        engine.close()
    record = {
        "load": os.getloadavg(),
        "threads": torch.get_num_threads(),
        "machine": report.machine(device),
        "losses": losses,
        "new_tokens": args.new_tokens,
        "rows": rows,
    }
    out = report.output_dir(args)
    out.mkdir(parents=True, exist_ok=True)
    (out / "speculative.json").write_text(json.dumps(record, indent=2) + "\n")
    lines = [
        "| contender | batch | tokens/s | wall time vs its greedy | acceptance |",
        "|---|---:|---:|---:|---:|",
    ]
    lines += [_line(row) for row in rows]
    (out / "speculative.md").write_text("\n".join(lines) + "\n")
    return 0


def _trained(args: argparse.Namespace) -> int:
    """The trained pair's bench (`bench.speculative_trained`), written as speculative-trained-{N}t.*."""
    from bench import speculative_trained

    if args.engine:
        raise SystemExit("--engine runs on the fitted pair only (not with --target)")
    record = speculative_trained.run_trained(args)
    record["machine"] = report.machine(args.device)
    out = report.output_dir(args)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"speculative-trained-{record['threads']}t"
    (out / f"{stem}.json").write_text(json.dumps(record, indent=2) + "\n")
    lines = speculative_trained.HEADER + [speculative_trained.line(row) for row in record["rows"]]
    (out / f"{stem}.md").write_text("\n".join(lines) + "\n")
    return 0


def _zoo_runs(target: Any, draft: Any, prompt: torch.Tensor, args: argparse.Namespace) -> dict[str, Any]:
    common = {"max_new_tokens": args.new_tokens, "eos_token_id": []}
    return {
        "zoo greedy": lambda: target.generate(prompt, **common),
        "zoo assistant": lambda: target.generate(prompt, assistant_model=draft, **common),
        "zoo assistant heuristic": lambda: target.generate(
            prompt, assistant_model=draft, num_assistant_tokens_schedule="heuristic", **common
        ),
        f"zoo prompt lookup {args.lookup}": lambda: target.generate(
            prompt, prompt_lookup_num_tokens=args.lookup, **common
        ),
    }


_ENGINES: list[Any] = []  # closed at the end of `main`


class _Bytes:
    """The engine's tokenizer stand-in: token t is byte t - 3."""

    eos_id = None

    def decode(self, ids: list[int], *, skip_special_tokens: bool = True) -> str:
        return bytes(max(i - OFFSET, 0) for i in ids).decode("utf-8", errors="replace")


def _engine_runs(
    target: Any, draft: Any, prompt: torch.Tensor, args: argparse.Namespace, plain: torch.Tensor
) -> tuple[dict[str, Any], dict[str, float]]:
    """The serving engine serving ``batch`` requests of the prompt at once: plain, prompt lookup, draft;
    each checked once against plain greedy's tokens -> (runs, acceptance by name)."""
    import threading

    from zoo.serving import Completion, Done, Engine, Speculation

    batch = prompt.shape[0]
    ids = prompt[0].tolist()
    engines = {
        "zoo engine greedy": None,
        f"zoo engine prompt lookup {args.lookup}": Speculation(lookup=True, tokens=args.lookup),
        f"zoo engine draft {args.lookup}": Speculation(draft=draft, tokens=args.lookup),
    }
    runs, acceptance = {}, {}
    for name, speculation in engines.items():
        engine = Engine(
            target, _Bytes(), max_batch=batch, prefix_cache_bytes=0, speculative=speculation
        ).start()
        _ENGINES.append(engine)
        rows = batch

        def run(engine: Engine = engine, rows: int = rows) -> list[tuple[int, ...]]:
            use_decoding_layout(target, rows=rows)  # as the engine set it (generate's runs change it)
            done: list[tuple[int, ...]] = []
            finished = threading.Event()

            def emit(event: object) -> None:
                if isinstance(event, Done):
                    done.append(event.token_ids)
                    if len(done) == batch:
                        finished.set()

            engine.submit(
                [Completion(prompt=ids, max_tokens=args.new_tokens, emit=emit) for _ in range(batch)]
            )
            finished.wait()
            return done

        out = run()
        if any(list(tokens) != plain[0, len(ids) :].tolist() for tokens in out):
            raise SystemExit(f"{name}: not plain greedy's tokens")
        step = engine.speculative
        if step is not None:
            acceptance[name] = step.taken / step.proposed if step.proposed else float("nan")
        runs[name] = run
    return runs, acceptance


def _hf_runs(hf: Any, hf_draft: Any, prompt: torch.Tensor, args: argparse.Namespace) -> dict[str, Any]:
    common = {"max_new_tokens": args.new_tokens, "min_new_tokens": args.new_tokens, "do_sample": False}
    runs = {"hf greedy": lambda: hf.generate(prompt, **common)}
    if prompt.shape[0] == 1:  # transformers' assisted generation and prompt lookup take one row only
        runs["hf assistant"] = lambda: hf.generate(prompt, assistant_model=hf_draft, **common)
        runs[f"hf prompt lookup {args.lookup}"] = lambda: hf.generate(
            prompt, prompt_lookup_num_tokens=args.lookup, **common
        )
    return runs


def _line(row: dict[str, Any]) -> str:
    accept = f"{row['acceptance']:.0%}" if row["acceptance"] is not None else ""
    return f"| {row['contender']} | {row['batch']} | {row['tokens_per_s']:,.1f} | {row['vs_greedy']:.2f}x | {accept} |"


if __name__ == "__main__":
    raise SystemExit(main())
