"""``zoo generate`` and ``zoo translate``: text from a saved model and its tokenizer, streamed as it comes.

    zoo generate runs/gpt/ --prompt "Once upon a time" --max-new-tokens 40 --sample --top-p 0.9 --seed 0
    zoo translate runs/ko-en/ "안녕하세요" --beams 4

Both read ``DIR/model.safetensors`` (+ spec) and ``DIR/tokenizer.json`` (as written by ``zoo.save(model,
DIR, tokenizer=...)``). Greedy search and sampling print each piece of text as soon as its token is
chosen; beam search prints the best hypothesis at the end. A summary (tokens, tokens/s) goes to stderr.

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
    search.add_argument("--repetition-penalty", type=float, default=1.0, help="> 1 discourages repeats")
    search.add_argument(
        "--no-repeat-ngram-size", type=int, default=0, metavar="N", help="forbid repeated n-grams"
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
    if args.max_new_tokens is None:  # as zoo.training's translate: room for a longer target, within limits
        args.max_new_tokens = min(model.spec.max_positions - 1, 2 * len(source) + 10)
    return _run(model, tokenizer, source, args, echo=None)


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

    for name, tensor in model.named_parameters():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise ValueError(
                f"{where}: weight {name} holds NaN or inf values; the model cannot generate "
                "(did its training diverge?)"
            )


def _run(model: Any, tokenizer: Any, ids: list[int], args: argparse.Namespace, *, echo: str | None) -> int:
    import torch

    from zoo.cli import console, err_console
    from zoo.generation import TextStream, generate, stream

    settings = dict(
        max_new_tokens=args.max_new_tokens,
        do_sample=args.sample,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
        num_beams=args.beams,
        repetition_penalty=args.repetition_penalty,
        no_repeat_ngram_size=args.no_repeat_ngram_size,
    )
    input_ids = torch.tensor([ids], device=next(model.parameters()).device)  # where "auto" put the model
    eos = model.spec.eos_token_id
    start = time.perf_counter()
    # The prompt is context only: its text is echoed, and the first new word keeps its space.
    text = TextStream(tokenizer, prompt_ids=ids if echo is not None else ())
    if args.beams > 1:
        # Validated and searched in one call; the prompt is echoed with the result, as nothing streams.
        with _nan_logits(None):
            out = generate(model, input_ids, **settings)[0, (len(ids) if echo is not None else 1) :].tolist()
        new = out[: out.index(eos) + 1] if eos is not None and eos in out else out
        if echo is not None:
            console.out(clean(echo), end="", highlight=False, style="bold")
        console.out(clean(text.push(new) + text.flush()), highlight=False)
    else:
        steps = stream(model, input_ids, **settings)  # checks every setting and the prompt, computes nothing
        if echo is not None:
            console.out(clean(echo), end="", highlight=False, style="bold")
        new = []
        try:
            with _nan_logits(new):
                for tokens in steps:
                    new.append(int(tokens[0]))
                    console.out(clean(text.push(new[-1])), end="", highlight=False)
        except BaseException:  # an error or Ctrl-C mid-stream: end the line, so the message starts its own
            console.out("", highlight=False)
            raise
        console.out(clean(text.flush()), highlight=False)
    seconds = time.perf_counter() - start
    err_console.print(
        f"[dim]{len(new)} tokens in {seconds:.2f} s ({len(new) / max(seconds, 1e-9):.1f} tokens/s)[/]",
        highlight=False,
    )
    return 0


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
