"""The options every command shares: one ``--dtype`` vocabulary, ``--device auto``, and `zoo.load`'s
device check before anything is read."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import torch

import zoo
import zoo.io.checkpoint.loading
from zoo.cli import build_parser, main
from zoo.cli.options import DTYPE_CHOICES, parse_device, parse_dtype

SPELLINGS = {
    "fp32": "float32",
    "float32": "float32",
    "bf16": "bfloat16",
    "bfloat16": "bfloat16",
    "fp16": "float16",
    "float16": "float16",
}
no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a machine without CUDA")


def subcommand_actions(
    parser: argparse.ArgumentParser, path: str = "zoo"
) -> dict[str, list[argparse.Action]]:
    """Every (sub)command's parser, by its command line, with its actions."""
    found = {path: parser._actions}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found |= subcommand_actions(sub, f"{path} {name}")
    return found


@pytest.mark.parametrize("spelling", list(SPELLINGS))
def test_every_dtype_spelling_names_its_torch_dtype(spelling: str) -> None:
    assert parse_dtype(spelling) == SPELLINGS[spelling] and hasattr(torch, SPELLINGS[spelling])
    assert parse_dtype(spelling.upper()) == SPELLINGS[spelling]
    assert set(DTYPE_CHOICES) == set(SPELLINGS)


@pytest.mark.parametrize("text", ["int8", "float64", "half", "bf", ""])
def test_a_dtype_outside_the_vocabulary_is_refused_with_the_choices(text: str) -> None:
    with pytest.raises(
        argparse.ArgumentTypeError, match="choose from fp32, float32, bf16, bfloat16, fp16, float16"
    ):
        parse_dtype(text)


def test_every_dtype_option_of_every_command_is_the_shared_one() -> None:
    commands = {
        command: action
        for command, actions in subcommand_actions(build_parser()).items()
        for action in actions
        if "--dtype" in action.option_strings
    }
    assert {"zoo show", "zoo convert", "zoo generate", "zoo translate"} <= set(commands)
    assert all(action.type is parse_dtype for action in commands.values()), commands


@pytest.mark.parametrize("command", [["generate", "DIR", "--prompt", "hi"], ["translate", "DIR", "hallo"]])
def test_device_defaults_to_auto(command: list[str]) -> None:
    args = build_parser().parse_args(command)
    assert args.device == "auto"
    assert build_parser().parse_args([*command, "--device", "cuda:1"]).device == "cuda:1"


@pytest.mark.parametrize("text", ["auto", "cpu", "cuda", "cuda:1", "mps"])
def test_device_strings_torch_knows_are_kept(text: str) -> None:
    assert parse_device(text) == text


@pytest.mark.parametrize("text", ["gpu", "cuda:x", "CPU", ""])
def test_an_unknown_device_is_a_one_line_usage_error(capsys, text: str) -> None:
    with pytest.raises(SystemExit) as exit:
        main(["generate", "DIR", "--prompt", "hi", "--device", text])
    err = capsys.readouterr().err
    assert exit.value.code == 2 and "Traceback" not in err
    assert f"invalid device {text!r}" in err and "auto, cpu, cuda" in err


@no_cuda
def test_load_on_cuda_without_cuda_says_so_before_reading_anything(monkeypatch, tmp_path: Path) -> None:
    zoo.save(zoo.build("gpt2-tiny"), tmp_path)

    def must_not_read(path: object) -> None:
        raise AssertionError(f"zoo.load read {path} before checking the device")

    monkeypatch.setattr(zoo.io.checkpoint.loading, "open_checkpoint", must_not_read)
    with pytest.raises(ValueError, match="CUDA is not available"):
        zoo.load(tmp_path, device="cuda")
    with pytest.raises(ValueError, match="CUDA is not available"):
        zoo.load(tmp_path, device=torch.device("cuda", 0))


def test_load_with_device_auto_places_the_model_where_cuda_would_go(tmp_path: Path) -> None:
    zoo.save(zoo.build("gpt2-tiny"), tmp_path)
    model = zoo.load(tmp_path, device="auto")
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert {p.device.type for p in model.parameters()} == {expected}


@pytest.mark.parametrize("spelling", ["bf16", "bfloat16"])
def test_convert_casts_with_either_spelling(tmp_path: Path, spelling: str) -> None:
    zoo.save(zoo.build("gpt2-tiny"), tmp_path / "a")
    argv = ["convert", "--from-zoo", str(tmp_path / "a"), "--out", str(tmp_path / "b"), "--dtype", spelling]
    assert main(argv) == 0
    assert {p.dtype for p in zoo.load(tmp_path / "b").parameters()} == {torch.bfloat16}


@pytest.mark.parametrize("text", ["xla", "hpu", "meta", "cpu:1", "ipu"])
def test_a_device_zoo_does_not_run_on_is_a_usage_error_before_loading(capsys, text: str) -> None:
    """torch.device parses these; loading weights onto them failed with a page of dispatcher text."""
    with pytest.raises(SystemExit) as exit:
        main(["generate", "DIR", "--prompt", "hi", "--device", text])
    err = capsys.readouterr().err
    assert (
        exit.value.code == 2 and f"invalid device {text!r} (expected auto, cpu, cuda, cuda:N or mps)" in err
    )
