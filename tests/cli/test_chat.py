"""`zoo chat`: at a terminal (a pseudo-terminal of the stdlib `pty`, the child's controlling terminal, so
that Ctrl-C is the terminal's own SIGINT) and piped; answers are `ChatSession`'s, which are `generate`'s."""

from __future__ import annotations

import io
import os
import select
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from chat_support import ANSWER, chat_tokenizer, endless_model, save_chat_model, trained_model

import zoo
from zoo.cli import main
from zoo.generation import ChatSession

ROOT = Path(__file__).resolve().parents[2]

# The child makes the pty on its stdin its controlling terminal (a new session), then runs `python -m zoo`.
LAUNCH = (
    "import os, runpy, sys; os.login_tty(os.dup(0)); sys.argv = ['zoo', *sys.argv[1:]]; "
    "runpy.run_module('zoo', run_name='__main__', alter_sys=True)"
)


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("chat")
    tokenizer = chat_tokenizer()
    return {
        "trained": save_chat_model(trained_model(tokenizer), tokenizer, root / "trained"),
        "endless": save_chat_model(endless_model(tokenizer), tokenizer, root / "endless"),
    }


class Terminal:
    """``zoo ARGS`` on a pseudo-terminal: `send` types, `expect` reads until a text appears."""

    def __init__(self, *args: str) -> None:
        master, slave = os.openpty()
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
            "TERM": "dumb",  # no colours, no bracketed-paste sequences from readline
            "INPUTRC": os.devnull,
            "OMP_NUM_THREADS": "1",
            "HF_HUB_OFFLINE": "1",
        }
        self.process = subprocess.Popen(
            [sys.executable, "-c", LAUNCH, *args], stdin=slave, stdout=slave, stderr=slave, env=env
        )
        os.close(slave)
        self.fd = master
        self.seen = ""  # everything read so far, "\r\n" as "\n"
        self.read = 0  # where the next `expect` starts looking

    def send(self, text: str) -> None:
        os.write(self.fd, text.encode())

    def expect(self, text: str, timeout: float = 15.0) -> str:
        """Read until ``text`` appears after the last match; returns what came before it."""
        deadline = time.monotonic() + timeout
        while (at := self.seen.find(text, self.read)) < 0:
            left = deadline - time.monotonic()
            if left <= 0 or not self._pull(left):
                raise AssertionError(f"{text!r} did not appear; the terminal shows:\n{self.seen}")
        before, self.read = self.seen[self.read : at], at + len(text)
        return before

    def _pull(self, timeout: float) -> bool:
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if not ready:
            return False
        try:
            chunk = os.read(self.fd, 4096)
        except OSError:  # EIO: the child has gone and closed the terminal
            return False
        self.seen += chunk.decode(errors="replace").replace("\r\n", "\n")
        return bool(chunk)

    def wait(self, timeout: float = 15.0) -> int:
        while self._pull(0.1):  # drain, so the child never blocks on a full terminal
            pass
        status = self.process.wait(timeout)
        os.close(self.fd)
        return status

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


@pytest.fixture
def terminal():
    opened: list[Terminal] = []

    def open_terminal(*args: str) -> Terminal:
        opened.append(Terminal(*args))
        return opened[-1]

    yield open_terminal
    for term in opened:
        term.kill()


def test_ctrl_c_stops_the_answer_and_the_chat_goes_on_until_ctrl_d(folders, terminal) -> None:
    folder = folders["endless"]
    model, tokenizer = zoo.load(folder), zoo.load_tokenizer(folder)
    prompt = ChatSession(model, tokenizer).prompt_ids("hello")
    greedy = model.generate(torch.tensor([prompt]), max_new_tokens=200)[0, len(prompt) :]
    term = terminal("chat", str(folder), "--max-new-tokens", "4000", "--device", "cpu")
    term.expect("> ")
    term.send("hello\n")
    term.expect("hello\n")  # the terminal's echo
    while len(term.seen) - term.read < 40:  # the answer is streaming (4000 tokens: seconds more to go)
        assert term._pull(15), term.seen
    term.send("\x03")
    # The terminal echoes "^C" and drops what it had not passed on yet (Linux flushes its output queue on
    # an interrupt): what came before is the answer's beginning, what follows a later part of it.
    said, _, after = term.expect("(stopped)").partition("^C")
    assert len(said.strip()) >= 40 and tokenizer.decode(greedy.tolist()).startswith(said.strip())
    assert len(after.strip()) < 400  # it stopped soon after, far from the 4000 tokens asked for
    term.expect("> ")  # the prompt is back, the session goes on
    term.send("/system be brief\n")
    term.expect("system prompt set; conversation cleared")
    term.expect("> ")
    term.send("/reset\n")
    term.expect("conversation cleared")
    term.expect("> ")
    term.send("/help\n")
    term.expect("/system TEXT")
    term.expect("> ")
    term.send("\x04")  # Ctrl-D at the prompt
    assert term.wait() == 0


