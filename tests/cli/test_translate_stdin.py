"""`zoo translate DIR -`: stdin, a sentence a line, read as it comes and translated a batch at a time;
an empty sentence is an error naming it."""

from __future__ import annotations

import io
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import zoo
import zoo.cli
from zoo.cli import main
from zoo.cli.translate_stdin import LINES_PER_BATCH
from zoo.io.tokenizer import train_tokenizer

CORPUS = ["the cat sat on the mat", "the dog sat on the log", "a cat and a dog met", "the bird sang"] * 5
SENTENCES = ["the cat sat", "a dog met the bird on the log", "the mat", "sang"]


@pytest.fixture(scope="module")
def translator(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tokenizer = train_tokenizer(iter(CORPUS), kind="bpe", vocab_size=60, min_frequency=1)
    spec = zoo.preset("transformer-tiny").override(vocab_size=64, num_layers=2, max_positions=64)
    torch.manual_seed(4)
    model = zoo.build(spec).eval()
    with torch.no_grad():  # larger weights: logits that differ from step to step, so outputs are not empty
        for parameter in model.parameters():
            parameter.mul_(3)
    directory = tmp_path_factory.mktemp("mt") / "mt"
    zoo.save(model, directory, tokenizer=tokenizer)
    return directory


def feed(monkeypatch: pytest.MonkeyPatch, data: bytes | Iterator[bytes]) -> None:
    """Make ``data`` (bytes, or an iterator of lines) the command's stdin."""
    stream = io.BytesIO(data) if isinstance(data, bytes) else data
    monkeypatch.setattr(sys, "stdin", SimpleNamespace(buffer=stream))


def test_a_dash_translates_each_line_of_stdin_as_the_sentence_alone_would_be(
    translator: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    one_by_one = []
    for sentence in SENTENCES:
        assert main(["translate", str(translator), sentence, "--max-new-tokens", "6"]) == 0
        one_by_one.append(capsys.readouterr().out.rstrip("\n"))
    assert any(text.strip() for text in one_by_one)
    feed(monkeypatch, "".join(f"{s}\n" for s in SENTENCES).encode())
    assert main(["translate", str(translator), "-", "--max-new-tokens", "6"]) == 0
    captured = capsys.readouterr()
    assert captured.out.split("\n")[:-1] == one_by_one  # one line a sentence, in order, padding-invariant
    assert "4 sentences" in captured.err


def test_every_line_gets_its_numbered_beams(
    translator: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    feed(monkeypatch, b"the cat sat\nthe dog\n")
    argv = ["translate", str(translator), "-", "--beams", "3", "--num-return-sequences", "2"]
    assert main([*argv, "--max-new-tokens", "4"]) == 0
    labels = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert labels == ["[1]", "[2]", "[1]", "[2]"]


def test_an_empty_line_of_stdin_is_an_error_naming_its_number(
    translator: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    feed(monkeypatch, b"the cat sat\n   \nthe dog\n")
    assert main(["translate", str(translator), "-", "--max-new-tokens", "3"]) == 2
    captured = capsys.readouterr()
    assert "error: stdin line 2 is empty" in captured.err and "Traceback" not in captured.err
    assert main(["translate", str(translator), "the cat sat", "--max-new-tokens", "3"]) == 0
    assert captured.out == capsys.readouterr().out  # the line before the empty one was translated first


def test_empty_stdin_and_a_line_that_is_not_utf8_are_errors(
    translator: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    feed(monkeypatch, b"")
    assert main(["translate", str(translator), "-"]) == 2
    assert "error: stdin is empty" in capsys.readouterr().err
    feed(monkeypatch, b"the cat\nthe \xff dog\n")
    assert main(["translate", str(translator), "-", "--max-new-tokens", "3"]) == 2
    assert "error: stdin line 2 is not UTF-8 (byte 0xff" in capsys.readouterr().err


@pytest.mark.parametrize("sentence", ["", "  "])
def test_an_empty_sentence_is_an_error_not_a_translation(
    translator: Path, capsys: pytest.CaptureFixture[str], sentence: str
) -> None:
    assert main(["translate", str(translator), sentence]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "error: the sentence is empty" in captured.err


class Lines:
    """A stdin of ``count`` lines, made as they are read; ``read`` says how many were."""

    def __init__(self, count: int) -> None:
        self.count, self.read = count, 0

    def __iter__(self) -> Iterator[bytes]:
        for _ in range(self.count):
            self.read += 1
            yield b"the cat sat on the mat\n"


class ClosedPipe(io.StringIO):
    """A stdout whose reader has gone (``| head -1``): the first write fails."""

    def write(self, text: str) -> int:
        raise BrokenPipeError


def test_stdin_is_read_a_batch_at_a_time_not_whole_before_the_first_translation(
    translator: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lines = Lines(1_000_000)
    feed(monkeypatch, iter(lines))
    monkeypatch.setattr(zoo.cli, "console", zoo.cli._StdoutConsole(file=ClosedPipe()))
    monkeypatch.setattr(zoo.cli, "_silence_stdout", lambda: None)  # leave the test runner's stdout alone
    assert main(["translate", str(translator), "-", "--max-new-tokens", "2"]) == zoo.cli.EXIT_BROKEN_PIPE
    assert lines.read <= LINES_PER_BATCH  # the first batch was printed before the next was read
