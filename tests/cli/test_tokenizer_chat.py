"""``zoo tokenizer chat``: the prompt a tokenizer's chat template makes of a conversation, as text or ids."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from zoo.cli import main
from zoo.io.tokenizer import Tokenizer, train_tokenizer

CHAT = [{"role": "user", "content": "hello \x1b[2Jthere"}, {"role": "assistant", "content": "how are you"}]


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    tok = train_tokenizer(iter(["hello there", "how are you"] * 30), kind="bpe", vocab_size=80)
    tok.save_pretrained(tmp_path / "tok")
    (tmp_path / "chat.json").write_text(json.dumps(CHAT), encoding="utf-8")
    return tmp_path


def test_zoo_tokenizer_chat_prints_the_prompt_and_its_ids(
    folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tok = Tokenizer.from_file(folder / "tok")
    assert (
        main(["tokenizer", "chat", str(folder / "tok"), str(folder / "chat.json"), "--generation-prompt"])
        == 0
    )
    expected = tok.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    assert capsys.readouterr().out == expected.replace("\x1b[2J", "") + "\n"  # no escape reaches the terminal
    assert main(["tokenizer", "chat", str(folder / "tok"), str(folder / "chat.json"), "--ids"]) == 0
    assert capsys.readouterr().out.split("\n")[0] == " ".join(map(str, tok.apply_chat_template(CHAT)))


def test_zoo_tokenizer_chat_reads_stdin_and_names_a_bad_message(
    folder: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(json.dumps([{"role": "user"}])))
    assert main(["tokenizer", "chat", str(folder / "tok"), "-"]) == 2
    assert "messages[0]['content'] is missing" in capsys.readouterr().err
    template = folder / "t.jinja"
    template.write_text("{% for m in messages %}{{ m['content'] | upper }}|{% endfor %}", encoding="utf-8")
    monkeypatch.setattr("sys.stdin", io.StringIO(json.dumps(CHAT)))
    assert main(["tokenizer", "chat", str(folder / "tok"), "-", "--template", str(template)]) == 0
    assert capsys.readouterr().out == "HELLO THERE|HOW ARE YOU|\n"
