"""Narrow terminals and pipes: `zoo diff` and `zoo show` fit 60 and 80 columns, piped and on a terminal,
wrapping values and never names; `--help` fits too; a subcommand's usage error shows its own usage."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys

import pytest
from rich.console import Console
from rich.text import Text

import zoo
import zoo.cli
from zoo.analysis import diff_specs
from zoo.analysis.diff import MISSING, is_metadata
from zoo.cli import build_parser, main, wrap_alternatives
from zoo.cli.sanitize import json_text
from zoo.cli.tables import Column, plain_lines

WIDTHS = [60, 80]


def rendered(monkeypatch: pytest.MonkeyPatch, argv: list[str], *, width: int, terminal: bool) -> str:
    """What ``zoo ARGV`` prints on a console ``width`` wide: a terminal, or a pipe (COLUMNS=width)."""
    out = io.StringIO()
    monkeypatch.setattr(zoo.cli, "console", Console(file=out, width=width, force_terminal=terminal))
    main(argv)
    return Text.from_ansi(out.getvalue()).plain


def too_long(text: str, width: int) -> list[str]:
    return [line for line in text.splitlines() if len(line) > width]


def whole(word: str, text: str) -> bool:
    """``word`` appears in ``text`` with nothing glued to either side (a name not cut, not joined)."""
    return re.search(rf"(?<!\S){re.escape(word)}(?!\S)", text) is not None


@pytest.mark.parametrize("terminal", [False, True], ids=["piped", "terminal"])
@pytest.mark.parametrize("width", [*WIDTHS, 100])
@pytest.mark.parametrize("pair", [("gpt2", "llama-3.2-1b"), ("gpt2", "gpt2-medium")])
def test_diff_fits_the_width_and_wraps_values_not_field_names(
    monkeypatch: pytest.MonkeyPatch, width: int, terminal: bool, pair: tuple[str, str]
) -> None:
    text = rendered(monkeypatch, ["diff", *pair], width=width, terminal=terminal)
    assert not too_long(text, width), "\n".join(too_long(text, width))
    for path, a, b in diff_specs(zoo.preset(pair[0]), zoo.preset(pair[1])):
        if is_metadata(path):  # a label (name, source): a note below the table, wrapped as prose
            assert f"note: {path} differs" in text
            continue
        assert whole(path, text), f"{path} cut at width {width}:\n{text}"
        for value in (a, b):
            # each word of a value is whole: the value columns are as wide as their longest word, up to
            # 24 characters (a longer one, such as "openai-community/gpt2-medium", may be folded)
            words = [] if value is MISSING else json_text(value, indent=None).split()
            split = [word for word in words if len(word) <= 24 and not whole(word, text)]
            assert not split, f"{split} split mid-word at width {width}:\n{text}"


@pytest.mark.slow  # a subprocess: a few seconds to import torch
def test_diff_piped_at_80_columns_fits_in_a_real_pipe() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TTY_COMPATIBLE")}
    result = subprocess.run(
        [sys.executable, "-m", "zoo", "diff", "gpt2", "llama-3.2-1b"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**env, "COLUMNS": "80"},
    )
    assert result.returncode == 1, result.stderr  # they differ, as diff(1)
    assert not too_long(result.stdout, 80) and whole("attention.num_kv_heads", result.stdout)
    assert not set("│┃━─┏└") & set(result.stdout), "a pipe gets plain text, not box drawing"


@pytest.mark.parametrize("terminal", [False, True], ids=["piped", "terminal"])
@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("target", ["gpt2", "bert-base", "transformer-base"])
def test_show_fits_the_width(
    monkeypatch: pytest.MonkeyPatch, width: int, terminal: bool, target: str
) -> None:
    text = rendered(monkeypatch, ["show", target, "--depth", "2"], width=width, terminal=terminal)
    assert not too_long(text, width), "\n".join(too_long(text, width))
    for name in ("forward FLOPs / token", "weights + gradients + Adam", "training step total"):
        assert name in text, f"{name!r} wrapped at width {width}:\n{text}"  # estimate names never wrap


def test_show_lists_only_the_assumptions_that_apply_to_the_family(capsys: pytest.CaptureFixture[str]) -> None:
    def assumptions(target: str) -> str:
        assert main(["show", target, "--json"]) == 0
        import json

        return "\n".join(json.loads(capsys.readouterr().out)["assumptions"])

    decoder, encoder, seq2seq = assumptions("gpt2"), assumptions("bert-base"), assumptions("transformer-base")
    assert "encoder-decoder" not in decoder and "pooler" not in decoder and "cross-attention" not in decoder
    assert "KV cache" in decoder and "T/2 keys" in decoder
    assert "KV cache" not in encoder and "T/2 keys" not in encoder and "encoder-decoder" not in encoder
    assert "encoder-decoder" in seq2seq and "cross-attention" in seq2seq and "pooler" not in seq2seq


def test_an_encoder_shows_no_kv_cache_row(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["show", "bert-base", "--depth", "0"]) == 0
    assert "KV cache / token" not in capsys.readouterr().out  # (a note says it keeps none)


def test_plain_rows_hang_a_long_name_over_its_values() -> None:
    columns = [Column("field", whole=True), Column("a", fold=True), Column("b", fold=True)]
    rows = [("short", "1", "2"), ("a.much.longer.field.name", "three four five six", "7")]
    lines = plain_lines(columns, rows, width=30)
    assert max(map(len, lines)) <= 30
    assert "a.much.longer.field.name" in lines  # alone on its line, its values below
    assert lines[0].split() == ["field", "a", "b"]


def every_parser(parser=None, prog: str = "zoo"):
    """(prog, parser) for zoo and every subcommand, nested ones included."""
    import argparse

    parser = parser or build_parser()
    yield prog, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from every_parser(sub, f"{prog} {name}")


@pytest.mark.parametrize("width", WIDTHS)
def test_every_help_fits_the_width(monkeypatch: pytest.MonkeyPatch, width: int) -> None:
    monkeypatch.setenv("COLUMNS", str(width))  # argparse reads the width from the environment
    for prog, parser in every_parser():
        text = parser.format_help()
        assert not too_long(text, width), f"{prog} --help at {width}:\n" + "\n".join(too_long(text, width))


def test_convert_usage_breaks_its_alternatives_inside_the_group(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    convert = dict(every_parser())["zoo convert"]
    usage = convert.format_usage()
    assert max(map(len, usage.splitlines())) <= 80
    assert "(--from-hf DIR|ID | --to-hf DIR|PRESET |" in usage and "--to-gguf DIR|PRESET)" in usage


def test_wrap_alternatives_keeps_a_short_line_and_breaks_after_a_bar() -> None:
    assert wrap_alternatives("usage: zoo x [-a | -b]", 80) == ["usage: zoo x [-a | -b]"]
    assert wrap_alternatives("  (--one A | --two B | --three C)", 24) == [
        "  (--one A | --two B |",
        "   --three C)",
    ]


def test_help_text_never_breaks_an_option_name_at_its_hyphen(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "60")
    for prog, parser in every_parser():
        for line in parser.format_help().splitlines():
            assert not re.search(r"\w-$", line), f"{prog}: {line!r}"


@pytest.mark.parametrize(
    ("argv", "usage"),
    [
        (["generate", "runs/x", "--prompt", "hi", "--bogus"], "usage: zoo generate"),
        (["show", "gpt2", "--no-such-flag"], "usage: zoo show"),
        (["plot", "masks", "gpt2-tiny", "--nope"], "usage: zoo plot masks"),
        (["generate"], "usage: zoo generate"),
    ],
)
def test_a_subcommand_usage_error_shows_the_subcommand_usage(
    capsys: pytest.CaptureFixture[str], argv: list[str], usage: str
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.startswith(usage), err
    assert "COMMAND ..." not in err


def test_a_long_list_of_choices_moves_from_the_metavar_into_the_help(monkeypatch: pytest.MonkeyPatch) -> None:
    from zoo.cli import ArgumentParser

    monkeypatch.setenv("COLUMNS", "60")
    parser = ArgumentParser(prog="zoo x")
    names = ["seq2seq", "causal_lm", "masked_lm", "sequence_classification", "token_classification"]
    parser.add_argument("--task", choices=names, help="what the data is for")
    parser.add_argument("--side", choices=["left", "right"], help="which side")
    parser.add_argument("--a-rather-long-option-name", metavar="AND_A_LONG_METAVAR_TOO")
    text = parser.format_help()
    assert "--task TASK" in text and "{left,right}" in text  # a short list stays where argparse puts it
    assert "(one of: seq2seq, causal_lm, masked_lm," in " ".join(text.split())
    assert not too_long(text, 60), text
    with pytest.raises(SystemExit):
        parser.parse_args(["--task", "nope"])  # the choices are still enforced


@pytest.mark.parametrize("terminal", [False, True], ids=["piped", "terminal"])
@pytest.mark.parametrize(
    ("target", "generates"),
    [
        ("clip-vit-base-patch32", False),
        ("siglip-base-patch16-224", False),
        ("vit-base-patch16-224", False),
        ("whisper-tiny", True),
    ],
)
def test_show_of_image_and_audio_models_fits_60_columns_with_a_kv_cache_only_when_it_generates(
    monkeypatch: pytest.MonkeyPatch, terminal: bool, target: str, generates: bool
) -> None:
    text = rendered(monkeypatch, ["show", target, "--depth", "1"], width=60, terminal=terminal)
    assert not too_long(text, 60), "\n".join(too_long(text, 60))
    assert ("KV cache / token" in text) is generates
    assert ("cross KV cache / source token" in text) is generates  # Whisper's decoder reads the audio
    dual = target.startswith(("clip", "siglip"))
    for name in ("vision tower", "text tower", "logit_scale"):
        assert (name in text) is dual, f"{name!r} at width 60:\n{text}"
    assert ("- KV cache:" in text) is generates  # the assumption that goes with the row
