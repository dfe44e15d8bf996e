"""``zoo chat``: talk with a decoder model in the terminal, through its tokenizer's chat template.

    zoo chat runs/sft/ --system "Answer in one sentence."
    zoo chat ~/models/Qwen2.5-0.5B-Instruct --sample --temperature 0.7 --top-p 0.9 --seed 0
    printf 'Hello\\nWhat did I just say?\\n' | zoo chat runs/sft/       # piped: one message a line

MODEL is a zoo checkpoint or a Hugging Face folder with its ``tokenizer.json`` (`zoo.load_pretrained`); the
conversation is a `zoo.generation.ChatSession`, which re-renders it with the template every turn, stops an
answer at eos or the template's end-of-turn token, and drops the oldest turns (said once, on stderr) when
the conversation would not leave ``--max-new-tokens`` positions free.

At a terminal: a ``> `` prompt with line editing and history (readline, where Python has it); the answer
streams as it is generated. Commands: ``/reset``, ``/system TEXT``, ``/exit`` or ``/quit``, ``/help``.
Ctrl-C while an answer streams stops that answer (what was said stays in the conversation) and the prompt
returns; at the prompt, Ctrl-C ends the session with status 130, as it ends ``litgpt chat`` (Ctrl-D, or
``/exit``, ends it with 0). With stdin not a terminal, each line is a message (blank lines skipped,
commands work) and each answer is printed plainly on stdout, a line each; notes go to stderr.

Everything printed from the model is `zoo.cli.sanitize.clean`: a tokenizer's tokens could hold escape
sequences.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterator
from typing import Any

from zoo.cli.options import add_device_option, add_dtype_option, torch_dtype, utf8_text
from zoo.cli.sanitize import clean, markup
from zoo.cli.search import (
    nan_logits,
    sampling_options,
    sampling_settings,
    speculative_options,
    speculative_settings,
)

PROMPT = "> "
# The default answer length: transformers' `chat` default, or half the model's positions when that is less.
DEFAULT_NEW_TOKENS = 256

HELP = """\
/reset         clear the conversation (the system prompt stays)
/system TEXT   set the system prompt and clear the conversation (/system alone: no system prompt)
/exit, /quit   leave (as Ctrl-D does; Ctrl-C at the prompt leaves with status 130)
/help          this list
Ctrl-C while an answer streams stops it; what was said so far stays in the conversation."""


def register(subparsers: argparse._SubParsersAction) -> None:
    chat = subparsers.add_parser(
        "chat",
        help="chat with a decoder model in the terminal, through its tokenizer's chat template",
        description="Chat with a decoder-only model (a zoo checkpoint or a Hugging Face folder with its "
        "tokenizer.json): each message is rendered with the tokenizer's chat template and the answer "
        "streams as it is generated. Commands: /reset, /system TEXT, /exit (or /quit), /help. Ctrl-C stops "
        "an answer; Ctrl-D leaves. With stdin not a terminal, each line is a message and each answer is "
        "printed on a line.",
    )
    chat.add_argument(
        "model", metavar="MODEL", help="a zoo checkpoint or a Hugging Face folder, with tokenizer.json"
    )
    chat.add_argument("--system", type=utf8_text, default=None, metavar="TEXT", help="the system prompt")
    search = chat.add_argument_group("search")
    sampling_options(
        search,
        default_new_tokens=None,
        new_tokens_help=f"{DEFAULT_NEW_TOKENS}, or half the model's max_positions when that is less",
    )
    search.add_argument(
        "--repetition-penalty", type=float, default=1.0, metavar="PENALTY", help="> 1 discourages repeats"
    )
    speculative_options(search)
    run = chat.add_argument_group("model")
    add_device_option(run)
    add_dtype_option(run, default=None, help="cast the weights (default: as saved)")
    chat.set_defaults(run=run_chat)


def run_chat(args: argparse.Namespace) -> int:
    from zoo.cli import err_console

    session = open_session(args)
    interactive = sys.stdin.isatty()
    if interactive:
        _enable_line_editing()
        err_console.print(
            f"[dim]chatting with {markup(args.model)}; /help lists the commands, Ctrl-D leaves[/]",
            highlight=False,
            soft_wrap=True,
        )
    told_dropped = False
    for line in _terminal_lines() if interactive else _piped_lines():
        text = line.strip()
        if not text:
            continue
        if text.startswith("/"):
            if not _command(session, text):
                return 0
            continue
        _answer(session, line, interactive=interactive)
        if session.dropped_turns and not told_dropped:  # said once per session
            told_dropped = True
            limit, room = session.model.spec.max_positions, session.config.max_new_tokens
            err_console.print(
                f"[dim]note: the oldest turns are dropped from the conversation to keep it within "
                f"max_positions ({limit}) - max_new_tokens ({room}) = {limit - room} tokens[/]",
                highlight=False,
                soft_wrap=True,
            )
    return 0


def open_session(args: argparse.Namespace) -> Any:
    """The `ChatSession` the flags describe, over the model and tokenizer in ``args.model``."""
    import zoo
    from zoo.cli import kinds
    from zoo.cli.generate import check_finite
    from zoo.generation import ChatSession

    expected = "a zoo checkpoint or a Hugging Face folder"
    with kinds.expecting(args.model, kinds.CHECKPOINT, kinds.RUN, kinds.HF_FOLDER, expected=expected):
        model, tokenizer, _ = zoo.load_pretrained(
            args.model, device=args.device, dtype=torch_dtype(args.dtype)
        )
    family = model.spec.family
    if family != "decoder":
        hint = " (try `zoo translate`)" if family == "encoder-decoder" else ""
        raise ValueError(f"{args.model}: holds an {family} model; `zoo chat` needs a decoder model{hint}")
    check_finite(model, where=args.model)
    new_tokens = args.max_new_tokens
    if new_tokens is None:
        new_tokens = min(DEFAULT_NEW_TOKENS, model.spec.max_positions // 2)
    return ChatSession(
        model,
        tokenizer,
        system=args.system,
        max_new_tokens=new_tokens,
        **sampling_settings(args),
        repetition_penalty=args.repetition_penalty,
        **speculative_settings(args, model),
    )


def _command(session: Any, text: str) -> bool:
    """Carry out a ``/command``; False when it ends the session."""
    from zoo.cli import console, err_console

    name, _, rest = text.partition(" ")
    if name in ("/exit", "/quit"):
        return False
    if name == "/reset":
        session.reset()
        err_console.print("[dim]conversation cleared[/]", highlight=False, soft_wrap=True)
    elif name == "/system":
        session.set_system(rest.strip() or None)
        what = "system prompt set" if session.system else "no system prompt"
        err_console.print(f"[dim]{what}; conversation cleared[/]", highlight=False, soft_wrap=True)
    elif name == "/help":
        console.out(HELP, highlight=False)
    else:
        err_console.print(
            f"[dim]unknown command {markup(name)}; /help lists the commands[/]",
            highlight=False,
            soft_wrap=True,
        )
    return True


def _answer(session: Any, message: str, *, interactive: bool) -> None:
    """Stream the answer to ``message``; Ctrl-C stops it. An error is a line at a terminal (the
    conversation goes on) and the command's error when piped (a script should stop)."""
    from zoo.cli import console, err_console
    from zoo.cli.errors import one_line

    pieces = None
    try:
        pieces = session.reply(message)  # the prompt is built and checked here, before any compute
        with nan_logits(None):
            for piece in pieces:
                console.out(clean(piece), end="", highlight=False)
        console.out("", highlight=False)
    except KeyboardInterrupt:
        if pieces is not None:
            pieces.close()  # the partial answer enters the conversation now
        console.out("", highlight=False)
        err_console.print("[dim](stopped)[/]", highlight=False, soft_wrap=True)
    except ValueError as error:
        if not interactive:
            raise
        if pieces is not None:  # the answer had begun: the error starts its own line
            console.out("", highlight=False)
        err_console.print(f"[bold red]error:[/] {markup(one_line(error))}", highlight=False, soft_wrap=True)


