"""Weight-only quantisation on the CPU: greedy decoding with int8 / int4 weights against float, zoo against
transformers on the same weights and the same torchao configs.

    python -m bench.quant                                  # OPT-125m shape, batch 1 and 4: a few minutes
    python -m bench.quant --threads 1 --compile            # + zoo's compiled decode step (the README's table)
    python -m bench.quant --layers 4 --new-tokens 16 --batches 1 --repeats 2      # a quick look

The model is the ``opt-125m`` preset with random weights (seed 0; the speed of a matmul does not depend on
what the weights say). transformers gets the very same weights: `zoo.to_hf`, then
``AutoModelForCausalLM.from_pretrained`` (OPTForCausalLM). Each format is made the same way for both:
cast to the activation dtype, then torchao's ``quantize_`` on the decoder layers' Linear matrices (zoo
through `zoo.quant.quantize`; transformers with a filter choosing the same matrices: the LM head is tied
to the embeddings in OPT and stays float in both). Every contender generates exactly ``--new-tokens``
tokens (eos blocked) after a ``--prompt``-token prompt, with the KV cache, eager, alternating in one process
(`bench.timing.alternate`). Weight bytes: the model's parameters as held in memory (a quantised matrix
counts its integers and scales). Writes quant.json and quant.md to bench/results/local/ (ignored by git), or
--out DIR; --update writes the tracked bench/results/.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

if __package__ in (None, ""):  # `python bench/quant.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import report
from bench.timing import alternate

# format -> (activation dtype, weights): the rows, in order; each is run by zoo and by transformers
FORMATS: dict[str, tuple[torch.dtype, str | None]] = {
    "float32": (torch.float32, None),
    "bfloat16": (torch.bfloat16, None),
    "int8, float32 activations": (torch.float32, "int8"),
    "int8, bfloat16 activations": (torch.bfloat16, "int8"),
    "int4 (groups of 32), bfloat16 activations": (torch.bfloat16, "int4"),
}
BASELINE = "bfloat16"  # what the quantised rows are compared with


def build_zoo(layers: int | None) -> Any:
    import zoo

    spec = zoo.preset("opt-125m", **({"num_layers": layers} if layers else {}))
    torch.manual_seed(0)
    return zoo.build(spec).eval()


def zoo_format(model: Any, fmt: str) -> Any:
    from zoo.quant import quantize

    dtype, weights = FORMATS[fmt]
    made = copy.deepcopy(model).to(dtype)
    return quantize(made, weights) if weights else made  # type: ignore[arg-type]


def hf_format(folder: Path, fmt: str) -> nn.Module:
    """transformers' OPT from ``folder`` in the format's dtype, quantised with the config zoo uses."""
    import transformers

    from zoo.quant.library import import_torchao
    from zoo.quant.schemes import SCHEMES

    dtype, weights = FORMATS[fmt]
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).eval()
    if weights:
        scheme = SCHEMES[weights]
        config = scheme.config(scheme.group_size(None))

        def decoder_matrix(module: nn.Module, fqn: str) -> bool:  # the same matrices zoo quantises
            return isinstance(module, nn.Linear) and ".layers." in fqn

        import_torchao().quantize_(model, config, filter_fn=decoder_matrix)
    return model


def weight_bytes(model: nn.Module) -> int:
    """Bytes of the parameters as held: a torchao tensor counts its integer data and scales."""
    total = 0
    for parameter in model.parameters():  # each shared (tied) parameter once
        parts = [getattr(parameter, n) for n in getattr(type(parameter), "tensor_data_names", [])]
        for tensor in parts or [parameter]:
            total += tensor.numel() * tensor.element_size()
    return total


def generate_fn(model: Any, contender: str, ids: torch.Tensor, new_tokens: int) -> Callable[[], object]:
    mask = torch.ones_like(ids)
    if contender in ("zoo", "zoo-compiled"):
        compile = contender == "zoo-compiled"
        return lambda: model.generate(
            ids, attention_mask=mask, max_new_tokens=new_tokens, min_new_tokens=new_tokens, compile=compile
        )
    kwargs = dict(
        do_sample=False, num_beams=1, max_new_tokens=new_tokens, min_new_tokens=new_tokens, pad_token_id=1
    )
    return lambda: model.generate(ids, attention_mask=mask, **kwargs)


def markdown(record: dict[str, Any]) -> str:
    m = record["machine"]
    lines = [
        f"Measured on {m['cpu']} ({m['cores']} cores, {m['torch_threads']} torch threads), torch {m['torch']}, "
        f"transformers {m.get('transformers', '?')}, torchao {record['torchao']}; {record['model']}; "
        f"prompt {record['prompt']}, {record['new_tokens']} new tokens, greedy, KV cache, eager; median of "
        f"{record['repeats']} alternating repetitions, (slowest–fastest) in brackets.",
        "",
        "| batch | weights | zoo tokens/s | vs zoo bf16 | transformers tokens/s | zoo / transformers | "
        "zoo compiled tokens/s | weight bytes |",
        "|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in record["results"]:
        zoo_rate, hf_rate = row["zoo"], row.get("hf")
        base = next(r for r in record["results"] if r["batch"] == row["batch"] and r["format"] == BASELINE)
        hf = f"{_rate(hf_rate)}" if hf_rate else "–"
        ratio = f"{zoo_rate['rate'] / hf_rate['rate']:.2f}x" if hf_rate else "–"
        compiled = _rate(row["zoo-compiled"]) if "zoo-compiled" in row else "–"
        lines.append(
            f"| {row['batch']} | {row['format']} | {_rate(zoo_rate)} | {zoo_rate['rate'] / base['zoo']['rate']:.2f}x | "
            f"{hf} | {ratio} | {compiled} | {row['weight_bytes'] / 2**20:,.0f} MiB |"
        )
    return "\n".join(lines) + "\n"


def _rate(timing: dict[str, float]) -> str:
    return f"{timing['rate']:,.1f} ({timing['slowest']:,.1f}–{timing['fastest']:,.1f})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.quant", description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=None, help="decoder layers (default: the preset's 12)")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 4], help="batch sizes (default 1 4)")
    parser.add_argument("--prompt", type=int, default=32, help="prompt tokens (default 32)")
    parser.add_argument("--new-tokens", type=int, default=16, help="tokens generated per run (default 16)")
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads (default: torch's; 1 is steadier on a shared machine)",
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--formats", nargs="+", choices=list(FORMATS), default=list(FORMATS), metavar="FORMAT"
    )
    parser.add_argument("--no-hf", action="store_true", help="zoo only (no transformers)")
    parser.add_argument(
        "--compile",
        action="store_true",
        help="also zoo's compiled decode step (generate(compile=True); compile time is warm-up, ~20-60 s a row)",
    )
    report.add_output_options(parser)
    args = parser.parse_args(argv)
    if BASELINE not in args.formats:
        args.formats.insert(0, BASELINE)
    started = time.perf_counter()
    if args.threads:
        torch.set_num_threads(args.threads)

    import zoo
    from zoo.quant.library import torchao_version

    if not args.no_hf:
        import transformers

        transformers.utils.logging.disable_progress_bar()  # "Loading weights" bars, one per model

    base = build_zoo(args.layers)
    models: dict[tuple[str, str], nn.Module] = {}
    with tempfile.TemporaryDirectory() as folder:
        if not args.no_hf:
            zoo.to_hf(base, folder)
        for fmt in args.formats:
            models[("zoo", fmt)] = zoo_format(base, fmt)
            if args.compile:
                models[("zoo-compiled", fmt)] = models[("zoo", fmt)]
            if not args.no_hf:
                models[("hf", fmt)] = hf_format(Path(folder), fmt)
    record: dict[str, Any] = {
        "machine": report.machine("cpu"),
        "torchao": torchao_version(),
        "model": f"opt-125m shape, {base.spec.num_layers} layers, random weights ({base.num_parameters():,} parameters)",
        "prompt": args.prompt,
        "new_tokens": args.new_tokens,
        "repeats": args.repeats,
        "results": [],
    }
    vocab = base.spec.vocab_size
    del base
    for batch in args.batches:
        ids = torch.randint(3, vocab, (batch, args.prompt), generator=torch.Generator().manual_seed(1))
        runs = {
            f"{who}|{fmt}": generate_fn(model, who, ids, args.new_tokens)
            for (who, fmt), model in models.items()
        }
        with torch.no_grad():
            timings = alternate(runs, device="cpu", warmup=1, repeats=args.repeats)
        for fmt in args.formats:
            row: dict[str, Any] = {
                "batch": batch,
                "format": fmt,
                "weight_bytes": weight_bytes(models[("zoo", fmt)]),
            }
            for who in ("zoo", "hf", "zoo-compiled"):
                if (who, fmt) not in models:
                    continue
                timing = timings[f"{who}|{fmt}"]
                rate, slowest, fastest = timing.rate(batch * args.new_tokens)
                row[who] = {"rate": rate, "slowest": slowest, "fastest": fastest, "median_s": timing.median}
            record["results"].append(row)
            hf_rate = f"hf {row['hf']['rate']:7.1f}/s" if "hf" in row else ""
            print(f"batch {batch}  {fmt:45s} zoo {row['zoo']['rate']:7.1f}/s  {hf_rate}", flush=True)
    record["elapsed_s"] = time.perf_counter() - started
    out = report.output_dir(args)
    out.mkdir(parents=True, exist_ok=True)
    (out / "quant.json").write_text(json.dumps(record, indent=2) + "\n")
    (out / "quant.md").write_text(markdown(record))
    print(f"\n{markdown(record)}\nwrote {out}/quant.json and quant.md in {record['elapsed_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
