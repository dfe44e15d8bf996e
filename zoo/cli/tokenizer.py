"""``zoo tokenizer``: train a subword tokenizer on text files, look at how one splits a sentence, or at the
prompt its chat template makes of a conversation.

zoo tokenizer train --kind bpe --vocab-size 8000 data/*.txt --out tok.json
zoo tokenizer encode tok.json "the cat eats fish"
zoo tokenizer chat models/qwen chat.json --generation-prompt     # chat.json: [{"role": ..., "content": ...}]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from zoo.cli.errors import writing
from zoo.cli.options import non_negative_int, utf8_text
from zoo.cli.sanitize import markup


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("tokenizer", help="train a tokenizer, or encode text with one")
    commands = parser.add_subparsers(dest="tokenizer_command", metavar="ACTION", required=True)

    train = commands.add_parser(
        "train", help="train a BPE / WordPiece / Unigram tokenizer (ids 0-4: pad bos eos unk mask)"
    )
    train.add_argument("files", nargs="+", type=Path, help="UTF-8 text files (TSV works: tabs are spaces)")
    train.add_argument("--kind", choices=("bpe", "wordpiece", "unigram"), default="bpe")
    train.add_argument("--vocab-size", type=int, default=8000)
    train.add_argument(
        "--min-frequency", type=non_negative_int, default=2, help="bpe / wordpiece: rarest merge kept"
    )
    train.add_argument("--lowercase", action="store_true")
    train.add_argument("--out", type=Path, required=True, help="where to write tokenizer.json")
    train.set_defaults(run=run_train)

    encode = commands.add_parser("encode", help="show the tokens and ids of a text")
    encode.add_argument("tokenizer", type=Path, help="a tokenizer.json, or a directory holding one")
    encode.add_argument("text", type=utf8_text)
    encode.set_defaults(run=run_encode)

    chat = commands.add_parser(
        "chat",
        help="show the prompt a tokenizer's chat template makes of a conversation (Tokenizer.apply_chat_template)",
    )
    chat.add_argument(
        "tokenizer", type=Path, help="a tokenizer.json, or a directory holding one (and its template)"
    )
    chat.add_argument("messages", help='a JSON file of [{"role": ..., "content": ...}, ...], or - for stdin')
    chat.add_argument(
        "--generation-prompt", action="store_true", help="end with the header of an assistant turn"
    )
    chat.add_argument(
        "--continue-final-message", action="store_true", help="leave the last message open for the model"
    )
    chat.add_argument(
        "--template", type=Path, help="a Jinja file to render with instead of the tokenizer's own"
    )
    chat.add_argument("--ids", action="store_true", help="print the token ids instead of the text")
    chat.set_defaults(run=run_chat)


def run_train(args: argparse.Namespace) -> int:
    from zoo.cli import console
    from zoo.io.tokenizer import train_tokenizer

    for file in args.files:  # before training: the text would be gone by the time the tokenizer is written
        if args.out.resolve() == file.resolve():
            raise ValueError(f"--out {args.out} is one of the training files; choose another --out")
    tokenizer = train_tokenizer(
        [str(f) for f in args.files],
        kind=args.kind,
        vocab_size=args.vocab_size,
        min_frequency=args.min_frequency,
        lowercase=args.lowercase,
    )
    with writing(args.out):
        tokenizer.save(args.out)
    specials = "  ".join(f"{name}={i}" for name, i in tokenizer.special_ids().items())
    console.print(
        f"{args.kind} tokenizer, {tokenizer.vocab_size:,} tokens ({specials}) -> [bold]{markup(args.out)}[/]"
    )
    if tokenizer.vocab_size < args.vocab_size:
        console.print(f"[dim]the text holds fewer distinct pieces than --vocab-size {args.vocab_size}[/]")
    return 0


def run_encode(args: argparse.Namespace) -> int:
    from zoo.cli import console
    from zoo.io.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_file(args.tokenizer)
    ids = tokenizer.encode(args.text, add_eos=False)
    tokens = [tokenizer.id_to_token(i) for i in ids]
    console.print(" ".join(f"{markup(t)}[dim]/{i}[/]" for t, i in zip(tokens, ids)), highlight=False)
    console.print(f"[dim]{len(ids)} tokens[/]")
    return 0


def run_chat(args: argparse.Namespace) -> int:
    import sys

    from zoo.cli import console
    from zoo.cli.sanitize import clean
    from zoo.io.jsonfile import parse_json, read_json
    from zoo.io.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_file(args.tokenizer)
    if args.messages == "-":
        messages = parse_json(sys.stdin.read(), where="the messages on stdin")
    else:
        messages = read_json(Path(args.messages), what="not a JSON list of messages")
    template = args.template.read_text(encoding="utf-8") if args.template is not None else None
    rendered = tokenizer.apply_chat_template(
        messages,
        add_generation_prompt=args.generation_prompt,
        continue_final_message=args.continue_final_message,
        tokenize=args.ids,
        chat_template=template,
    )
    if isinstance(rendered, str):
        console.print(
            clean(rendered), markup=False, highlight=False, end="" if rendered.endswith("\n") else "\n"
        )
    else:
        console.print(" ".join(map(str, rendered)), highlight=False)
        console.print(f"[dim]{len(rendered)} tokens[/]")
    return 0
