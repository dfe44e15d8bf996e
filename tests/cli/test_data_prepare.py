"""`zoo data prepare`: a corpus into token shards, said what it wrote, a no-op the second time; training
from the folder is training from the raw file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zoo.cli import data as data_cli
from zoo.cli import main
from zoo.demo import toy_corpus, write_tsv
from zoo.io.tokenizer import train_tokenizer
from zoo.training import TrainConfig, train
from zoo.training.data import DataError
from zoo.training.data.shards import open_prepared
from zoo.training.tasks import TASKS


def squash(text: str) -> str:
    return "".join(text.split())


@pytest.fixture
def corpus(tmp_path: Path) -> tuple[Path, Path, Path]:
    """(train.tsv, valid.tsv, tok.json)."""
    toy = toy_corpus(seed=0, train_size=200, valid_size=10)
    write_tsv(toy.train, tmp_path / "train.tsv")
    write_tsv(toy.valid, tmp_path / "valid.tsv")
    train_tokenizer([tmp_path / "train.tsv"], kind="bpe", vocab_size=300).save(tmp_path / "tok.json")
    return tmp_path / "train.tsv", tmp_path / "valid.tsv", tmp_path / "tok.json"


def prepare(*args: object) -> int:
    return main(["data", "prepare", *map(str, args)])


def test_the_cli_knows_every_task() -> None:
    assert set(data_cli.TASKS) == set(TASKS)


def test_prepare_says_what_it_wrote_and_a_second_run_is_a_no_op(
    corpus: tuple[Path, Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    train_file, _, tok = corpus
    out = tmp_path / "prepared"
    assert prepare("--task", "seq2seq", "--tokenizer", tok, "--out", out, train_file) == 0
    printed = squash(capsys.readouterr().out)
    data = open_prepared(out)
    assert data.num_examples == 200 and data.manifest.task == "seq2seq"
    tokens = data.manifest.sides["source"].tokens
    assert f"200examples(source{tokens:,}tokens(uint16)" in printed and squash(str(out)) in printed
    assert prepare("--task", "seq2seq", "--tokenizer", tok, "--out", out, train_file) == 0
    assert "alreadypreparedfromtheseinputs" in squash(capsys.readouterr().out)


def test_prepare_refuses_a_folder_it_did_not_write(
    corpus: tuple[Path, Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    train_file, _, tok = corpus
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    assert prepare("--task", "seq2seq", "--tokenizer", tok, "--out", tmp_path / "mine", train_file) == 2
    assert "holdsfilesandnomanifest.json" in squash(capsys.readouterr().err)
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"


def test_jsonl_fields_name_the_columns(corpus: tuple[Path, Path, Path], tmp_path: Path) -> None:
    _, _, tok = corpus
    rows = [{"en": "the cat", "ko": "고양이", "id": 1}, {"en": "a dog", "ko": "개", "id": 2}]
    (tmp_path / "pairs.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    out = tmp_path / "prepared"
    args = ("--task", "seq2seq", "--tokenizer", tok, "--out", out, "--format", "jsonl", "--fields", "en,ko")
    assert prepare(*args, tmp_path / "pairs.jsonl") == 0
    data = open_prepared(out)
    assert data.num_examples == 2 and data.origin(1) == f"{tmp_path / 'pairs.jsonl'}:2"


def test_training_from_a_prepared_folder_trains_as_from_the_raw_file(
    corpus: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    train_file, valid_file, tok = corpus
    for name, file in (("train", train_file), ("valid", valid_file)):
        assert prepare("--task", "seq2seq", "--tokenizer", tok, "--out", tmp_path / name, file) == 0

    def config(data: dict[str, object], out: str) -> TrainConfig:
        return TrainConfig.from_dict({
            "model": {"preset": "transformer-tiny",
                      "overrides": {"d_model": 32, "num_layers": 1, "attention.num_heads": 2, "ffn.d_ff": 64}},
            "data": data, "tokenizer": {"path": str(tok)}, "batch": {"max_tokens": 500},
            "task": {"kind": "seq2seq", "bleu": False}, "max_steps": 3, "log_every": 1, "output_dir": str(tmp_path / out),
        })  # fmt: skip

    raw = train(config({"train": str(train_file), "valid": str(valid_file)}, "raw"), progress=False)
    prepared = {
        "train": {"prepared": str(tmp_path / "train")},
        "valid": {"prepared": str(tmp_path / "valid")},
    }
    shards = train(config(prepared, "shards"), progress=False)
    assert shards.final["val_loss"] == raw.final["val_loss"]
    for (name, a), (_, b) in zip(raw.model.state_dict().items(), shards.model.state_dict().items()):
        assert a.equal(b), name


def test_prepared_data_from_another_tokenizer_is_refused(
    corpus: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    train_file, _, tok = corpus
    assert prepare("--task", "seq2seq", "--tokenizer", tok, "--out", tmp_path / "p", train_file) == 0
    other = tmp_path / "other.json"
    train_tokenizer([train_file], kind="bpe", vocab_size=200).save(other)
    config = TrainConfig.from_dict({
        "model": "transformer-tiny", "data": {"train": {"prepared": str(tmp_path / "p")}},
        "tokenizer": {"path": str(other)}, "max_steps": 1, "output_dir": str(tmp_path / "run"),
    })  # fmt: skip
    with pytest.raises(
        DataError, match=r"data\.train\.prepared: .*source ids were made by another tokenizer"
    ):
        train(config, progress=False)
    without = config.override(**{"tokenizer.path": None})
    with pytest.raises(ValueError, match=r"data\.train is prepared data: give tokenizer\.path"):
        train(without, progress=False)
