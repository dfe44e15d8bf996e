"""``zoo generate`` and ``zoo translate``: text from a saved model and its tokenizer, streamed as it comes.

    zoo generate runs/gpt/ --prompt "Once upon a time" --max-new-tokens 40 --sample --top-p 0.9 --seed 0
    zoo translate runs/ko-en/ "안녕하세요" --beams 4 --num-return-sequences 3
    zoo translate runs/m2m/ "Hello" --forced-bos-token __de__ --decoder-prompt "Guten" --bad-words "Tag"

Both read ``DIR/model.safetensors`` (+ spec) and ``DIR/tokenizer.json`` (as written by ``zoo.save(model,
DIR, tokenizer=...)``). Greedy search and sampling print each piece of text as soon as its token is
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
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from zoo.cli.options import add_device_option, add_dtype_option, parse_seed, torch_dtype, utf8_text
from zoo.cli.sanitize import clean


def register(subparsers: argparse._SubParsersAction) -> None:
    generate = subparsers.add_parser(
        "generate",
        help="continue a prompt with a saved decoder model (tokens stream as they are chosen)",
        description="Continue a prompt with a saved decoder-only model and its tokenizer.",
    )
    generate.add_argument("checkpoint", metavar="DIR", help="a zoo checkpoint directory with tokenizer.json")
    generate.add_argument("--prompt", required=True, type=utf8_text, help="the text to continue")
    generate.add_argument(
        "--no-bos", action="store_true", help="do not start the prompt with the bos token (default: add it)"
    )
    _search_options(generate, default_new_tokens=32)
    generate.set_defaults(run=run_generate)

    translate = subparsers.add_parser(
        "translate",
        help="translate a sentence with a saved encoder-decoder model",
        description="Translate one sentence with a saved encoder-decoder model and its tokenizer.",
    )
    translate.add_argument("checkpoint", metavar="DIR", help="a zoo checkpoint directory with tokenizer.json")
    translate.add_argument("sentence", type=utf8_text, help="the source sentence")
    translate.add_argument(
        "--decoder-prompt",
        type=utf8_text,
        default=None,
        metavar="TEXT",
        help="the beginning of the translation, to continue (the decoder start token is put in front)",
    )
    _search_options(translate, default_new_tokens=None)
    translate.set_defaults(run=run_translate)


def _search_options(parser: argparse.ArgumentParser, *, default_new_tokens: int | None) -> None:
    search = parser.add_argument_group("search")
    search.add_argument(
        "--max-new-tokens",
        type=int,
        default=default_new_tokens,
        metavar="N",
        help=f"most tokens to generate (default: {default_new_tokens or 'twice the source length + 10'})",
    )
    search.add_argument("--sample", action="store_true", help="sample instead of greedy search")
    search.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (default 1.0)")
    search.add_argument("--top-k", type=int, default=None, metavar="K", help="sample among the K likeliest")
    search.add_argument(
        "--top-p", type=float, default=None, metavar="P", help="nucleus sampling mass, in (0, 1]"
    )
    search.add_argument(
        "--seed",
        type=parse_seed,
        default=None,
        help="random seed, for reproducible sampling (0 to 2**64 - 1)",
    )
    search.add_argument("--beams", type=int, default=1, metavar="N", help="beam search with N beams")
    search.add_argument(
        "--num-return-sequences",
        type=int,
        default=1,
        metavar="N",
        help="print N results: the N best beams (N <= --beams) or N samples (--sample)",
    )
    search.add_argument("--repetition-penalty", type=float, default=1.0, help="> 1 discourages repeats")
    search.add_argument(
        "--no-repeat-ngram-size", type=int, default=0, metavar="N", help="forbid repeated n-grams"
    )
    search.add_argument(
        "--bad-words",
        action="append",
        default=None,
        metavar="TEXT",
        help="never generate TEXT's tokens in this order (repeatable; tokenized as given, so mind a leading space)",
    )
    forced = search.add_mutually_exclusive_group()
    forced.add_argument(
        "--forced-bos-token",
        default=None,
        metavar="TOKEN",
        help="force this vocabulary token first (M2M-100's target language, e.g. __de__); as in "
        "transformers, only when the output starts from one token (a translation, a one-token prompt)",
    )
    forced.add_argument(
        "--forced-bos-token-id", type=int, default=None, metavar="ID", help="as --forced-bos-token, by id"
    )
    search.add_argument(
        "--forced-eos-token-id",
        type=int,
        default=None,
        metavar="ID",
        help="force this token id at the last step, when --max-new-tokens is reached",
    )
    run = parser.add_argument_group("model")
    add_device_option(run)
    add_dtype_option(run, default=None, help="cast the weights (default: as saved)")


def run_generate(args: argparse.Namespace) -> int:
    model, tokenizer = _load(args, family="decoder", other="translate")
    add_bos = not args.no_bos and tokenizer.bos_id is not None
    prompt = tokenizer.encode(args.prompt, add_bos=add_bos, add_eos=False)
    if not prompt:
        raise ValueError("--prompt is empty after tokenization; give some text to continue")
    return _run(model, tokenizer, prompt, args, echo=args.prompt)


def run_translate(args: argparse.Namespace) -> int:
    model, tokenizer = _load(args, family="encoder-decoder", other="generate")
    source = tokenizer.encode(args.sentence, add_eos=tokenizer.eos_id is not None)
    prefix = None
    if args.decoder_prompt is not None:
        prefix = tokenizer.encode(args.decoder_prompt, add_bos=False, add_eos=False)
        if not prefix:
            raise ValueError("--decoder-prompt is empty after tokenization; give some text to continue")
    if args.max_new_tokens is None:  # as zoo.training's translate: room for a longer target, within limits
        used = 1 + len(prefix or ())  # the start token and the decoder prompt
        args.max_new_tokens = max(1, min(model.spec.max_positions - used, 2 * len(source) + 10))
    return _run(model, tokenizer, source, args, echo=args.decoder_prompt, decoder_prompt=prefix)


def _load(args: argparse.Namespace, *, family: str, other: str) -> tuple[Any, Any]:
    import zoo

    # zoo.load resolves "auto" and says so, before reading anything, when the device is not there.
    model = zoo.load(args.checkpoint, device=args.device, dtype=torch_dtype(args.dtype))
    if model.spec.family != family:
        raise ValueError(
            f"{args.checkpoint}: holds a {model.spec.family} model; `zoo {args.command}` needs a {family} model"
            + (f" (try `zoo {other}`)" if model.spec.family in ("decoder", "encoder-decoder") else "")
        )
    check_finite(model, where=args.checkpoint)
    return model, zoo.load_tokenizer(args.checkpoint)


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


def _settings(args: argparse.Namespace, tokenizer: Any) -> dict[str, Any]:
    """The `zoo.generation.GenerationConfig` fields the flags set (validated by generate, not here)."""
    forced_bos = args.forced_bos_token_id
    if args.forced_bos_token is not None:
        forced_bos = tokenizer.token_to_id(args.forced_bos_token)
        if forced_bos is None:
            raise ValueError(f"--forced-bos-token: {args.forced_bos_token!r} is not a token of the tokenizer")
    bad_words = None
    if args.bad_words:
        bad_words = [tokenizer.encode(word, add_bos=False, add_eos=False) for word in args.bad_words]
        for word, ids in zip(args.bad_words, bad_words):
            if not ids:
                raise ValueError(f"--bad-words: {word!r} has no tokens")
    return dict(
        max_new_tokens=args.max_new_tokens,
        do_sample=args.sample,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
        num_beams=args.beams,
        num_return_sequences=args.num_return_sequences,
        repetition_penalty=args.repetition_penalty,
        no_repeat_ngram_size=args.no_repeat_ngram_size,
        bad_words_ids=bad_words,
        forced_bos_token_id=forced_bos,
        forced_eos_token_id=args.forced_eos_token_id,
    )


def _run(
    model: Any,
    tokenizer: Any,
    ids: list[int],
    args: argparse.Namespace,
    *,
    echo: str | None,
    decoder_prompt: list[int] | None = None,
) -> int:
    """Generate from one input and print it: ``echo`` (the prompt's text) first, in bold.

    ``ids``: a decoder's prompt or an encoder-decoder's source; ``decoder_prompt``: the ids an
    encoder-decoder's output begins with (its text is ``echo``).
    """
    import torch

    from zoo.cli import console, err_console
    from zoo.generation import TextStream, generate, stream

    settings = _settings(args, tokenizer)
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
        with _nan_logits(None):
            out = generate(model, input_ids, return_scores=True, **settings)
        rows = _new_tokens(out.sequences, skip, model.spec.eos_token_id)
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
            with _nan_logits(new):
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


def _new_tokens(sequences: Any, skip: int, eos: int | None) -> list[list[int]]:
    """Each output row (``skip`` tokens: the prompt, or the start token and any decoder prompt; then the
    new tokens) -> its new tokens, up to and including its first eos."""
    rows = []
    for row in sequences[:, skip:].tolist():
        rows.append(row[: row.index(eos) + 1] if eos is not None and eos in row else row)
    return rows


@contextmanager
def _nan_logits(done: list[int] | None) -> Iterator[None]:
    """torch's error for sampling from NaN / inf probabilities, said in zoo's words (the step: ``done``).

    Finite weights can still overflow to inf logits (fp16); `torch.multinomial` then raises a RuntimeError
    whose text is the only sign of it. Other RuntimeErrors pass unchanged: they are bugs.
    """
    try:
        yield
    except RuntimeError as error:
        if "nan" not in str(error).lower():
            raise
        step = f" at step {len(done) + 1}" if done is not None else ""
        raise ValueError(
            f"the model produced NaN/inf logits{step}; cannot sample from them (try --dtype fp32)"
        ) from error
