"""``zoo transcribe``: the text of a WAV file, from an audio model folder (Whisper).

    zoo transcribe whisper-tiny/ speech.wav
    zoo transcribe whisper-tiny/ interview.wav --language fr --task translate

A thin layer over `zoo.transcribe`: 16-bit PCM WAV at 16 kHz (mono, or channels averaged), at most 30 s;
greedy search from the folder's ``generation_config.json`` prompt. The text goes to stdout; with
``--tokens`` the generated ids follow on a second line.
"""

from __future__ import annotations

import argparse

from zoo.cli.options import add_device_option, positive_int
from zoo.cli.sanitize import clean


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "transcribe",
        help="speech to text: transcribe a WAV file with an audio model (Whisper)",
        description="Transcribe (or translate to English) a 16 kHz 16-bit PCM WAV file of at most 30 s with "
        "a zoo or Hugging Face Whisper folder; its tokenizer.json and generation_config.json are used.",
    )
    parser.add_argument("model", metavar="MODEL", help="a zoo checkpoint or Hugging Face Whisper folder")
    parser.add_argument("audio", metavar="AUDIO.wav", help="16-bit PCM WAV, 16 kHz, mono or stereo")
    parser.add_argument(
        "--language", default=None, help="a code (en, fr, ...) or token (<|fr|>); default: detected"
    )
    parser.add_argument(
        "--task",
        choices=("transcribe", "translate"),
        default=None,
        help="default: the model's (transcribe)",
    )
    parser.add_argument(
        "--max-new-tokens",
        type=positive_int,
        default=None,
        help="default: as many as the decoder's positions allow",
    )
    parser.add_argument("--tokens", action="store_true", help="also print the generated token ids")
    add_device_option(parser)
    parser.set_defaults(run=run_transcribe)


def run_transcribe(args: argparse.Namespace) -> int:
    from zoo.audio import transcribe
    from zoo.cli import console

    result = transcribe(
        args.model,
        args.audio,
        language=args.language,
        task=args.task,
        max_new_tokens=args.max_new_tokens,
        device=args.device,
    )
    console.print(clean(result.text), markup=False, highlight=False)
    if args.tokens:
        console.print(" ".join(map(str, result.tokens)), markup=False, highlight=False)
    return 0