def _terminal_lines() -> Iterator[str]:
    """Lines typed at the prompt, until Ctrl-D (end) or Ctrl-C (KeyboardInterrupt, status 130)."""
    from zoo.cli import console, err_console

    while True:
        try:
            yield input(PROMPT)
        except EOFError:  # Ctrl-D: leave on a fresh line
            console.out("", highlight=False)
            return
        except KeyboardInterrupt:
            console.out("", highlight=False)  # "interrupted" then starts its own line
            raise
        except UnicodeDecodeError:
            err_console.print(
                "[bold red]error:[/] that line is not UTF-8; check the terminal's encoding", soft_wrap=True
            )


def _piped_lines() -> Iterator[str]:
    """Each line of stdin (not a terminal); a line that is not UTF-8 is an error naming its number."""
    for number, raw in enumerate(sys.stdin.buffer, start=1):
        try:
            yield raw.decode("utf-8").rstrip("\r\n")
        except UnicodeDecodeError as error:
            raise ValueError(
                f"stdin line {number} is not UTF-8 (byte 0x{raw[error.start]:02x} at byte {error.start})"
            ) from None


def _enable_line_editing() -> None:
    """Arrow keys and history for `input` (importing readline is what turns them on)."""
    # Python built without it (Windows): plain input still works.
    with contextlib.suppress(ImportError):
        import readline  # noqa: F401
