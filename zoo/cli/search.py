"""The search options `zoo generate` and `zoo translate` share (`zoo chat` the sampling ones): the flags,
the `GenerationConfig` fields they set, the new tokens of each output row, and torch's NaN-sampling error
in zoo's words."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from zoo.cli.options import add_device_option, add_dtype_option, parse_seed


def search_options(parser: argparse.ArgumentParser, *, default_new_tokens: int | None) -> None:
    """The search flags (group "search") and --device / --dtype (group "model") on ``parser``."""
    search = parser.add_argument_group("search")
    sampling_options(
        search,
        default_new_tokens=default_new_tokens,
        new_tokens_help=str(default_new_tokens or "twice the source length + 10"),
    )
    search.add_argument("--beams", type=int, default=1, metavar="N", help="beam search with N beams")
    search.add_argument(
        "--num-return-sequences",
        type=int,
        default=1,
        metavar="N",
        help="print N results: the N best beams (N <= --beams) or N samples (--sample)",
    )
    search.add_argument(
        "--repetition-penalty", type=float, default=1.0, metavar="PENALTY", help="> 1 discourages repeats"
    )
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
    speculative_options(search)
    run = parser.add_argument_group("model")
    add_device_option(run)
    add_dtype_option(run, default=None, help="cast the weights (default: as saved)")


def speculative_options(search: argparse._ArgumentGroup) -> None:
    """--draft DIR and --prompt-lookup N: speculative decoding (`zoo.generation.speculative`)."""
    search.add_argument(
        "--draft",
        default=None,
        metavar="DIR",
        help="speculative decoding: a smaller saved model with the same tokenizer drafts tokens the model "
        "verifies (same output under greedy search)",
    )
    search.add_argument(
        "--prompt-lookup",
        type=int,
        default=None,
        metavar="N",
        help="speculative decoding: draft N tokens by n-gram lookup in the prompt and the text so far",
    )


def speculative_settings(args: argparse.Namespace, model: Any) -> dict[str, Any]:
    """``assistant_model`` (the --draft checkpoint, loaded on the model's device and dtype) or
    ``prompt_lookup_num_tokens``; generate refuses both at once and what they do not combine with."""
    if args.draft is None:
        return {} if args.prompt_lookup is None else {"prompt_lookup_num_tokens": args.prompt_lookup}
    from zoo.cli import kinds
    from zoo.io.checkpoint import load
    from zoo.io.hf import from_hf
    from zoo.io.pretrained import pretrained_kind

    weight = next(model.parameters())
    expected = "a zoo checkpoint or a Hugging Face folder"
    with kinds.expecting(args.draft, kinds.CHECKPOINT, kinds.RUN, kinds.HF_FOLDER, expected=expected):
        read = load if pretrained_kind(args.draft) == "zoo" else from_hf  # no tokenizer needed: the model's
        draft = read(args.draft, device=weight.device, dtype=weight.dtype)
    settings: dict[str, Any] = {"assistant_model": draft}
    if args.prompt_lookup is not None:
        settings["prompt_lookup_num_tokens"] = args.prompt_lookup
    return settings


def sampling_options(
    search: argparse._ArgumentGroup, *, default_new_tokens: int | None, new_tokens_help: str
) -> None:
    """--max-new-tokens, --sample, --temperature, --top-k, --top-p and --seed (`zoo chat` has only these
    and --repetition-penalty); ``new_tokens_help`` says what the default of --max-new-tokens is.

    As in vLLM's and llama.cpp's commands, --temperature, --top-k or --top-p samples (`sampling_settings`):
    --sample alone samples at temperature 1; --temperature 0 is greedy search, as in the OpenAI API."""
    search.add_argument(
        "--max-new-tokens",
        type=int,
        default=default_new_tokens,
        metavar="N",
        help=f"most tokens to generate (default: {new_tokens_help})",
    )
    search.add_argument(
        "--sample",
        action="store_true",
        help="sample instead of greedy search (implied by --temperature, --top-k and --top-p)",
    )
    search.add_argument(
        "--temperature",
        type=float,
        default=None,
        metavar="T",
        help="sample at this temperature (default 1.0; 0: greedy search)",
    )
    search.add_argument(
        "--top-k", type=int, default=None, metavar="K", help="sample among the K likeliest (0: all)"
    )
    search.add_argument(
        "--top-p", type=float, default=None, metavar="P", help="sample from this probability mass, in (0, 1]"
    )
    search.add_argument(
        "--seed",
        type=parse_seed,
        default=None,
        help="random seed, for reproducible sampling (0 to 2**64 - 1)",
    )


def search_settings(args: argparse.Namespace, tokenizer: Any) -> dict[str, Any]:
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
        **sampling_settings(args),
        num_beams=args.beams,
        num_return_sequences=args.num_return_sequences,
        repetition_penalty=args.repetition_penalty,
        no_repeat_ngram_size=args.no_repeat_ngram_size,
        bad_words_ids=bad_words,
        forced_bos_token_id=forced_bos,
        forced_eos_token_id=args.forced_eos_token_id,
    )


def sampling_settings(args: argparse.Namespace) -> dict[str, Any]:
    """``do_sample``, ``temperature``, ``top_k``, ``top_p`` and ``seed`` from the flags: any of --temperature,
    --top-k and --top-p samples, as --sample does (with --beams: beam sampling). --top-k or --top-p at
    --temperature 0 (greedy search) would change nothing: refused, naming them."""
    given = {"--temperature": args.temperature, "--top-k": args.top_k, "--top-p": args.top_p}
    if args.temperature == 0:
        unused = [flag for flag in ("--top-k", "--top-p") if given[flag] is not None]
        if unused:
            raise ValueError(
                f"{' and '.join(unused)} {'has' if len(unused) == 1 else 'have'} no effect with --temperature 0, "
                "which is greedy search; "
                "give a temperature above 0 to sample, or leave them out"
            )
    return dict(
        do_sample=args.sample or any(value is not None for value in given.values()),
        temperature=1.0 if args.temperature is None else args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
    )


def new_tokens(sequences: Any, skip: int, eos: int | None) -> list[list[int]]:
    """Each output row (``skip`` tokens: the prompt, or the start token and any decoder prompt; then the
    new tokens) -> its new tokens, up to and including its first eos."""
    rows = []
    for row in sequences[:, skip:].tolist():
        rows.append(row[: row.index(eos) + 1] if eos is not None and eos in row else row)
    return rows


@contextmanager
def nan_logits(done: list[int] | None) -> Iterator[None]:
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
