"""The tokenizers wrapper: training, exact round trips on the toy corpus, special ids and file handling."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models

from zoo.demo import toy_corpus
from zoo.io.tokenizer import SPECIAL_TOKENS, Tokenizer, check_special_tokens, train_tokenizer

KINDS = ("bpe", "wordpiece", "unigram")


@pytest.fixture(scope="module")
def corpus_lines() -> list[str]:
    corpus = toy_corpus(seed=0, train_size=1500, valid_size=50)
    return [text for pair in corpus.train + corpus.valid for text in pair]


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory: pytest.TempPathFactory, corpus_lines: list[str]) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text("\n".join(corpus_lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module", params=KINDS)
def trained(request: pytest.FixtureRequest, corpus_file: Path) -> Tokenizer:
    return train_tokenizer([corpus_file], kind=request.param, vocab_size=800)


def test_special_tokens_take_ids_zero_to_four(trained: Tokenizer) -> None:
    assert trained.special_ids() == {"pad": 0, "bos": 1, "eos": 2, "unk": 3, "mask": 4}
    assert (trained.pad_id, trained.bos_id, trained.eos_id, trained.unk_id, trained.mask_id) == (
        0,
        1,
        2,
        3,
        4,
    )
    assert [trained.id_to_token(i) for i in range(5)] == list(SPECIAL_TOKENS.values())


def test_decode_inverts_encode_on_english_and_hangul(trained: Tokenizer, corpus_lines: list[str]) -> None:
    for text in corpus_lines:
        assert trained.decode(trained.encode(text)) == text
    assert trained.decode_batch(trained.encode_batch(corpus_lines[:20])) == corpus_lines[:20]


def test_encode_frames_with_bos_and_eos(trained: Tokenizer) -> None:
    text = "고양이가 생선을 먹는다"
    body = trained.encode(text, add_eos=False)
    assert trained.encode(text) == [*body, trained.eos_id]
    assert trained.encode(text, add_bos=True) == [trained.bos_id, *body, trained.eos_id]
    assert trained.decode([trained.bos_id, *body, trained.eos_id, trained.pad_id]) == text


def test_save_and_load_round_trip(trained: Tokenizer, tmp_path: Path) -> None:
    path = tmp_path / "nested" / "tokenizer.json"
    trained.save(path)
    assert [p.name for p in path.parent.iterdir()] == ["tokenizer.json"]  # no temp file left behind
    loaded = Tokenizer.from_file(path)
    text = "the big dog chased three cats in the park"
    assert loaded.encode(text) == trained.encode(text)
    assert loaded.special_ids() == trained.special_ids() and loaded.vocab_size == trained.vocab_size
    assert Tokenizer.from_file(tmp_path / "nested").vocab_size == trained.vocab_size  # a directory works


def test_training_from_an_iterator_matches_training_from_a_file(
    corpus_file: Path, corpus_lines: list[str]
) -> None:
    from_file = train_tokenizer(corpus_file, kind="bpe", vocab_size=500)
    from_iter = train_tokenizer(iter(corpus_lines), kind="bpe", vocab_size=500)
    assert from_iter.hf.to_str() == from_file.hf.to_str()


def test_lowercase_option_normalizes_input(corpus_lines: list[str]) -> None:
    tok = train_tokenizer(iter(corpus_lines), kind="wordpiece", vocab_size=600, lowercase=True)
    assert tok.encode("The Cat eats FISH") == tok.encode("the cat eats fish")


def test_missing_training_file_error_names_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "nope.txt"
    with pytest.raises(FileNotFoundError, match=r"nope\.txt"):
        train_tokenizer([missing], kind="bpe", vocab_size=100)


@pytest.mark.parametrize("source", ["iterator", "file"])
def test_empty_input_is_rejected(tmp_path: Path, source: str) -> None:
    empty = tmp_path / "empty.txt"
    empty.write_text("\n  \n", encoding="utf-8")
    data = iter(["", "   "]) if source == "iterator" else [empty]
    with pytest.raises(ValueError, match="no text was found"):
        train_tokenizer(data, kind="unigram", vocab_size=100)


def test_unknown_kind_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown tokenizer kind 'sentencepiece'"):
        train_tokenizer(iter(["a b"]), kind="sentencepiece", vocab_size=100)  # type: ignore[arg-type]


def test_from_file_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"absent\.json"):
        Tokenizer.from_file(tmp_path / "absent.json")
    bogus = tmp_path / "bogus.json"
    bogus.write_text('{"hello": 1}', encoding="utf-8")
    with pytest.raises(ValueError, match=r"bogus\.json: not a tokenizer the tokenizers library can load"):
        Tokenizer.from_file(bogus)


def test_hf_bert_style_names_are_recognised(tmp_path: Path) -> None:
    vocab = {"[PAD]": 0, "[UNK]": 100, "[CLS]": 101, "[SEP]": 102, "[MASK]": 103, "hello": 7}
    hf = HFTokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    hf.save(str(tmp_path / "tokenizer.json"))
    tok = Tokenizer.from_file(tmp_path / "tokenizer.json")
    assert tok.special_ids() == {"pad": 0, "bos": 101, "eos": 102, "unk": 100, "mask": 103}


def test_missing_special_token_is_an_error_only_when_asked_for() -> None:
    tok = Tokenizer(HFTokenizer(models.WordLevel(vocab={"<unk>": 0, "hi": 1}, unk_token="<unk>")))
    assert tok.eos_id is None and tok.pad_id is None
    assert tok.encode("hi", add_eos=False) == [1]
    with pytest.raises(ValueError, match="add_eos=True but the tokenizer has no eos token"):
        tok.encode("hi")


def test_check_special_tokens_accepts_a_matching_spec(trained: Tokenizer) -> None:
    check_special_tokens(
        trained, pad_token_id=0, bos_token_id=1, eos_token_id=2, vocab_size=1000, where="toy"
    )
    check_special_tokens(
        trained, pad_token_id=0, bos_token_id=None, eos_token_id=None, vocab_size=800, where="x"
    )


def test_check_special_tokens_names_where_token_and_both_ids(trained: Tokenizer) -> None:
    with pytest.raises(ValueError) as info:
        check_special_tokens(
            trained, pad_token_id=0, bos_token_id=1, eos_token_id=7, vocab_size=1000, where="presets/toy.yaml"
        )
    message = str(info.value)
    assert message.startswith("presets/toy.yaml: ")
    assert "eos token '</s>' has id 2 in the tokenizer but eos_token_id is 7" in message


def test_check_special_tokens_rejects_a_small_model_vocab(trained: Tokenizer) -> None:
    with pytest.raises(ValueError, match=rf"spec\.yaml: .*{trained.vocab_size} tokens but vocab_size is 10"):
        check_special_tokens(
            trained, pad_token_id=0, bos_token_id=1, eos_token_id=2, vocab_size=10, where="spec.yaml"
        )


# -- hostile input: long words, other encodings, bad settings -----------------------------------------------


def test_a_one_megabyte_word_trains_in_seconds(tmp_path: Path) -> None:
    """BPE rescans a word for every merge that touches it: one unbroken 1 MB line (a minified file) took
    minutes, a 5 MB one hours. Cut into MAX_WORD_CHARS pieces for training, it costs what text does.
    A subprocess, so that the slow case fails on its timeout rather than stalling the suite."""
    import random
    import subprocess
    import sys

    rng = random.Random(0)
    word = "".join(rng.choice("abcdefghij") for _ in range(1_000_000))
    path = tmp_path / "minified.txt"
    path.write_text(f"the cat sat on the mat\n{word}\na dog\n", encoding="utf-8")
    code = (
        "import sys; from zoo.io.tokenizer import train_tokenizer; "
        "tok = train_tokenizer([sys.argv[1]], kind='bpe', vocab_size=2000); "
        "print(max(len(t) for t in tok.hf.get_vocab()))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert int(result.stdout) <= 100


def test_words_longer_than_the_cap_are_cut_for_training_only(tmp_path: Path) -> None:
    from zoo.io.tokenizer.training import MAX_WORD_CHARS

    long_word = "abcdefghij" * 25  # 250 characters: three pieces when training
    tok = train_tokenizer(iter(["the cat sat", f"a {long_word} b"] * 3), kind="bpe", vocab_size=400)
    assert max(len(token) for token in tok.hf.get_vocab()) <= MAX_WORD_CHARS
    steps = json.loads(tok.hf.to_str())["pre_tokenizer"]["pretokenizers"]
    assert [step["type"] for step in steps] == ["WhitespaceSplit", "Metaspace"]  # the saved one does not cut
    assert tok.decode(tok.encode(f"the {long_word} cat")) == f"the {long_word} cat"


def test_a_file_that_is_not_utf8_is_named_with_its_line_and_byte_offset(tmp_path: Path) -> None:
    path = tmp_path / "latin1.txt"
    path.write_bytes("good line\ncaf\u00e9 au lait\n".encode("latin-1"))
    with pytest.raises(ValueError, match=r"latin1\.txt:2: not UTF-8 text \(byte 0xe9 at byte offset 13\)"):
        train_tokenizer([path], kind="bpe", vocab_size=100)


def test_a_negative_min_frequency_is_a_value_error() -> None:
    with pytest.raises(ValueError, match=r"min_frequency \(-1\) must be >= 0"):
        train_tokenizer(iter(["a b c"]), kind="bpe", vocab_size=100, min_frequency=-1)
