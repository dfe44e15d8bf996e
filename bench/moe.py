"""The Mixture-of-Experts FFN on the CPU: zoo's block against transformers' Mixtral and Qwen3-MoE sparse blocks
on the same weights and tokens, and against a dense SwiGLU FFN with the same active parameters.

    python -m bench.moe                 # about 1-2 minutes on 2 cores
    python -m bench.moe --tiny          # seconds: the test's shape

Shape: d_model 512, 8 experts of width 1024, top-2, 2,048 tokens (a (4, 512) batch), float32. Each pair of
contenders computes the same function on the same weights (checked to 1e-4 before timing): ``zoo`` with top-k
renormalised against transformers' ``MixtralSparseMoeBlock``, ``zoo`` without against ``Qwen3MoeSparseMoeBlock``
(``norm_topk_prob: false``), each transformers block with its default experts implementation (``grouped_mm``
where torch has it), and Mixtral's also with its ``eager`` one (a loop over the experts that hit, the
transformers 4 way). ``dense`` is a SwiGLU FFN of width top_k × 1024: the FLOPs one token's experts cost
without any routing, the floor the dispatch overhead is measured from. Forward (no gradients) and forward +
backward (the input's and every weight's gradient) are timed alternately in one process
(`bench.timing.alternate`). Writes moe.json and moe.md to bench/results/local/ (ignored by git), or --out
DIR; --update writes the tracked bench/results/.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

if __package__ in (None, ""):  # `python bench/moe.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import report
from bench.timing import alternate

SHAPES = {  # name -> (d_model, experts, top_k, d_ff, batch, length)
    "default": (512, 8, 2, 1024, 4, 512),
    "tiny": (32, 4, 2, 16, 2, 8),
}
TOLERANCE = 1e-4


def contenders(shape: tuple[int, ...]) -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
    """name -> module taking (B, T, C) to (B, T, C); the zoo / transformers pairs share their weights."""
    import transformers
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    from zoo.blocks import FeedForward
    from zoo.blocks.moe import MoEFeedForward
    from zoo.spec import FFNSpec, MoESpec

    C, E, k, F, _, _ = shape
    sizes = dict(hidden_size=C, num_experts_per_tok=k, hidden_act="silu")
    mixtral = transformers.MixtralConfig(intermediate_size=F, num_local_experts=E, **sizes)
    qwen3 = transformers.Qwen3MoeConfig(moe_intermediate_size=F, num_experts=E, norm_topk_prob=False, **sizes)
    blocks: dict[str, torch.nn.Module] = {}
    for name, config, block_class, normalize in (
        ("mixtral", mixtral, MixtralSparseMoeBlock, True),
        ("qwen3_moe", qwen3, Qwen3MoeSparseMoeBlock, False),
    ):
        config._experts_implementation = _default_experts_implementation()
        torch.manual_seed(0)
        ours = MoEFeedForward(MoESpec(num_experts=E, top_k=k, d_ff=F, normalize_top_k=normalize), d_model=C)
        ours.router.weight.data.normal_(0.0, 0.02)
        ours.init_weights(std=0.02)
        theirs = block_class(config)
        with torch.no_grad():
            theirs.gate.weight.copy_(ours.router.weight)
            theirs.experts.gate_up_proj.copy_(ours.experts.up_proj.weight)  # (E, 2F, C): gate rows, then up
            theirs.experts.down_proj.copy_(ours.experts.down_proj.weight)  # (E, C, F)
        blocks[f"zoo ({name})"], blocks[f"hf {name}"] = ours, theirs
        if name == "mixtral":
            eager_config = copy.deepcopy(config)
            eager_config._experts_implementation = "eager"
            eager = block_class(eager_config)
            eager.load_state_dict(theirs.state_dict())
            blocks["hf mixtral (eager)"] = eager
    dense = FeedForward(FFNSpec(d_ff=k * F, activation="silu", gated=True, bias=False), d_model=C)
    runs: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
        name: (lambda x, block=block: block(x)[0]) if name.startswith("zoo") else block
        for name, block in blocks.items()
    }
    runs["dense SwiGLU (same active parameters)"] = dense
    return runs


def _default_experts_implementation() -> str:
    """What transformers 5 picks for a model built without ``experts_implementation``: grouped_mm when
    torch has it (`PreTrainedModel.get_correct_experts_implementation`), else its eager loop."""
    return (
        "grouped_mm"
        if hasattr(torch, "_grouped_mm") or hasattr(torch.nn.functional, "grouped_mm")
        else "eager"
    )


def check_same_function(
    runs: dict[str, Callable[[torch.Tensor], torch.Tensor]], x: torch.Tensor
) -> dict[str, float]:
    """Max |zoo - transformers| of each pair on ``x``; raises if one exceeds `TOLERANCE`."""
    differences = {}
    with torch.no_grad():
        for name in ("mixtral", "qwen3_moe"):
            ours = runs[f"zoo ({name})"](x)
            for contender in [c for c in runs if c.startswith(f"hf {name}")]:
                differences[contender] = float((ours - runs[contender](x)).abs().max())
    for contender, difference in differences.items():
        if difference > TOLERANCE:
            raise AssertionError(f"zoo and {contender} differ by {difference:.2e}")
    return differences


def timed(
    runs: dict[str, Callable[[torch.Tensor], torch.Tensor]], x: torch.Tensor, *, repeats: int
) -> dict[str, dict[str, Any]]:
    """{"forward" | "forward+backward": {contender: Timing}}."""

    def forward(run: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[], object]:
        def call() -> None:
            with torch.no_grad():
                run(x)

        return call

    def backward(run: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[], object]:
        def call() -> None:
            inputs = x.detach().requires_grad_()
            run(inputs).square().mean().backward()

        return call

    return {
        "forward": alternate(
            {n: forward(r) for n, r in runs.items()}, device="cpu", warmup=1, repeats=repeats
        ),
        "forward+backward": alternate(
            {n: backward(r) for n, r in runs.items()}, device="cpu", warmup=1, repeats=repeats
        ),
    }


def run(shape_name: str, *, repeats: int) -> dict[str, Any]:
    shape = SHAPES[shape_name]
    C, E, k, F, B, T = shape
    runs = contenders(shape)
    x = torch.randn(B, T, C, generator=torch.Generator().manual_seed(1))
    record: dict[str, Any] = {
        "machine": report.machine("cpu"),
        "shape": dict(d_model=C, num_experts=E, top_k=k, d_ff=F, batch=B, length=T, tokens=B * T),
        "experts_implementation": _default_experts_implementation(),
        "max_difference": check_same_function(runs, x),
        "repeats": repeats,
        "results": [],
    }
    for mode, timings in timed(runs, x, repeats=repeats).items():
        for name, timing in timings.items():
            rate, slowest, fastest = timing.rate(B * T)
            record["results"].append(
                {"mode": mode, "contender": name, "rate": rate, "slowest": slowest, "fastest": fastest,
                 "median_s": timing.median}
            )  # fmt: skip
    return record


def markdown(record: dict[str, Any]) -> str:
    m, s = record["machine"], record["shape"]
    lines = [
        f"Measured on {m['cpu']} ({m['cores']} cores, {m['torch_threads']} torch threads), torch {m['torch']}, "
        f"transformers {m.get('transformers', '?')} (experts: {record['experts_implementation']}); d_model "
        f"{s['d_model']}, {s['num_experts']} experts × d_ff {s['d_ff']}, top-{s['top_k']}, {s['tokens']:,} tokens, "
        f"float32; median of {record['repeats']} alternating repetitions, (slowest–fastest) in brackets. "
        f"zoo equals transformers to {max(record['max_difference'].values()):.0e}.",
        "",
        "| mode | contender | tokens/s | zoo ÷ this (same router) | vs dense floor |",
        "|---|---|---:|---:|---:|",
    ]
    for mode in ("forward", "forward+backward"):
        rows = {r["contender"]: r for r in record["results"] if r["mode"] == mode}
        floor = next(r for name, r in rows.items() if name.startswith("dense"))
        for name, row in rows.items():
            pair = name.removeprefix("hf ").split(" ")[0] if name.startswith("hf ") else None
            ratio = f"{rows[f'zoo ({pair})']['rate'] / row['rate']:.2f}x" if pair else ""
            lines.append(
                f"| {mode} | {name} | {row['rate']:,.0f} ({row['slowest']:,.0f}–{row['fastest']:,.0f}) | {ratio} | "
                f"{row['rate'] / floor['rate']:.2f}x |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.moe", description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tiny", action="store_true", help="the test's tiny shape (seconds)")
    report.add_output_options(parser)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    record = run("tiny" if args.tiny else "default", repeats=args.repeats)
    record["elapsed_s"] = time.perf_counter() - started
    out = report.output_dir(args)
    out.mkdir(parents=True, exist_ok=True)
    (out / "moe.json").write_text(json.dumps(record, indent=2) + "\n")
    (out / "moe.md").write_text(markdown(record))
    print(f"{markdown(record)}\nwrote {out}/moe.json and moe.md in {record['elapsed_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