@pytest.mark.slow  # a second terminal: the answers of a trained model, and Ctrl-C at the prompt
def test_at_a_terminal_whole_answers_stream_and_ctrl_c_at_the_prompt_leaves(folders, terminal) -> None:
    folder = folders["trained"]
    expected = ChatSession(zoo.load(folder), zoo.load_tokenizer(folder), max_new_tokens=24)
    term = terminal("chat", str(folder), "--max-new-tokens", "24", "--device", "cpu")
    term.expect("/help lists the commands")
    for question in ("hello there", "who are you"):
        term.expect("> ")
        term.send(question + "\n")
        term.expect(question + "\n")
        assert term.expect("\n> ").strip() == "".join(expected.reply(question)) == ANSWER
        term.read -= len("> ")
    term.expect("> ")
    term.send("\x03")  # Ctrl-C at the prompt: leave, as an interrupted command does
    term.expect("interrupted")
    assert term.wait() == 130


def _typed(monkeypatch: pytest.MonkeyPatch, lines: list[str | type[BaseException]]) -> None:
    """A terminal's stdin for an in-process run: `input` returns ``lines`` (or raises), then EOF."""
    answers = iter(lines)

    def typed(prompt: str = "") -> str:
        sys.stdout.write(prompt)
        line = next(answers, EOFError)
        if isinstance(line, type):
            raise line
        return line

    monkeypatch.setattr("builtins.input", typed)
    monkeypatch.setattr(sys, "stdin", SimpleNamespace(isatty=lambda: True))


def test_typed_messages_are_answered_after_the_prompt(folders, monkeypatch, capsys) -> None:
    folder = folders["trained"]
    expected = ChatSession(zoo.load(folder), zoo.load_tokenizer(folder), max_new_tokens=24)
    answers = ["".join(expected.reply(q)) for q in ("hello there", "who are you")]
    _typed(monkeypatch, ["hello there", "", "who are you", "/nope"])
    assert main(["chat", str(folder), "--max-new-tokens", "24", "--device", "cpu"]) == 0  # EOF: 0
    captured = capsys.readouterr()
    assert captured.out == f"> {answers[0]}\n> > {answers[1]}\n> > \n"
    assert answers == [ANSWER, ANSWER]
    assert "unknown command /nope" in captured.err


def test_ctrl_c_at_the_prompt_ends_the_chat_with_130(folders, monkeypatch, capsys) -> None:
    _typed(monkeypatch, ["hello there", KeyboardInterrupt])
    assert main(["chat", str(folders["trained"]), "--max-new-tokens", "24", "--device", "cpu"]) == 130
    captured = capsys.readouterr()
    assert captured.out == f"> {ANSWER}\n> \n" and "interrupted" in captured.err


def test_at_a_terminal_an_error_is_a_line_and_the_chat_goes_on(folders, monkeypatch, capsys) -> None:
    _typed(monkeypatch, ["the cat sat on the mat " * 20, "hello there"])
    assert main(["chat", str(folders["trained"]), "--max-new-tokens", "64", "--device", "cpu"]) == 0
    captured = capsys.readouterr()
    assert "error: the message is too long" in captured.err
    assert captured.out == f"> > {ANSWER}\n> \n"


