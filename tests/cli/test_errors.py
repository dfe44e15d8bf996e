"""Every user error is one line on stderr and exit status 2, never a traceback: converting a folder onto
itself, a full disk, a `--set` value that is not YAML, pydantic's raw text, text files that are not UTF-8,
negative counts. A bug (an unexpected exception) keeps its traceback."""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import zoo
import zoo.io.atomic
from zoo.cli import main
from zoo.io.hf import to_hf
from zoo.io.tokenizer import train_tokenizer

CORPUS = ["the cat sat on the mat", "the dog sat on the log", "a cat and a dog met on the mat"] * 5


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main([str(arg) for arg in argv])
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line(err: str) -> None:
    assert "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1, err


def digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny zoo checkpoint with its tokenizer; tests copy it before anything could write into it."""
    tokenizer = train_tokenizer(iter(CORPUS), kind="bpe", vocab_size=60, min_frequency=1)
    directory = tmp_path_factory.mktemp("saved") / "gpt"
    zoo.save(zoo.build(zoo.preset("gpt2-tiny").override(vocab_size=64)), directory, tokenizer=tokenizer)
    return directory


@pytest.fixture
def zoo_dir(saved: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(saved, tmp_path / "zoo"))


@pytest.fixture
def hf_dir(saved: Path, tmp_path: Path) -> Path:
    to_hf(zoo.load(saved), tmp_path / "hf", tokenizer=zoo.load_tokenizer(saved))
    return tmp_path / "hf"


# -- zoo convert never writes over what it reads -----------------------------------------------------------


@pytest.mark.parametrize("option", ["--to-hf", "--from-zoo", "--from-hf"])
@pytest.mark.parametrize("spelling", ["same", "symlink", "dot-slash"])
def test_convert_refuses_an_out_that_is_the_source_folder(
    capsys: pytest.CaptureFixture[str],
    zoo_dir: Path,
    hf_dir: Path,
    tmp_path: Path,
    option: str,
    spelling: str,
) -> None:
    source = hf_dir if option == "--from-hf" else zoo_dir
    before = digest(source)
    out = str(source)
    if spelling == "symlink":
        os.symlink(source, tmp_path / "link")
        out = str(tmp_path / "link")
    elif spelling == "dot-slash":
        out = f"{source.parent}/./{source.name}/"
    code, _, err = run(capsys, "convert", option, source, "--out", out)
    assert code == 2
    assert_one_line(err)
    assert f"is the {option} folder" in " ".join(err.split())
    assert digest(source) == before  # nothing written, nothing replaced


def test_convert_from_a_file_refuses_its_own_folder(
    capsys: pytest.CaptureFixture[str], zoo_dir: Path
) -> None:
    code, _, err = run(capsys, "convert", "--from-zoo", zoo_dir / "model.safetensors", "--out", zoo_dir)
    assert code == 2 and "--from-zoo folder" in " ".join(err.split())


def test_convert_to_another_folder_still_works(
    capsys: pytest.CaptureFixture[str], zoo_dir: Path, tmp_path: Path
) -> None:
    code, _, _ = run(capsys, "convert", "--to-hf", zoo_dir, "--out", tmp_path / "elsewhere")
    assert code == 0 and (tmp_path / "elsewhere" / "config.json").is_file()


# -- a full disk names the file ----------------------------------------------------------------------------


def _disk_full(*args: object, **kwargs: object) -> Path:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # as write(2) reports it: no file name


@pytest.mark.parametrize("command", ["tokenizer", "schema", "to-hf", "from-zoo", "plot"])
def test_a_full_disk_is_one_line_that_names_the_output(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    zoo_dir: Path,
    tmp_path: Path,
    command: str,
) -> None:
    text = tmp_path / "corpus.txt"
    text.write_text("\n".join(CORPUS) + "\n", encoding="utf-8")
    out = tmp_path / "written-here"
    argv = {
        "tokenizer": ["tokenizer", "train", text, "--vocab-size", "50", "--out", out],
        "schema": ["schema", "--out", out],
        "to-hf": ["convert", "--to-hf", zoo_dir, "--out", out],
        "from-zoo": ["convert", "--from-zoo", zoo_dir, "--out", out],
        "plot": ["plot", "positions", "--out", out.with_suffix(".png")],
    }[command]
    monkeypatch.setattr(zoo.io.atomic, "write_temp", _disk_full)  # every file zoo writes goes through it
    if command == "plot":  # but a PNG, which matplotlib writes
        matplotlib_figure = pytest.importorskip("matplotlib.figure")
        monkeypatch.setattr(matplotlib_figure.Figure, "savefig", _disk_full)
    code, _, err = run(capsys, *argv)
    assert code == 2
    assert_one_line(err)
    flat = " ".join(err.split())
    assert "the disk is full" in flat and "written-here" in flat


def test_a_full_disk_under_stdout_is_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    class FullDisk:
        def write(self, text: str) -> int:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        def flush(self) -> None:
            pass

    monkeypatch.setattr(sys, "stdout", FullDisk())  # `zoo schema > file` on a full disk
    code = main(["schema"])
    err = capsys.readouterr().err
    assert code == 2
    assert_one_line(err)
    assert "the disk is full" in err


# -- YAML, pydantic, multi-line messages -------------------------------------------------------------------


@pytest.mark.parametrize("value", ["a=[b", "a={x: 1", "a=*alias", "a=!!python/object:os.system x"])
def test_a_set_value_that_is_not_yaml_is_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, value: str
) -> None:
    code, _, err = run(capsys, "train", tmp_path / "any.yaml", "--set", value)
    assert code == 2
    assert_one_line(err)
    assert f"--set {value!r}: the value is not valid YAML" in " ".join(err.split())


def test_a_raw_pydantic_error_is_one_line_without_urls_or_input_reprs(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from zoo.generation import GenerationConfig

    def invalid() -> dict:
        GenerationConfig(num_beams=0, top_k=[1, 2])  # raises pydantic's ValidationError, two fields
        return {}

    monkeypatch.setattr("zoo.spec.json_schema", invalid)
    code, _, err = run(capsys, "schema")
    assert code == 2
    assert_one_line(err)
    flat = " ".join(err.split())
    assert "https://" not in flat and "input_value" not in flat and "[type=" not in flat
    assert "num_beams: num_beams must be an int >= 1, got 0" in flat and "top_k:" in flat


def test_a_multi_line_message_is_printed_on_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    spec = tmp_path / "bad.yaml"
    spec.write_text("family: decoder\nd_model: -3\nfoo: 1\n", encoding="utf-8")
    code, _, err = run(capsys, "show", spec)
    assert code == 2
    assert_one_line(err)
    assert "d_model" in err and "foo" in err


def test_an_unexpected_exception_keeps_its_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    def bug() -> dict:
        raise KeyError("a bug, not a user error")

    monkeypatch.setattr("zoo.spec.json_schema", bug)
    with pytest.raises(KeyError):
        main(["schema"])


# -- zoo tokenizer train --------------------------------------------------------------------------------------


def test_tokenizer_train_names_a_file_that_is_not_utf8(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "latin1.txt"
    path.write_bytes("good line\ncaf\u00e9 au lait\n".encode("latin-1"))
    code, _, err = run(capsys, "tokenizer", "train", path, "--out", tmp_path / "tok.json")
    assert code == 2
    assert_one_line(err)
    assert "latin1.txt:2: not UTF-8 text (byte 0xe9 at byte offset 13)" in " ".join(err.split())


def test_tokenizer_train_refuses_a_negative_min_frequency(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    with pytest.raises(SystemExit) as exit:
        main(["tokenizer", "train", str(tmp_path / "a.txt"), "--out", "t.json", "--min-frequency", "-1"])
    err = capsys.readouterr().err
    assert exit.value.code == 2 and "Traceback" not in err
    assert "argument --min-frequency: invalid value -1 (expected an int >= 0)" in err


def test_tokenizer_train_refuses_to_write_over_its_training_text(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    text = tmp_path / "corpus.txt"
    text.write_text("\n".join(CORPUS) + "\n", encoding="utf-8")
    code, _, err = run(capsys, "tokenizer", "train", text, "--vocab-size", "50", "--out", text)
    assert code == 2
    assert_one_line(err)
    assert text.read_text(encoding="utf-8") == "\n".join(CORPUS) + "\n"


# -- end to end, in a narrow pipe -----------------------------------------------------------------------------


def test_an_error_in_a_narrow_pipe_is_one_line(zoo_dir: Path) -> None:
    env = {**os.environ, "COLUMNS": "40"}
    result = subprocess.run(
        [sys.executable, "-m", "zoo", "convert", "--to-hf", str(zoo_dir), "--out", str(zoo_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=120,
        env=env,
    )
    assert result.returncode == 2
    assert len(result.stdout.strip().splitlines()) == 1, result.stdout
    assert result.stdout.startswith("error: --out ")


@pytest.mark.parametrize(
    "argv",
    [
        ["tokenizer", "encode", "tok.json", "ab\udcffc"],
        ["generate", "ckpt", "--prompt", "ab\udcffc"],
        ["translate", "ckpt", "ab\udcffc"],
    ],
)
def test_text_arguments_that_are_not_utf8_are_argparse_errors(
    capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    """A terminal in another encoding passes bytes Python keeps as lone surrogates; the tokenizer raised
    TypeError("TextInputSequence must be str") on them."""
    with pytest.raises(SystemExit) as exit:
        main(argv)
    err = capsys.readouterr().err
    assert exit.value.code == 2 and "not UTF-8 text (byte 0xff at character 2)" in err


def test_running_out_of_gpu_memory_is_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    def out_of_memory() -> dict:
        raise torch.cuda.OutOfMemoryError(
            "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.11 GiB of which "
            "1.25 GiB is free. Of the allocated memory 70.2 GiB is allocated by PyTorch. See documentation for "
            "Memory Management (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
        )

    monkeypatch.setattr("zoo.spec.json_schema", out_of_memory)
    code, _, err = run(capsys, "schema")
    assert code == 2
    assert_one_line(err)
    flat = " ".join(err.split())
    assert "CUDA out of memory. Tried to allocate 2.00 GiB" in flat and "https://" not in flat


def test_a_set_value_with_an_alias_bomb_is_refused_in_one_line(capsys) -> None:
    from zoo.cli import main

    bomb = (
        "[&a [x,x,x,x,x,x,x,x,x], &b [*a,*a,*a,*a,*a,*a,*a,*a,*a], "
        + ", ".join(f"&c{i} [*b,*b,*b,*b,*b,*b,*b,*b,*b]" for i in range(120))
        + "]"
    )
    code = main(["train", "examples/translate.yaml", "--set", f"model.overrides={bomb}", "--max-steps", "1"])
    err = capsys.readouterr().err
    assert code == 2 and "aliases" in err and len(err.strip().splitlines()) == 1


# -- a missing folder is a missing folder, not a Hugging Face Hub id -----------------------------------------


@pytest.mark.parametrize(
    "command",
    [
        ["generate", "runs/demo", "--prompt", "hi"],
        ["translate", "runs/demo", "hi"],
        ["chat", "runs/demo"],
        ["serve", "runs/demo", "--port", "0"],
        ["eval", "runs/demo", "--tasks", "hellaswag"],
        ["embed", "runs/demo", "--input", "-", "--out", "vectors.npy"],
        ["show", "runs/demo"],
        ["convert", "--from-hf", "runs/demo", "--out", "out"],
    ],
)
def test_a_missing_folder_under_a_folder_here_is_no_such_folder_not_a_hub_id(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: list[str]
) -> None:
    """``runs/demo`` reads as a Hub id (``org/name``), but ``runs/`` is a folder here: the user meant a path
    (embed, show and convert said it "is not in the Hugging Face cache", and to run `hf download runs/demo`)."""
    if command[0] == "eval":
        pytest.importorskip("lm_eval")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    (tmp_path / "runs").mkdir()
    code, _, err = run(capsys, *command)
    assert code == 2
    assert_one_line(err)
    assert "runs/demo: no such folder" in err, err
    assert "Hugging Face cache" not in err and "hf download" not in err
