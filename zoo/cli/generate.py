"""``zoo generate`` and ``zoo translate``: text from a saved model and its tokenizer, streamed as it comes.

    zoo generate runs/gpt/ --prompt "Once upon a time" --max-new-tokens 40 --sample --top-p 0.9 --seed 0
    zoo translate runs/ko-en/ "안녕하세요" --beams 4 --num-return-sequences 3
    zoo translate runs/m2m/ "Hello" --forced-bos-token __de__ --decoder-prompt "Guten" --bad-words "Tag"
    zoo translate runs/ko-en/ - < sentences.txt     # stdin, a sentence a line (`zoo.cli.translate_stdin`)

Both read a zoo checkpoint (``DIR/model.safetensors`` + spec, and ``DIR/tokenizer.json``, as written by
``zoo.save(model, DIR, tokenizer=...)``) or a Hugging Face folder with its ``tokenizer.json``, as ``zoo chat``
and ``zoo serve`` do (`zoo.load_pretrained`). Greedy search and sampling print each piece of text as soon as its token is
chosen; beam search prints the best hypothesis at the end. With ``--num-return-sequences N`` the N results
are printed at the end, one line each, numbered ``[1]`` to ``[N]`` (beam search: best first, with its
score). A summary (tokens, tokens/s) goes to stderr.

Everything is checked before the prompt is echoed: the settings, the prompt's length, and the weights
(NaN or inf in a weight would make every step's logits NaN: sampling would fail midway, greedy search would
print token 0 over and over). The text printed is `zoo.cli.sanitize.clean`: a tokenizer.json is a file like
any other, and its tokens could hold terminal escape sequences.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from zoo.cli.options import torch_dtype, utf8_text
from zoo.cli.sanitize import clean
from zoo.cli.search import nan_logits, new_tokens, search_options, search_settings, speculative_settings
from zoo.cli.translate_stdin import LINES_PER_BATCH

STDIN = "-"  # as a sentence: read stdin, a sentence a line (`zoo.cli.translate_stdin`)


def register(subparsers: argparse._SubParsersAction) -> None:
    generate = subparsers.add_parser(
        "generate",
        help="continue a prompt with a saved decoder model (tokens stream as they are chosen)",
        description="Continue a prompt with a saved decoder-only model and its tokenizer.",
    )
    generate.add_argument(
        "checkpoint", metavar="DIR", help="a zoo checkpoint or a Hugging Face folder, with tokenizer.json"
    )
    generate.add_argument("--prompt", required=True, type=utf8_text, help="the text to continue")
    generate.add_argument(
        "--no-bos", action="store_true", help="do not start the prompt with the bos token (default: add it)"
    )
    generate.add_argument(
        "--json-schema",
        metavar="FILE",
        default=None,
        help="structured output: the text is JSON this JSON Schema file validates (needs the grammar extra)",
    )
    search_options(generate, default_new_tokens=32)
    generate.set_defaults(run=run_generate)

    translate = subparsers.add_parser(
        "translate",
        help="translate a sentence (or stdin, a sentence a line) with a saved encoder-decoder model",
        description="Translate one sentence with a saved encoder-decoder model and its tokenizer; with - "
        "as the sentence, every line of stdin, one translation a line.",
    )
    translate.add_argument(
        "checkpoint", metavar="DIR", help="a zoo checkpoint or a Hugging Face folder, with tokenizer.json"
    )
    translate.add_argument(
        "sentence",
        type=utf8_text,
        help=f"the source sentence; - reads stdin, a sentence a line, {LINES_PER_BATCH} lines a batch",
    )
    translate.add_argument(
        "--decoder-prompt",
        type=utf8_text,
        default=None,
        metavar="TEXT",
        help="the beginning of the translation, to continue (the decoder start token is put in front)",
    )
    search_options(translate, default_new_tokens=None)
    translate.set_defaults(run=run_translate)


def run_generate(args: argparse.Namespace) -> int:
    schema = _json_schema(args.json_schema) if args.json_schema is not None else None
    model, tokenizer = _load(args, family="decoder", other="translate")
    add_bos = not args.no_bos and tokenizer.bos_id is not None
    prompt = tokenizer.encode(args.prompt, add_bos=add_bos, add_eos=False)
    if not prompt:
        raise ValueError("--prompt is empty after tokenization; give some text to continue")
    grammar = {} if schema is None else {"json_schema": schema, "tokenizer": tokenizer}
    return _run(model, tokenizer, prompt, args, echo=args.prompt, grammar=grammar)


def _json_schema(path: str) -> Any:
    """The JSON schema in file ``path``, checked by generate (`zoo.generation.constrain`)."""
    import json
    from pathlib import Path

    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as error:
        raise ValueError(f"--json-schema {path}: cannot read it ({error.strerror or error})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"--json-schema {path}: not a JSON file ({error})") from None


def run_translate(args: argparse.Namespace) -> int:
    if args.sentence != STDIN and not args.sentence.strip():
        raise ValueError(
            "the sentence is empty; give some text to translate (or -: one sentence a line of stdin)"
        )
    model, tokenizer = _load(args, family="encoder-decoder", other="generate")
    prefix = None
    if args.decoder_prompt is not None:
        prefix = tokenizer.encode(args.decoder_prompt, add_bos=False, add_eos=False)
        if not prefix:
            raise ValueError("--decoder-prompt is empty after tokenization; give some text to continue")
    if args.sentence == STDIN:
        from zoo.cli.translate_stdin import translate_lines

        return translate_lines(model, tokenizer, args, decoder_prompt=prefix)
    source = tokenizer.encode(args.sentence, add_eos=tokenizer.eos_id is not None)
    if args.max_new_tokens is None:  # as zoo.training's translate: room for a longer target, within limits
        used = 1 + len(prefix or ())  # the start token and the decoder prompt
        args.max_new_tokens = max(1, min(model.spec.max_positions - used, 2 * len(source) + 10))
    return _run(model, tokenizer, source, args, echo=args.decoder_prompt, decoder_prompt=prefix)


def _load(args: argparse.Namespace, *, family: str, other: str) -> tuple[Any, Any]:
    import zoo
    from zoo.cli import kinds

    # The loader of `zoo chat` and `zoo serve`; it resolves "auto" and says so, before reading anything,
    # when the device is not there.
    expected = "a zoo checkpoint or a Hugging Face folder"
    with kinds.expecting(args.checkpoint, kinds.CHECKPOINT, kinds.RUN, kinds.HF_FOLDER, expected=expected):
        model, tokenizer, _ = zoo.load_pretrained(
            args.checkpoint, device=args.device, dtype=torch_dtype(args.dtype)
        )
    if model.spec.family != family:
        raise ValueError(
            f"{args.checkpoint}: holds a {model.spec.family} model; `zoo {args.command}` needs a {family} model"
            + (f" (try `zoo {other}`)" if model.spec.family in ("decoder", "encoder-decoder") else "")
        )
    check_finite(model, where=args.checkpoint)
    return model, tokenizer


def check_finite(model: Any, *, where: str) -> None:
    """Raise ValueError naming the first weight that holds NaN or inf (one pass over the weights)."""
    import torch

    from zoo.quant import float_parts  # a quantised weight's scales: torchao's tensors have no isfinite

    for name, tensor in model.named_parameters():
        if tensor.is_floating_point() and not all(bool(torch.isfinite(t).all()) for t in float_parts(tensor)):
            raise ValueError(
                f"{where}: weight {name} holds NaN or inf values; the model cannot generate "
                "(did its training diverge?)"
            )


def _run(
    model: Any,
    tokenizer: Any,
    ids: list[int],
    args: argparse.Namespace,
    *,
    echo: str | None,
    decoder_prompt: list[int] | None = None,
    grammar: dict[str, Any] | None = None,
) -> int:
    """Generate from one input and print it: ``echo`` (the prompt's text) first, in bold.

    ``ids``: a decoder's prompt or an encoder-decoder's source; ``decoder_prompt``: the ids an
    encoder-decoder's output begins with (its text is ``echo``).
    """
    import torch

    from zoo.cli import console, err_console
    from zoo.generation import TextStream, generate, stream

    settings = search_settings(args, tokenizer) | (grammar or {})  # --json-schema: generate's keywords
    settings |= speculative_settings(args, model)  # --draft / --prompt-lookup
    device = next(model.parameters()).device  # where "auto" put the model
    input_ids = torch.tensor([ids], device=device)
    if model.spec.family == "decoder":  # the output is the prompt, then the new tokens
        context, skip = ids, len(ids)
    else:  # the start token, then any decoder prompt (given the start token unless it begins with it)
        context = decoder_prompt or []
        skip = len(context) + (0 if context[:1] == [model.spec.start_token_id] else 1)
        if decoder_prompt is not None:
            settings["decoder_input_ids"] = torch.tensor([decoder_prompt], device=device)
    # The prompt is context only: its text is echoed, and the first new word keeps its space.
    start = time.perf_counter()
    if args.beams > 1 or args.num_return_sequences > 1:
        # Validated and searched in one call; the prompt is echoed with the results, as nothing streams.
        with nan_logits(None):
            out = generate(model, input_ids, return_scores=True, **settings)
        rows = new_tokens(out.sequences, skip, model.spec.eos_token_id)
        scores = out.scores.tolist() if out.scores is not None else [None] * len(rows)
        for number, (row, score) in enumerate(zip(rows, scores), start=1):
            if len(rows) > 1:  # numbered, best first: "[2] (-1.2345) text"
                label = f"[{number}]" + (f" ({score:.4f})" if score is not None else "")
                console.out(label, end=" ", highlight=False, style="dim")
            if echo is not None:
                console.out(clean(echo), end="", highlight=False, style="bold")
            text = TextStream(tokenizer, prompt_ids=context)
            console.out(clean(text.push(row) + text.flush()), highlight=False)
        count = sum(map(len, rows))
    else:
        steps = stream(model, input_ids, **settings)  # checks every setting and the prompt, computes nothing
        if echo is not None:
            console.out(clean(echo), end="", highlight=False, style="bold")
        text = TextStream(tokenizer, prompt_ids=context)
        new: list[int] = []
        try:
            with nan_logits(new):
                for tokens in steps:
                    new.append(int(tokens[0]))
                    console.out(clean(text.push(new[-1])), end="", highlight=False)
        except BaseException:  # an error or Ctrl-C mid-stream: end the line, so the message starts its own
            console.out("", highlight=False)
            raise
        console.out(clean(text.flush()), highlight=False)
        count = len(new)
    seconds = time.perf_counter() - start
    err_console.print(
        f"[dim]{count} tokens in {seconds:.2f} s ({count / max(seconds, 1e-9):.1f} tokens/s)[/]",
        highlight=False,
    )
    return 0
