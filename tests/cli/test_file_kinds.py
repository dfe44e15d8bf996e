"""A file or folder of another kind than a command takes is one line saying what it is and which command
takes it (`zoo.cli.kinds`), not pydantic's list of every field it lacks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

import zoo
from zoo.cli import kinds, main

ROOT = Path(__file__).resolve().parents[2]
SPEC_FILE = ROOT / "examples" / "my_stack.yaml"
TRAIN_CONFIG = ROOT / "examples" / "translate.yaml"


def one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err and "Extra inputs" not in err and "discriminator" not in err, err
    return lines[0]


@pytest.fixture
def run_folder(tmp_path: Path) -> Path:
    """What a training run leaves: the model (zoo.save) and its train_config.yaml."""
    run = tmp_path / "run"
    zoo.save(zoo.build("gpt2-tiny"), run)
    (run / "train_config.yaml").write_text(TRAIN_CONFIG.read_text(encoding="utf-8"), encoding="utf-8")
    return run


@pytest.fixture
def hf_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": 2}), encoding="utf-8")
    return folder


def test_train_on_a_spec_says_it_is_a_spec_and_which_command_shows_it(capsys) -> None:
    assert main(["train", str(SPEC_FILE)]) == 2
    line = one_error_line(capsys)
    assert f"{SPEC_FILE} is a model spec, not a training config" in line
    assert f"zoo show {SPEC_FILE}" in line and f"model: {{file: {SPEC_FILE}}}" in line


def test_show_on_a_training_config_says_zoo_train_runs_it(capsys) -> None:
    assert main(["show", str(TRAIN_CONFIG)]) == 2
    line = one_error_line(capsys)
    assert f"{TRAIN_CONFIG} is a training config, not a model spec or checkpoint" in line
    assert f"zoo train {TRAIN_CONFIG}" in line


def test_diff_names_the_side_that_is_a_training_config(capsys) -> None:
    assert main(["diff", "gpt2", str(TRAIN_CONFIG)]) == 2
    assert f"{TRAIN_CONFIG} is a training config" in one_error_line(capsys)


def test_train_on_a_run_folder_names_the_config_that_continues_it(capsys, run_folder: Path) -> None:
    assert main(["train", str(run_folder)]) == 2
    line = one_error_line(capsys)
    assert f"{run_folder} is a training run's folder, not a training config" in line
    assert f"zoo train {run_folder / 'train_config.yaml'} --resume" in line


def test_show_on_a_tokenizer_says_a_training_config_reuses_it(capsys, tmp_path: Path) -> None:
    from zoo.io.tokenizer import train_tokenizer

    path = tmp_path / "tokenizer.json"
    train_tokenizer(iter(["a b c", "b c d"] * 5), kind="bpe", vocab_size=30, min_frequency=1).save(path)
    assert main(["show", str(path)]) == 2
    line = one_error_line(capsys)
    assert f"{path} is a tokenizer, not a model spec or checkpoint" in line and "tokenizer: {path:" in line


def test_show_on_a_config_json_names_its_folder(capsys, hf_folder: Path) -> None:
    assert main(["show", str(hf_folder / "config.json")]) == 2
    line = one_error_line(capsys)
    assert "is a Hugging Face config.json" in line and f"zoo show {hf_folder}`" in line


def test_train_on_a_hugging_face_folder_says_what_it_is(capsys, hf_folder: Path) -> None:
    assert main(["train", str(hf_folder)]) == 2
    line = one_error_line(capsys)
    assert f"{hf_folder} is a Hugging Face checkpoint folder, not a training config" in line
    assert f"zoo convert --from-hf {hf_folder} --out DIR" in line


def test_generate_on_a_spec_file_says_it_is_no_checkpoint(capsys) -> None:
    assert main(["generate", str(SPEC_FILE), "--prompt", "hi"]) == 2
    assert f"{SPEC_FILE} is a model spec, not a zoo checkpoint or a Hugging Face folder" in one_error_line(
        capsys
    )


def test_convert_from_hf_on_a_zoo_run_points_at_to_hf(capsys, run_folder: Path, tmp_path: Path) -> None:
    assert main(["convert", "--from-hf", str(run_folder), "--out", str(tmp_path / "out")]) == 2
    line = one_error_line(capsys)
    assert "is a training run's folder, not a Hugging Face checkpoint folder" in line
    assert f"zoo convert --to-hf {run_folder} --out DIR" in line


def test_convert_to_hf_on_a_training_config_says_zoo_train_runs_it(capsys, tmp_path: Path) -> None:
    assert main(["convert", "--to-hf", str(TRAIN_CONFIG), "--out", str(tmp_path / "out")]) == 2
    assert f"{TRAIN_CONFIG} is a training config, not a zoo checkpoint" in one_error_line(capsys)


def test_a_spec_with_a_wrong_field_keeps_the_error_that_names_the_field(capsys, tmp_path: Path) -> None:
    spec = yaml.safe_load(SPEC_FILE.read_text(encoding="utf-8")) | {"d_model": 250}  # 250 % 8 heads != 0
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(spec), encoding="utf-8")
    assert main(["show", str(path)]) == 2
    line = one_error_line(capsys)
    assert "d_model" in line and "not a" not in line


def test_a_training_config_with_a_wrong_field_keeps_its_own_error(capsys, tmp_path: Path) -> None:
    config = yaml.safe_load(TRAIN_CONFIG.read_text(encoding="utf-8")) | {"max_stepz": 3}
    path = tmp_path / "typo.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    assert main(["train", str(path)]) == 2
    line = capsys.readouterr().err
    assert "max_stepz" in line and "is a training config, not" not in line


@pytest.mark.parametrize(
    ("data", "kind"),
    [
        ({"family": "decoder", "vocab_size": 10}, kinds.SPEC),
        ({"d_model": 64, "num_layers": 2}, kinds.SPEC),  # a spec that forgot its family is still one
        ({"model": {"preset": "gpt2"}, "data": {"train": "a.txt"}}, kinds.TRAIN_CONFIG),
        ({"model": {"preset": "gpt2"}}, kinds.TRAIN_CONFIG),
        ({"model_type": "llama", "hidden_size": 64}, kinds.HF_CONFIG),
        ({"version": "1.0", "added_tokens": [], "model": {"type": "BPE"}}, kinds.TOKENIZER),
        ({"peft_type": "LORA"}, None),
        (["a", "list"], None),
        ("text", None),
    ],
)
def test_a_file_is_recognised_by_its_top_level_keys(data: object, kind: kinds.Kind | None) -> None:
    assert kinds.mapping_kind(data) == kind


def test_folders_are_recognised_by_the_files_in_them(
    run_folder: Path, hf_folder: Path, tmp_path: Path
) -> None:
    checkpoint = tmp_path / "ckpt"
    zoo.save(zoo.build("gpt2-tiny"), checkpoint)
    assert kinds.file_kind(run_folder) == kinds.RUN
    assert kinds.file_kind(checkpoint) == kinds.CHECKPOINT
    assert kinds.file_kind(hf_folder) == kinds.HF_FOLDER
    assert kinds.file_kind(tmp_path / "missing") is None
    (tmp_path / "empty").mkdir()
    assert kinds.file_kind(tmp_path / "empty") is None
