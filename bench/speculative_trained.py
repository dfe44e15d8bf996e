"""Speculative decoding on a trained pair: the README's GPT and a 1-layer draft trained the same way.

    zoo train examples/gpt.yaml --output-dir runs/spec/gpt                                       # target
    zoo train examples/gpt.yaml --output-dir runs/spec/draft --set model.overrides.num_layers=1  # draft
    python -m bench.speculative --target runs/spec/gpt --draft runs/spec/draft --batch 1 8

Both models see the same data, tokenizer (BPE, trained on the same text the same way: the bench checks the
two tokenizer.json files agree), schedule and steps; the draft differs only in its layer count. Two
workloads over the first ``--prompts`` validation sentences, each generated greedily until eos (at most
``--new-tokens``), ``batch`` sentences at a time (left-padded):

- **sentences**: the sentence's first ``--prompt-tokens`` tokens; the model writes the rest (what it was
  trained to do, so the draft's acceptance is what a smaller model of the same data gives);
- **copy**: the whole sentence, eos, then its first tokens again (a "repeat this" framing: the continuation
  can be looked up in the prompt, the case prompt lookup is for).

Contenders: zoo's plain greedy, ``assistant_model=`` (transformers' default 20 tokens a round, constant;
the heuristic schedule; and ``--assistant-tokens``, default 4, a length that suits short outputs) and
``prompt_lookup_num_tokens=``, each checked to return plain greedy's tokens; transformers' greedy, assisted
generation (its defaults: 20, and ``--assistant-tokens``; it also stops a draft at eos and below its
``assistant_confidence_threshold``, 0.4) and prompt lookup on the same weights (`zoo.to_hf`; the last two
take one row only). Tokens/s counts each row's tokens up to and including its eos. Acceptance: drafted
tokens kept / drafted tokens, counted at the target's verification forwards (in a batch, a round keeps the
rows' shortest acceptance); "from drafts": kept drafts / generated steps (the share of the output that came
without a forward of its own).
"""

from __future__ import annotations

import argparse
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import zoo
from bench.timing import alternate

VALID = Path(__file__).resolve().parents[1] / "examples" / "data" / "english.valid.txt"


def _left_pad(rows: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of ids -> (ids, attention_mask), both (B, T), padded on the left."""
    width = max(len(row) for row in rows)
    ids = torch.tensor([[pad] * (width - len(row)) + row for row in rows])
    mask = torch.tensor([[0] * (width - len(row)) + [1] * len(row) for row in rows])
    return ids, mask


def workloads(tokenizer: Any, count: int, prompt_tokens: int) -> dict[str, list[list[int]]]:
    """The prompts (lists of ids) of each workload, from the first ``count`` validation sentences."""
    bos, eos = tokenizer.bos_id, tokenizer.eos_id
    sentences = [line for line in VALID.read_text().splitlines() if line.strip()][:count]
    ids = tokenizer.encode_ids(sentences)
    return {
        "sentences": [[bos, *row[:prompt_tokens]] for row in ids],
        "copy": [[bos, *row, eos, bos, *row[:prompt_tokens]] for row in ids],
    }


class Counter:
    """Counts the target's verification forwards and drafted tokens over several `generate` calls (wraps
    ``all_token_logits``): each forward feeds the token not yet cached (the first of a call: the whole
    prompt, ``prompt_length`` wide, set before each call) and its drafts."""

    def __init__(self, model: zoo.ZooModel) -> None:
        self.calls = self.drafted = 0
        self.prompt_length = 0  # the next forward is a call's first
        inner = model.all_token_logits

        def counted(ids: torch.Tensor, *rest: Any) -> torch.Tensor:
            self.drafted += ids.shape[1] - (self.prompt_length or 1)
            self.prompt_length = 0
            self.calls += 1
            return inner(ids, *rest)

        model.all_token_logits = counted  # type: ignore[method-assign]


def _new_lengths(out: torch.Tensor, prompt_width: int, eos: int) -> list[int]:
    """Each row's new tokens up to and including its first eos."""
    lengths = []
    for row in out[:, prompt_width:].tolist():
        lengths.append(row.index(eos) + 1 if eos in row else len(row))
    return lengths