def _stdin(monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    stream = SimpleNamespace(buffer=io.BytesIO(text.encode()), isatty=lambda: False)
    monkeypatch.setattr(sys, "stdin", stream)


def test_piped_each_line_is_a_message_and_each_answer_a_line(folders, monkeypatch, capsys) -> None:
    folder = folders["endless"]
    session = ChatSession(zoo.load(folder), zoo.load_tokenizer(folder), max_new_tokens=8)
    expected = ["".join(session.reply("hello")), "".join(session.reply("what did the dog do"))]
    session.reset()
    expected.append("".join(session.reply("hello")))
    assert expected[0] == expected[2] != expected[1]  # the reset conversation answers as the first did
    _stdin(monkeypatch, "hello\n\nwhat did the dog do\n/reset\nhello\n")
    assert main(["chat", str(folder), "--max-new-tokens", "8", "--device", "cpu"]) == 0
    captured = capsys.readouterr()
    assert captured.out.split("\n") == [*expected, ""]
    assert "conversation cleared" in captured.err


def test_piped_the_system_prompt_is_rendered_into_the_conversation(folders, monkeypatch, capsys) -> None:
    folder = folders["endless"]
    session = ChatSession(zoo.load(folder), zoo.load_tokenizer(folder), system="be brief", max_new_tokens=6)
    expected = "".join(session.reply("hello"))
    session.set_system("talk like a cat")
    other = "".join(session.reply("hello"))
    _stdin(monkeypatch, "hello\n/system talk like a cat\nhello\n/exit\nhello\n")
    argv = ["chat", str(folder), "--system", "be brief", "--max-new-tokens", "6", "--device", "cpu"]
    assert main(argv) == 0
    assert capsys.readouterr().out.split("\n") == [expected, other, ""]  # nothing after /exit


def test_the_oldest_turns_are_dropped_and_said_once(folders, monkeypatch, capsys) -> None:
    _stdin(monkeypatch, "hello there\n" * 6)
    assert main(["chat", str(folders["trained"]), "--max-new-tokens", "80", "--device", "cpu"]) == 0
    captured = capsys.readouterr()
    assert captured.out.count("\n") == 6
    assert captured.err.count("oldest turns are dropped") == 1
    assert "max_positions (128) - max_new_tokens (80) = 48" in captured.err


def test_models_that_cannot_chat_are_one_line_errors(folders, tmp_path, capsys, monkeypatch) -> None:
    tokenizer = chat_tokenizer()
    spec = zoo.preset("transformer-tiny").override(vocab_size=tokenizer.vocab_size, num_layers=1)
    zoo.save(zoo.build(spec), tmp_path / "mt", tokenizer=tokenizer)
    assert main(["chat", str(tmp_path / "mt"), "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "holds an encoder-decoder model; `zoo chat` needs a decoder model (try `zoo translate`)" in err
    assert len(err.strip().splitlines()) == 1
    assert main(["chat", str(tmp_path / "missing")]) == 2
    assert "no such folder" in capsys.readouterr().err
    _stdin(monkeypatch, "hello\n")
    assert main(["chat", str(folders["trained"]), "--max-new-tokens", "0", "--device", "cpu"]) == 2
    assert "max_new_tokens must be an int >= 1" in capsys.readouterr().err
    _stdin(monkeypatch, "the cat sat on the mat " * 20 + "\n")
    assert main(["chat", str(folders["trained"]), "--max-new-tokens", "64", "--device", "cpu"]) == 2
    assert "the message is too long" in capsys.readouterr().err


def test_weights_with_nan_are_refused_before_the_chat(folders, tmp_path, capsys) -> None:
    model = zoo.load(folders["trained"])
    with torch.no_grad():
        model.lm_head.weight[0, 0] = float("nan")
    save_chat_model(model, zoo.load_tokenizer(folders["trained"]), tmp_path / "nan")
    assert main(["chat", str(tmp_path / "nan"), "--device", "cpu"]) == 2
    assert "lm_head.weight holds NaN or inf" in capsys.readouterr().err


def test_sampling_flags_sample_and_temperature_zero_is_greedy(folders, monkeypatch, capsys) -> None:
    """As `zoo generate`: --temperature (or --top-k, --top-p) samples without --sample; 0 is greedy search."""
    from zoo.cli import build_parser
    from zoo.cli.chat import open_session

    folder = str(folders["trained"])
    session = open_session(
        build_parser().parse_args(["chat", folder, "--temperature", "0.7", "--device", "cpu"])
    )
    assert session.config.do_sample and session.config.temperature == 0.7
    _stdin(monkeypatch, "hello there\n")
    assert main(["chat", folder, "--temperature", "0", "--max-new-tokens", "24", "--device", "cpu"]) == 0
    assert capsys.readouterr().out == f"{ANSWER}\n"


def test_a_hugging_face_folder_chats_as_its_zoo_checkpoint(folders, tmp_path, monkeypatch, capsys) -> None:
    folder = folders["trained"]
    hf = zoo.to_hf(zoo.load(folder), tmp_path / "hf", tokenizer=zoo.load_tokenizer(folder))
    answers = []
    for target in (folder, hf):
        _stdin(monkeypatch, "hello there\nwho are you\n")
        assert main(["chat", str(target), "--max-new-tokens", "24", "--device", "cpu"]) == 0
        answers.append(capsys.readouterr().out)
    assert answers[0] == answers[1] == f"{ANSWER}\n{ANSWER}\n"
