"""What the ``tokenizers`` library raises while loading or encoding reaches the user as one line naming the
tokenizer file; what a tokenizer trainer or a run may ask of the machine is bounded, by name."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from zoo.cli import main
from zoo.io.tokenizer import Tokenizer, TokenizerError, train_tokenizer
from zoo.training.config import TrainConfig


def tokenizer_file(path: Path, model: dict[str, Any], pre_tokenizer: dict[str, Any] | None = None) -> Path:
    document = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [],
        "normalizer": None,
        "pre_tokenizer": pre_tokenizer or {"type": "Whitespace"},
        "post_processor": None,
        "decoder": None,
        "model": model,
    }
    path.write_text(json.dumps(document))
    return path


WORDPIECE_WITHOUT_UNK = {
    "type": "WordPiece",
    "unk_token": "[UNK]",
    "continuing_subword_prefix": "##",
    "max_input_chars_per_word": 100,
    "vocab": {"a": 0, "b": 1, "[SEP]": 2},
}
BPE_WITHOUT_UNK = {
    "type": "BPE",
    "dropout": None,
    "unk_token": "[UNK]",
    "continuing_subword_prefix": None,
    "end_of_word_suffix": None,
    "fuse_unk": False,
    "byte_fallback": False,
    "vocab": {"a": 0, "b": 1, "</s>": 2},
    "merges": [],
}
WORD_LEVEL = {"type": "WordLevel", "vocab": {"a": 0, "[UNK]": 1, "</s>": 2}, "unk_token": "[UNK]"}
CATASTROPHIC = {"type": "Split", "pattern": {"Regex": "(a+)+$"}, "behavior": "Isolated", "invert": False}


@pytest.mark.parametrize("model", [WORDPIECE_WITHOUT_UNK, BPE_WITHOUT_UNK], ids=["wordpiece", "bpe"])
def test_a_vocabulary_without_its_unknown_token_is_named_with_the_text_that_needs_it(
    tmp_path: Path, model: dict[str, Any]
) -> None:
    tok = Tokenizer.from_file(tokenizer_file(tmp_path / "tok.json", model))
    assert tok.encode("a b", add_eos=False) == [0, 1]  # known pieces still encode
    with pytest.raises(TokenizerError, match=r"tok\.json: cannot encode 'a z': .*unknown token \[UNK\]"):
        tok.encode("a z")
    with pytest.raises(TokenizerError, match=r"tok\.json: cannot encode text 1 \('zz'\): .*lacks"):
        tok.encode_batch(["a", "zz", "b"])
    with pytest.raises(TokenizerError, match=r"tok\.json: cannot encode text 1"):
        tok(["a", "zz"])


def test_an_empty_unigram_vocabulary_is_refused_when_loaded(tmp_path: Path) -> None:
    path = tokenizer_file(tmp_path / "empty.json", {"type": "Unigram", "unk_id": None, "vocab": []})
    with pytest.raises(TokenizerError, match=r"empty\.json: the tokenizer's vocabulary is empty"):
        Tokenizer.from_file(path)


def test_a_unigram_model_without_unk_id_is_named_when_a_piece_is_unknown(tmp_path: Path) -> None:
    model = {"type": "Unigram", "unk_id": None, "vocab": [["a", -1.0], ["</s>", -1.0]]}
    tok = Tokenizer.from_file(tokenizer_file(tmp_path / "uni.json", model))
    with pytest.raises(
        TokenizerError, match=r"uni\.json: cannot encode 'z': its Unigram model has no unk_id"
    ):
        tok.encode("z")


def test_a_regex_oniguruma_rejects_is_refused_when_loaded(tmp_path: Path) -> None:
    bad = {"type": "Split", "pattern": {"Regex": "(a"}, "behavior": "Isolated", "invert": False}
    path = tokenizer_file(tmp_path / "regex.json", WORD_LEVEL, bad)
    with pytest.raises(TokenizerError, match=r"regex\.json: not a tokenizer the tokenizers library can load"):
        Tokenizer.from_file(path)


def test_a_catastrophic_pre_tokenizer_regex_is_one_error_not_a_rust_panic(tmp_path: Path) -> None:
    tok = Tokenizer.from_file(tokenizer_file(tmp_path / "slow.json", WORD_LEVEL, CATASTROPHIC))
    assert tok.encode("a", add_eos=False) == [0]
    with pytest.raises(TokenizerError, match=r"slow\.json: cannot encode 'a{30}b': .*backtracks"):
        tok.encode("a" * 30 + "b")


def test_zoo_train_names_the_tokenizer_file_that_cannot_encode_a_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "a": 3, "b": 4}  # gpt2-tiny's special ids, no [UNK]
    path = tokenizer_file(tmp_path / "tok.json", BPE_WITHOUT_UNK | {"vocab": vocab})
    (tmp_path / "train.txt").write_text("a b\nb a z\n")
    config = {
        "model": {"preset": "gpt2-tiny", "overrides": {"vocab_size": 8, "num_layers": 1}},
        "data": {"train": str(tmp_path / "train.txt")},
        "tokenizer": {"path": str(path)},
        "max_steps": 1,
        "output_dir": str(tmp_path / "run"),
    }
    (tmp_path / "run.yaml").write_text(json.dumps(config))
    assert main(["train", str(tmp_path / "run.yaml")]) == 2
    err = capsys.readouterr().err
    assert "tok.json: cannot encode text 1 ('b a z'): its model names the unknown token [UNK]" in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--vocab-size", "1000000000000", "vocab_size (1,000,000,000,000) is over the limit of 16,777,216"),
        (
            "--vocab-size",
            "10" * 15,
            "vocab_size (101,010,101,010,101,010,101,010,101,010) is over the limit",
        ),
        (
            "--min-frequency",
            "10" * 15,
            "min_frequency (101,010,101,010,101,010,101,010,101,010) must be at most 4,294,967,295",
        ),
    ],
)
def test_tokenizer_training_refuses_sizes_the_trainer_cannot_allocate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], option: str, value: str, message: str
) -> None:
    (tmp_path / "a.txt").write_text("the cat sat\n")
    assert (
        main(
            ["tokenizer", "train", str(tmp_path / "a.txt"), "--out", str(tmp_path / "t.json"), option, value]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "t.json").exists()


def test_the_vocabulary_limit_is_raised_by_its_environment_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match=r"vocab_size \(40\) is over the limit of 20.*ZOO_MAX_VOCAB"):
        monkeypatch.setenv("ZOO_MAX_VOCAB", "20")
        train_tokenizer(iter(["the cat sat"]), kind="bpe", vocab_size=40)
    monkeypatch.setenv("ZOO_MAX_VOCAB", "40")
    assert train_tokenizer(iter(["the cat sat"]), kind="bpe", vocab_size=40).vocab_size <= 40


def test_a_run_asking_for_more_threads_than_the_machine_allows_is_refused_by_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    base = {"model": {"preset": "gpt2-tiny"}, "data": {"train": "x.txt"}, "max_steps": 1}
    with pytest.raises(
        ValueError, match=r"num_threads \(100,000\) is more than the \d+ threads .*ZOO_MAX_THREADS"
    ):
        TrainConfig.from_dict(base | {"num_threads": 100_000})
    with pytest.raises(ValueError, match=r"vocab_size \(1,000,000,000,000\) is over the limit"):
        TrainConfig.from_dict(base | {"tokenizer": {"vocab_size": 10**12}})
    monkeypatch.setenv("ZOO_MAX_THREADS", "100000")
    assert TrainConfig.from_dict(base | {"num_threads": 100_000}).num_threads == 100_000


def test_a_tokenizer_file_over_its_size_limit_is_refused_before_it_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tokenizer_file(tmp_path / "big.json", WORD_LEVEL)
    monkeypatch.setenv("ZOO_MAX_TOKENIZER_BYTES", "100")
    with pytest.raises(TokenizerError, match=r"big\.json: .*over the limit of .*ZOO_MAX_TOKENIZER_BYTES"):
        Tokenizer.from_file(path)
