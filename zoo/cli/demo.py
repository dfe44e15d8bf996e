"""``zoo demo``: the main job on its embedded defaults.

Trains the canonical Transformer (``transformer-tiny``, see `zoo.demo.config`) as an English -> Korean
translator on the generated toy corpus: trains the tokenizer, trains the model with the paper's schedule
and label smoothing (on CUDA when available), reports held-out BLEU, translates a few sentences with
greedy and beam search, saves everything to ``runs/demo/`` and reloads it from disk to show that the saved
model gives the same translations.

Run again, it replaces its own previous run there (recognised by its config, `zoo.demo.config.is_demo_run`),
so ``make demo`` can be repeated; any other run, model or data in the output dir is refused unless
``--overwrite``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from zoo.cli.options import add_device_option


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "demo", help="the main job: train a small Transformer as an EN->KO translator and translate with it"
    )
    parser.add_argument("--output-dir", type=Path, default=Path("runs/demo"), help="default: runs/demo")
    parser.add_argument("--steps", type=int, default=300, help="optimizer steps (default: 300)")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads for PyTorch (default: 1)")
    add_device_option(parser)
    parser.add_argument("--beams", type=int, default=4, help="beam width for the beam-search column")
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace a run, model or data in the output dir that the demo did not write "
        "(its own previous run it replaces anyway)",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from rich.table import Table

    import zoo
    from zoo.cli import console
    from zoo.cli.sanitize import markup
    from zoo.cli.train import ProgressCallback, setup_logging
    from zoo.demo import corpus
    from zoo.demo.config import DEMO_MODEL, DEMO_SENTENCES, demo_config, is_demo_run, write_toy_data
    from zoo.io.names import DEMO_DATA_DIR
    from zoo.training import train, translate
    from zoo.training.bleu import bleu_signature
    from zoo.training.run.rundir import previous_run
    from zoo.training.task_settings import Seq2SeqSettings

    setup_logging()
    out: Path = args.output_dir
    found = previous_run(out)  # checked before the data is written: a foreign run is left as it was
    if found and not args.overwrite and not is_demo_run(out):
        raise FileExistsError(
            f"{out} holds {', '.join(found)}, which the demo did not write: choose another --output-dir, "
            "or replace them (--overwrite)"
        )
    train_path, valid_path = write_toy_data(out / DEMO_DATA_DIR, overwrite=args.overwrite)
    config = demo_config(
        out,
        train=train_path,
        valid=valid_path,
        max_steps=args.steps,
        device=args.device,
        num_threads=args.threads,
    )
    console.print(
        "[bold]zoo demo[/]: the 2017 Transformer (transformer-tiny, dropout 0.1) learns English -> Korean "
        f"from {train_path} (toy corpus: 6,000 pairs, 300 held out)"
    )
    start = time.perf_counter()
    result = train(config, callbacks=[ProgressCallback(console)], overwrite=bool(found))
    minutes = (time.perf_counter() - start) / 60
    model, tokenizer = result.model, result.tokenizer
    preset = zoo.preset(DEMO_MODEL["preset"])
    published = zoo.build(preset, device="meta").num_parameters()
    console.print(
        f"{model.num_parameters():,} parameters: {DEMO_MODEL['preset']} with its vocabulary sized to the demo "
        f"tokenizer's {model.spec.vocab_size:,} BPE tokens (the preset's {preset.vocab_size:,}-token "
        f"vocabulary gives the {published:,} of the preset table)"
    )
    assert isinstance(config.task, Seq2SeqSettings)  # demo_config's task
    console.print(
        f"{result.step} steps in {minutes:.1f} min on {next(model.parameters()).device}; held-out BLEU "
        f"[bold]{result.final['val_bleu']:.1f}[/] (greedy decoding of the held-out split; BLEU signature "
        f"{bleu_signature(config.task.bleu_metric)})"
    )

    sentences = list(DEMO_SENTENCES)
    kwargs = dict(source_tokenizer=tokenizer, target_tokenizer=tokenizer)
    greedy = translate(model, sentences, **kwargs)
    beam = translate(model, sentences, num_beams=args.beams, **kwargs)
    table = Table(title="translations")
    for column in ("English", "greedy", f"beam ({args.beams})", "reference"):
        table.add_column(column, overflow="fold")
    for row in zip(sentences, greedy, beam, map(corpus.translate, sentences)):
        table.add_row(*row)
    console.print(table)

    reloaded = zoo.load(result.output_dir, device=next(model.parameters()).device)
    reloaded_tokenizer = zoo.load_tokenizer(result.output_dir)
    again = translate(
        reloaded, sentences, source_tokenizer=reloaded_tokenizer, target_tokenizer=reloaded_tokenizer
    )
    if again != greedy:
        console.print(
            f"[bold red]reloaded model from {markup(result.output_dir)} translates differently:[/] "
            f"{markup(again)}"
        )
        return 1
    console.print(f"saved to [bold]{markup(result.output_dir)}[/]; reloaded from disk: same translations")
    return 0