def run_trained(args: argparse.Namespace) -> dict[str, Any]:
    """The trained-pair bench (``--target`` / ``--draft``): returns the record the caller writes."""
    device = args.device
    target = zoo.load(args.target, device=device).eval()
    draft = zoo.load(args.draft, device=device).eval()
    tokenizer = zoo.load_tokenizer(args.target)
    if (args.target / "tokenizer.json").read_text() != (args.draft / "tokenizer.json").read_text():
        raise SystemExit(f"{args.draft}/tokenizer.json differs from {args.target}'s: not the same tokenizer")
    eos, pad = tokenizer.eos_id, tokenizer.pad_id
    hf = hf_draft = None
    if not args.no_hf:
        import transformers

        folder = Path(tempfile.mkdtemp())
        zoo.to_hf(target, folder / "target")
        zoo.to_hf(draft, folder / "draft")
        hf = transformers.AutoModelForCausalLM.from_pretrained(folder / "target").to(device).eval()
        hf_draft = transformers.AutoModelForCausalLM.from_pretrained(folder / "draft").to(device).eval()
        hf_short = transformers.AutoModelForCausalLM.from_pretrained(folder / "draft").to(device).eval()
        hf_short.generation_config.num_assistant_tokens = args.assistant_tokens
    rows: list[dict[str, Any]] = []
    for workload, prompts in workloads(tokenizer, args.prompts, args.prompt_tokens).items():
        for batch in args.batch:
            groups = [
                tuple(t.to(device) for t in _left_pad(prompts[i : i + batch], pad))
                for i in range(0, len(prompts), batch)
            ]
            zoo_runs = _zoo_runs(target, draft, groups, args, eos)
            plain = zoo_runs["zoo greedy"]()
            tokens = sum(sum(_new_lengths(out, ids.shape[1], eos)) for out, (ids, _) in zip(plain, groups))
            acceptance: dict[str, tuple[float, float]] = {}
            for name, run in list(zoo_runs.items())[1:]:
                counter = Counter(target)
                outs = []
                for group, call in zip(groups, run.calls):  # type: ignore[attr-defined]
                    counter.prompt_length = group[0].shape[1]
                    outs.append(call())
                del target.all_token_logits  # the class's method again
                if any(not torch.equal(a, b) for a, b in zip(outs, plain)):
                    raise SystemExit(f"{workload}, batch {batch}, {name}: not plain greedy's tokens")
                # each forward yields its kept drafts + 1 token: kept drafts = steps - forwards
                steps = sum(max(_new_lengths(out, g[0].shape[1], eos)) for out, g in zip(plain, groups))
                kept = steps - counter.calls
                acceptance[name] = (kept / counter.drafted if counter.drafted else float("nan"), kept / steps)
            runs: dict[str, Callable[[], Any]] = dict(zoo_runs)
            if hf is not None:
                hf_runs = _hf_runs(hf, (hf_draft, hf_short), groups, args, eos, pad)
                # the same weights give the same greedy tokens (transformers pads finished rows with pad too)
                same = all(torch.equal(a, b) for a, b in zip(hf_runs["hf greedy"](), plain))
                print(
                    f"{workload}, batch {batch}: transformers' greedy tokens {'equal' if same else 'differ from'} zoo's"
                )
                runs |= hf_runs
            with torch.inference_mode():
                timings = alternate(runs, device=device, warmup=1, repeats=args.repeats)
            for name, timing in timings.items():
                rate, slow, fast = timing.rate(tokens)
                rows.append(
                    {
                        "workload": workload,
                        "contender": name,
                        "batch": batch,
                        "tokens": tokens,
                        "tokens_per_s": rate,
                        "range": [slow, fast],
                        "seconds": timing.median,
                        "vs_greedy": timing.median / timings[f"{name.split()[0]} greedy"].median,
                        "acceptance": acceptance.get(name, (None, None))[0],
                        "from_drafts": acceptance.get(name, (None, None))[1],
                    }
                )
                print(line(rows[-1]), flush=True)
    return {
        "pair": {"target": str(args.target), "draft": str(args.draft)},
        "parameters": {"target": target.num_parameters(), "draft": draft.num_parameters()},
        "load": os.getloadavg(),
        "threads": torch.get_num_threads(),
        "prompts": args.prompts,
        "max_new_tokens": args.new_tokens,
        "rows": rows,
    }


class _Run:
    """A contender: one `generate` call per group of prompts; ``calls`` are the single calls."""

    def __init__(self, calls: list[Callable[[], torch.Tensor]]) -> None:
        self.calls = calls

    def __call__(self) -> list[torch.Tensor]:
        return [call() for call in self.calls]


def _zoo_runs(
    target: Any, draft: Any, groups: list[Any], args: argparse.Namespace, eos: int
) -> dict[str, _Run]:
    def calls(**kwargs: Any) -> _Run:
        common = {"max_new_tokens": args.new_tokens, "eos_token_id": eos} | kwargs
        return _Run([lambda ids=ids, mask=mask: target.generate(ids, mask, **common) for ids, mask in groups])

    return {
        "zoo greedy": calls(),
        "zoo assistant": calls(assistant_model=draft),
        "zoo assistant heuristic": calls(assistant_model=draft, num_assistant_tokens_schedule="heuristic"),
        f"zoo assistant {args.assistant_tokens}": calls(
            assistant_model=draft, num_assistant_tokens=args.assistant_tokens
        ),
        f"zoo prompt lookup {args.lookup}": calls(prompt_lookup_num_tokens=args.lookup),
    }


def _hf_runs(
    hf: Any, drafts: tuple[Any, Any], groups: list[Any], args: argparse.Namespace, eos: int, pad: int
) -> dict[str, _Run]:
    def calls(**kwargs: Any) -> _Run:
        common = {
            "max_new_tokens": args.new_tokens,
            "do_sample": False,
            "eos_token_id": eos,
            "pad_token_id": pad,
        }
        return _Run(
            [
                lambda ids=ids, mask=mask: hf.generate(ids, attention_mask=mask, **common, **kwargs)
                for ids, mask in groups
            ]
        )

    runs = {"hf greedy": calls()}
    if groups[0][0].shape[0] == 1:  # transformers' assisted generation and prompt lookup take one row only
        runs["hf assistant"] = calls(assistant_model=drafts[0])
        runs[f"hf assistant {args.assistant_tokens}"] = calls(assistant_model=drafts[1])
        runs[f"hf prompt lookup {args.lookup}"] = calls(prompt_lookup_num_tokens=args.lookup)
    return runs


def line(row: dict[str, Any]) -> str:
    accept = f"{row['acceptance']:.0%}" if row["acceptance"] is not None else ""
    share = f"{row['from_drafts']:.0%}" if row["from_drafts"] is not None else ""
    return (
        f"| {row['workload']} | {row['contender']} | {row['batch']} | {row['tokens_per_s']:,.1f} "
        f"| {row['vs_greedy']:.2f}x | {accept} | {share} |"
    )


HEADER = [
    "| workload | contender | batch | tokens/s | wall time vs its greedy | acceptance | from drafts |",
    "|---|---|---:|---:|---:|---:|---:|",
]
