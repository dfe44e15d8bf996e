"""`zoo train` and `zoo tokenizer` from the command line: a tiny run, resume, and errors without tracebacks."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import yaml

import zoo
from zoo.cli import main
from zoo.cli.train import parse_overrides
from zoo.demo import toy_corpus, write_tsv


def squash(text: str) -> str:
    """Without whitespace: rich wraps long lines (and folds long paths) at the terminal width."""
    return "".join(text.split())


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def tiny_config(tmp_path: Path) -> Path:
    corpus = toy_corpus(seed=0, train_size=200, valid_size=10)
    write_tsv(corpus.train, tmp_path / "train.tsv")
    write_tsv(corpus.valid, tmp_path / "valid.tsv")
    config = {
        "model": {
            "preset": "transformer-tiny",
            "overrides": {"d_model": 32, "num_layers": 1, "attention.num_heads": 2, "ffn.d_ff": 64},
        },
        "data": {"train": str(tmp_path / "train.tsv"), "valid": str(tmp_path / "valid.tsv")},
        "tokenizer": {"vocab_size": 300},
        "schedule": {"warmup_steps": 10},
        "batch": {"max_tokens": 500},
        "task": {"kind": "seq2seq", "bleu_samples": 5},
        "checkpoint": {"every_steps": 2},
        "max_steps": 2,
        "log_every": 1,
        "output_dir": str(tmp_path / "run"),
    }
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


def test_zoo_train_runs_a_tiny_config_and_saves_a_loadable_model(
    tiny_config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["train", str(tiny_config)]) == 0
    out = capsys.readouterr().out
    assert squash("trained 2 steps") in squash(out) and "val_loss" in out and "BLEU" in out
    run = tmp_path / "run"
    model, tokenizer = zoo.load(run), zoo.load_tokenizer(run)
    assert model.spec.vocab_size == tokenizer.vocab_size
    assert (run / "train_config.yaml").is_file() and (run / "checkpoints" / "step-00000002").is_dir()
    lines = (run / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 3  # two training records and the final validation

    # --resume with more steps continues from the checkpoint at step 2.
    assert main(["train", str(tiny_config), "--resume", "--max-steps", "3"]) == 0
    assert squash("trained 3 steps") in squash(capsys.readouterr().out)


def test_zoo_train_reports_bad_data_without_a_traceback(
    tiny_config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "train.tsv").write_text("hello\tworld\nno tab\n", encoding="utf-8")
    assert main(["train", str(tiny_config)]) == 2
    err = capsys.readouterr().err
    assert squash("train.tsv:2: expected 2 tab-separated columns, found no tab") in squash(err)
    assert "Traceback" not in err


def test_zoo_train_set_changes_a_field_and_rejects_unknown_ones(
    tiny_config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["train", str(tiny_config), "--set", "batch.max_tokenz=10"]) == 2
    assert squash("batch.max_tokenz: Extra inputs are not permitted") in squash(capsys.readouterr().err)
    assert parse_overrides(["optim.clip_grad_norm=null", "optim.betas=[0.9, 0.99]"]) == {
        "optim.clip_grad_norm": None,
        "optim.betas": [0.9, 0.99],
    }


def test_zoo_train_refuses_to_overwrite_a_run(tiny_config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", str(tiny_config), "--max-steps", "1"]) == 0
    assert main(["train", str(tiny_config), "--max-steps", "1"]) == 2
    assert squash("already holds a training run") in squash(capsys.readouterr().err)


def test_zoo_tokenizer_train_writes_a_tokenizer_with_zoo_special_ids(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    corpus = toy_corpus(seed=0, train_size=300, valid_size=0)
    files = []
    for side in (0, 1):
        path = tmp_path / f"side{side}.txt"
        path.write_text("\n".join(pair[side] for pair in corpus.train) + "\n", encoding="utf-8")
        files.append(str(path))
    out = tmp_path / "tok.json"
    assert (
        main(["tokenizer", "train", "--kind", "bpe", "--vocab-size", "500", *files, "--out", str(out)]) == 0
    )
    assert squash("bpe tokenizer") in squash(capsys.readouterr().out)
    tokenizer = zoo.Tokenizer.from_file(out)
    assert tokenizer.special_ids() == {"pad": 0, "bos": 1, "eos": 2, "unk": 3, "mask": 4}
    assert tokenizer.vocab_size <= 500
    assert tokenizer.decode(tokenizer.encode("고양이가 생선을 먹는다")) == "고양이가 생선을 먹는다"
    assert main(["tokenizer", "encode", str(out), "the cat eats fish"]) == 0
    assert "▁cat" in capsys.readouterr().out


def test_zoo_tokenizer_train_names_a_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["tokenizer", "train", str(tmp_path / "missing.txt"), "--out", str(tmp_path / "t.json")])
    assert code == 2
    assert "missing.txt" in capsys.readouterr().err


def test_zoo_train_draws_the_bar_on_a_terminal_unless_told_not_to(
    tiny_config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)  # capsys's stdout, posing as a terminal
    base = [str(tiny_config), "--set", "checkpoint.every_steps=null", "--max-steps", "1"]
    assert main(["train", *base, "--set", "log_sinks=[csv]"]) == 0
    drawn = capsys.readouterr().out
    assert "tok/s" in drawn and "val_loss" in drawn  # the bar, and the validation line above it
    assert (tmp_path / "run" / "metrics.csv").is_file()  # log_sinks reach the run from --set

    assert main(["train", *base, "--overwrite", "--no-progress"]) == 0
    plain = capsys.readouterr().out
    assert "tok/s" not in plain and "val_loss" in plain  # lines only


def test_zoo_train_on_a_full_disk_names_the_output_folder(
    tiny_config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno
    import os

    import zoo.io.atomic

    def disk_full(final: Path, write: object) -> Path:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # as write(2) reports it: no file name

    monkeypatch.setattr(zoo.io.atomic, "write_temp", disk_full)
    assert main(["train", str(tiny_config), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert squash("the disk is full") in squash(err) and squash(str(tmp_path / "run")) in squash(err)
