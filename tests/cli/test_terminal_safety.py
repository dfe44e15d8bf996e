"""No file can send escape sequences to the terminal: spec names, tokens, generated text, file names in error
messages are printed without control characters (`zoo.cli.sanitize`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models, pre_tokenizers

import zoo
from zoo.cli import main
from zoo.io.tokenizer import SPECIAL_TOKENS, Tokenizer

# Clear the screen, retitle the window (OSC ... BEL), an 8-bit CSI, a carriage return that hides text.
HOSTILE = "\x1b[2J\x1b]0;pwned\x07\x9b31mevil\rname"
CONTROLS = set("\x1b\x07\x9b\r")


def hostile_tokenizer(vocab_size: int) -> Tokenizer:
    """Every ordinary token is an escape sequence: whatever the model generates, it prints them."""
    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS.values())}
    vocab |= {f"\x1b]0;pwned{i}\x07": i for i in range(len(vocab), vocab_size)}
    hf = HFTokenizer(models.WordLevel(vocab, unk_token=SPECIAL_TOKENS["unk"]))
    hf.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return Tokenizer(hf)


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A checkpoint whose spec name and every token carry escape sequences."""
    spec = zoo.preset("gpt2-tiny").override(vocab_size=64, name=HOSTILE)
    directory = tmp_path_factory.mktemp("hostile") / "ckpt"
    zoo.save(zoo.build(spec), directory, tokenizer=hostile_tokenizer(64))
    return directory


def commands(directory: Path, tmp: Path) -> dict[str, list[str]]:
    d = str(directory)
    return {
        "show": ["show", d],
        "diff": ["diff", d, "gpt2-tiny"],
        "diff --json": ["diff", d, "gpt2-tiny", "--json"],
        "convert": ["convert", "--to-hf", d, "--out", str(tmp / "hf")],
        "tokenizer encode": ["tokenizer", "encode", d, "\x1b]0;pwned7\x07 \x1b]0;pwned9\x07"],
        "generate": ["generate", d, "--prompt", "\x1b]0;pwned7\x07", "--max-new-tokens", "4", "--no-bos"],
        "error naming a file": ["show", str(tmp / f"{HOSTILE}.yaml")],
    }


@pytest.mark.parametrize(
    "command",
    ["show", "diff", "diff --json", "convert", "tokenizer encode", "generate", "error naming a file"],
)
def test_no_control_character_from_a_file_reaches_the_terminal(
    hostile: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    main(commands(hostile, tmp_path)[command])
    out, err = capsys.readouterr()
    assert out or err
    leaked = CONTROLS & set(out + err)
    assert not leaked, f"{sorted(map(hex, map(ord, leaked)))} in {out + err!r}"


def test_show_still_prints_the_name_without_its_escapes(
    hostile: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["show", str(hostile)]) == 0
    assert "evilname (decoder)" in capsys.readouterr().out  # "\x9b31m" is an 8-bit CSI: dropped whole


def test_diff_json_keeps_the_data_exact(hostile: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diff", str(hostile), "gpt2-tiny", "--json"]) == 1
    rows = json.loads(capsys.readouterr().out)
    assert {
        "field": "name",
        "a": HOSTILE,
        "b": None,
        "metadata": True,
    } in rows  # escaped in the text, whole in the data


def test_clean_drops_escape_sequences_and_controls_but_keeps_text() -> None:
    from zoo.cli.sanitize import clean

    assert clean("\x1b[1;31mred\x1b[0m") == "red"
    assert clean("\x1b]0;title\x07after") == "after"
    assert clean("\x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\") == "link"  # OSC 8 hyperlink, ST-terminated
    assert clean("\x1bPdevice control\x1b\\ok") == "ok"
    assert clean("a\x1bcb") == "ab"  # RIS (reset), a two-character sequence
    assert clean("bell\x07 back\x08space del\x7f c1\x85") == "bell backspace del c1"
    assert clean("8-bit \x9b1;31mcsi\x9d0;title\x9c osc") == "8-bit csi osc"
    assert clean("over\rwrite") == "overwrite"
    assert clean("tab\tand\nnewline ▁고양이 café") == "tab\tand\nnewline ▁고양이 café"


def test_json_text_escapes_c1_controls_and_stays_the_same_data() -> None:
    from zoo.cli.sanitize import json_text

    data = {"name": "a\x9b31mb\x85c\x1bd", "ok": "▁고양이"}
    text = json_text(data)
    assert not set("\x9b\x85\x1b") & set(text)
    assert "▁고양이" in text and json.loads(text) == data


def test_library_warnings_reach_the_terminal_without_controls(capsys: pytest.CaptureFixture[str]) -> None:
    """`zoo train` shows the library's warnings (which quote data files) through rich, cleaned."""
    import logging

    from zoo.cli.train import setup_logging

    setup_logging()
    logging.getLogger("zoo.training").warning("skipped line %d: %s", 3, HOSTILE)
    err = capsys.readouterr().err
    assert "skipped line 3" in err and not CONTROLS & set(err)


def test_plot_masks_names_its_default_file_without_controls_or_separators(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("matplotlib")
    spec = tmp_path / "spec.json"
    spec.write_text(zoo.preset("gpt2-tiny").override(name="../\x1b[2Jevil/name").to_json(), encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    assert main(["plot", "masks", str(spec)]) == 0
    out = capsys.readouterr().out
    assert not CONTROLS & set(out)
    assert [p.name for p in tmp_path.glob("*.png")] == ["masks-_evil_name.png"]
