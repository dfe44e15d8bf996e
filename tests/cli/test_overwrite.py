"""``zoo convert``, ``zoo quantize`` and ``zoo export`` (and `zoo.to_hf`, `zoo.lora.to_peft`, the export
functions) never write over a training run, a zoo model or a file of another kind without ``--overwrite``;
an earlier output of their own kind is replaced, files zoo does not know are left alone."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

import zoo
import zoo.lora
from zoo.cli import main
from zoo.export import export_program, save_program
from zoo.io.outputs import OutputExistsError

PRESET = "gpt2-tiny"


def one_line(text: str) -> str:
    return " ".join(text.split())  # rich folds long lines


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def run(tmp_path: Path) -> Path:
    """What a finished training run holds: its records, a checkpoint, the final zoo model."""
    folder = tmp_path / "run"
    torch.manual_seed(0)
    zoo.save(zoo.build(PRESET), folder)
    zoo.save(zoo.build(PRESET), folder / "checkpoints" / "step-00000002")
    for name in ("metrics.jsonl", "run.json", "train_config.yaml"):
        (folder / name).write_text("{}\n")
    return folder


@pytest.mark.parametrize(
    ("command", "writer"),
    [
        (["convert", "--to-hf", PRESET], "zoo convert --to-hf"),
        (["convert", "--from-zoo", PRESET], "zoo convert --from-zoo"),
        (["quantize", PRESET], "zoo quantize"),
    ],
)
def test_a_training_run_is_refused_by_name_and_left_as_it_was(
    run: Path, command: list[str], writer: str, capsys: pytest.CaptureFixture[str]
) -> None:
    before = snapshot(run)
    assert main([*command, "--out", str(run)]) == 2
    err = one_line(capsys.readouterr().err)
    assert f"error: {run} holds a zoo checkpoint and a folder (checkpoints/, " in err
    assert f"which {writer} does not write" in err and "(--overwrite:" in err
    assert snapshot(run) == before


def test_export_refuses_a_file_of_another_kind(run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    weights = run / "model.safetensors"
    before = weights.read_bytes()
    assert main(["export", PRESET, "--out", str(weights), "--format", "torch"]) == 2
    err = one_line(capsys.readouterr().err)
    assert f"error: {weights} already exists and is not a torch.export program" in err
    assert "(--overwrite)" in err
    assert weights.read_bytes() == before


@pytest.mark.slow  # a trace and an export: the functions' own test below checks the replacing quickly
def test_export_with_overwrite_replaces_a_file_of_another_kind(tmp_path: Path) -> None:
    notes = tmp_path / "notes.pt2"
    notes.write_text("my notes")
    assert main(["export", PRESET, "--out", str(notes), "--overwrite"]) == 0
    assert notes.read_bytes()[:2] == b"PK"  # a torch.export archive now
    assert main(["export", PRESET, "--out", str(notes), "--length", "4"]) == 0  # a rerun: replaced


def test_convert_to_hf_replaces_an_earlier_export_and_leaves_other_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "hf"
    assert main(["convert", "--to-hf", PRESET, "--out", str(out)]) == 0
    (out / "README.md").write_text("a model card")
    assert main(["convert", "--to-hf", PRESET, "--out", str(out)]) == 0  # a rerun
    assert (out / "README.md").read_text() == "a model card"
    capsys.readouterr()
    # ... but a zoo conversion over it would mix two kinds of model in one folder
    assert main(["convert", "--from-zoo", PRESET, "--out", str(out)]) == 2
    assert "holds a Hugging Face checkpoint (config.json" in one_line(capsys.readouterr().err)


def test_a_zoo_checkpoint_is_replaced_only_with_overwrite(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "zoo"
    assert main(["convert", "--from-zoo", PRESET, "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["convert", "--from-zoo", PRESET, "--out", str(out), "--dtype", "bf16"]) == 2
    err = one_line(capsys.readouterr().err)
    assert (
        "holds a zoo checkpoint (model.safetensors, spec.json), which zoo convert --from-zoo would replace"
        in err
    )
    assert main(["convert", "--from-zoo", PRESET, "--out", str(out), "--dtype", "bf16", "--overwrite"]) == 0
    assert next(zoo.load(out).parameters()).dtype == torch.bfloat16


def test_overwrite_replaces_the_model_and_keeps_the_run(run: Path) -> None:
    assert main(["convert", "--to-hf", PRESET, "--out", str(run), "--overwrite"]) == 0
    assert not (run / "spec.json").exists()  # one model in the folder: the zoo one's spec is gone
    assert (run / "config.json").is_file() and zoo.from_hf(run).num_parameters() > 0
    assert (run / "checkpoints" / "step-00000002" / "spec.json").is_file()  # the run itself is untouched
    assert (run / "metrics.jsonl").read_text() == "{}\n"


def test_the_refusal_comes_before_anything_is_loaded(run: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "spec.json").write_text("not json")
    with pytest.raises(OutputExistsError):
        main_raising(["convert", "--to-hf", str(broken), "--out", str(run)])


def main_raising(argv: list[str]) -> None:
    """Run ``argv``'s command and let its error through (main would print it)."""
    from zoo.cli import build_parser

    args = build_parser().parse_args(argv)
    args.run(args)


# --- the Python functions -----------------------------------------------------------------------------------


def test_to_hf_refuses_a_zoo_model_unless_overwrite(tmp_path: Path) -> None:
    model = zoo.build(PRESET)
    zoo.save(model, tmp_path)
    with pytest.raises(OutputExistsError, match=r"holds a zoo checkpoint \(spec\.json\).*overwrite=True"):
        zoo.to_hf(model, tmp_path)
    assert zoo.load(tmp_path).num_parameters() == model.num_parameters()  # untouched
    zoo.to_hf(model, tmp_path, overwrite=True)
    assert not (tmp_path / "spec.json").exists()


def test_to_peft_refuses_a_model_folder(tmp_path: Path) -> None:
    model = zoo.build(PRESET)
    zoo.to_hf(model, tmp_path)
    zoo.lora.apply(model, r=2, alpha=4)
    with pytest.raises(OutputExistsError, match=r"holds a Hugging Face checkpoint .*zoo\.lora\.to_peft"):
        zoo.lora.to_peft(model, tmp_path)
    zoo.lora.to_peft(model, tmp_path / "adapters")
    zoo.lora.to_peft(model, tmp_path / "adapters")  # an earlier export of its own: replaced


def test_save_program_refuses_a_file_that_is_no_program(tmp_path: Path) -> None:
    model = zoo.build(PRESET).eval()
    target = tmp_path / "weights.pt2"
    target.write_bytes(b"\x08\x00 something else")
    program = export_program(model)
    with pytest.raises(OutputExistsError, match=r"is not a torch\.export program .*overwrite=True"):
        save_program(program, target)
    save_program(program, target, overwrite=True)
    save_program(program, target)  # now an earlier program: replaced


@pytest.mark.skipif(importlib.util.find_spec("onnxscript") is None, reason="needs the onnx extra")
def test_export_onnx_refuses_a_file_that_is_no_onnx_model(tmp_path: Path) -> None:
    from zoo.export import export_onnx

    target = tmp_path / "model.onnx"
    zoo.save(zoo.build(PRESET), tmp_path)
    (tmp_path / "model.safetensors").rename(target)
    with pytest.raises(OutputExistsError, match=r"is not an ONNX model"):
        export_onnx(zoo.build(PRESET).eval(), target)
