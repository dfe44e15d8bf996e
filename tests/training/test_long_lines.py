"""A line far over the length limit is cut before it is encoded, keeping the tokens truncation would keep."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from zoo.io.tokenizer import Tokenizer, train_tokenizer
from zoo.io.tokenizer.lengths import char_budget, cut_before_encoding, cut_words
from zoo.training.classification import encode_labelled
from zoo.training.data import DataError, TextExamples, encode_examples
from zoo.training.labelled import LabelledText

MAX = 24  # tokens


@pytest.fixture(scope="module")
def tokenizer(toy_files: tuple[Path, Path]) -> Tokenizer:
    return train_tokenizer([toy_files[0]], kind="bpe", vocab_size=400)


@pytest.fixture(scope="module")
def words(toy_files: tuple[Path, Path]) -> list[str]:
    return toy_files[0].read_text(encoding="utf-8").split()


def long_line(words: list[str], chars: int, seed: int = 0) -> str:
    rng = random.Random(seed)
    out: list[str] = []
    while sum(map(len, out)) + len(out) < chars:
        out.append(rng.choice(words))
    return " ".join(out)


class Recorder:
    """Wraps a tokenizer's encode calls, keeping the longest text (or word list) it was given."""

    def __init__(self, tokenizer: Tokenizer, monkeypatch: pytest.MonkeyPatch) -> None:
        self.longest = 0
        batch = tokenizer.encode_batch

        def encode_batch(texts: list[str], **kwargs: Any) -> Any:
            self.longest = max([self.longest, *map(len, texts)])
            return batch(texts, **kwargs)

        monkeypatch.setattr(tokenizer, "encode_batch", encode_batch)


def lm(*lines: str) -> TextExamples:
    return TextExamples(
        targets=list(lines), sources=None, origins=[f"d.txt:{i + 1}" for i in range(len(lines))]
    )


def test_a_long_line_is_cut_to_the_character_budget_before_it_is_encoded(
    tokenizer: Tokenizer, words: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    budget = char_budget(tokenizer, MAX)
    line = long_line(words, 50 * budget)
    recorder = Recorder(tokenizer, monkeypatch)
    encoded = encode_examples(lm("a b", line), task="causal_lm", target_tokenizer=tokenizer, max_length=MAX)
    assert recorder.longest == budget < len(line)
    assert len(encoded.targets[1]) == MAX


@pytest.mark.parametrize("seed", range(5))
def test_cutting_before_encoding_keeps_the_tokens_truncation_would_keep(
    tokenizer: Tokenizer, words: list[str], seed: int
) -> None:
    line = long_line(words, 3 * char_budget(tokenizer, MAX), seed=seed)
    whole = tokenizer.encode(line, add_bos=True, add_eos=True)
    encoded = encode_examples(lm(line), task="causal_lm", target_tokenizer=tokenizer, max_length=MAX)
    assert encoded.targets[0] == [*whole[: MAX - 1], whole[-1]]


def test_a_long_seq2seq_source_is_cut_and_keeps_its_first_tokens(
    tokenizer: Tokenizer, words: list[str]
) -> None:
    source = long_line(words, 3 * char_budget(tokenizer, MAX))
    text = TextExamples(targets=["a b"], sources=[source], origins=["d.tsv:1"])
    encoded = encode_examples(text, task="seq2seq", target_tokenizer=tokenizer, max_length=MAX)
    assert encoded.sources is not None
    assert encoded.sources[0] == [*tokenizer.encode(source, add_eos=True)[: MAX - 1], tokenizer.eos_id]


def test_too_long_error_names_the_line_and_its_characters_without_encoding_it_whole(
    tokenizer: Tokenizer, words: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    line = long_line(words, 10 * char_budget(tokenizer, MAX))
    recorder = Recorder(tokenizer, monkeypatch)
    with pytest.raises(
        DataError, match=rf"d\.txt:2: {len(line):,} characters, more than the limit of {MAX} tokens"
    ):
        encode_examples(
            lm("a", line), task="causal_lm", target_tokenizer=tokenizer, max_length=MAX, too_long="error"
        )
    assert recorder.longest <= char_budget(tokenizer, MAX)


def test_too_long_skip_drops_a_line_over_the_character_budget(tokenizer: Tokenizer, words: list[str]) -> None:
    line = long_line(words, 10 * char_budget(tokenizer, MAX))
    encoded = encode_examples(
        lm("a b", line), task="causal_lm", target_tokenizer=tokenizer, max_length=MAX, too_long="skip"
    )
    assert encoded.origins == ["d.txt:1"]


def test_a_long_classification_text_is_cut_before_encoding(
    tokenizer: Tokenizer, words: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    line = long_line(words, 20 * char_budget(tokenizer, MAX))
    text = LabelledText(
        targets=["a b", line], sources=None, origins=["c.tsv:1", "c.tsv:2"], labels=["x", "y"]
    )
    whole = tokenizer.encode(line, add_bos=True, add_eos=True)
    recorder = Recorder(tokenizer, monkeypatch)
    encoded = encode_labelled(text, names=("x", "y"), tokenizer=tokenizer, max_length=MAX)
    assert recorder.longest == char_budget(tokenizer, MAX)
    assert encoded.targets[1] == [*whole[: MAX - 1], whole[-1]] and encoded.labels == [0, 1]


def test_a_long_tagged_sentence_is_cut_at_a_word_and_keeps_its_tags_aligned(
    tokenizer: Tokenizer, words: list[str]
) -> None:
    row = long_line(words, 20 * char_budget(tokenizer, MAX)).split()
    tags = ["A" if i % 2 else "B" for i in range(len(row))]
    text = LabelledText(
        targets=[" ".join(row)], sources=None, origins=["t.jsonl:1"], labels=[tags], words=[row]
    )
    short = LabelledText(
        targets=[" ".join(row[:40])],
        sources=None,
        origins=["t.jsonl:1"],
        labels=[tags[:40]],
        words=[row[:40]],
    )
    cut = encode_labelled(text, names=("A", "B"), tokenizer=tokenizer, max_length=MAX)
    reference = encode_labelled(short, names=("A", "B"), tokenizer=tokenizer, max_length=MAX)
    assert cut.targets == reference.targets and cut.labels == reference.labels
    with pytest.raises(DataError, match=r"t\.jsonl:1: [0-9,]+ characters, more than the limit"):
        encode_labelled(text, names=("A", "B"), tokenizer=tokenizer, max_length=MAX, too_long="error")


def test_cut_helpers_leave_short_texts_alone_and_say_what_they_cut() -> None:
    assert cut_before_encoding(["abc", "abcdef"], 4) == (["abc", "abcd"], [1])
    assert cut_before_encoding(["abc"], 3) == (["abc"], [])
    assert cut_words(["ab", "cd", "ef"], 6) == (["ab", "cd"], True)
    assert cut_words(["ab", "cd"], 6) == (["ab", "cd"], False)
    assert cut_words(["abcdefgh", "cd"], 4) == (["abcd"], True)


def test_bleu_translation_cuts_a_long_validation_source_before_encoding(
    tokenizer: Tokenizer, words: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import zoo
    from zoo.training.evaluate import translate

    spec = zoo.preset("transformer-tiny").override(num_layers=1, vocab_size=400, max_positions=MAX)
    model = zoo.build(spec)
    line = long_line(words, 20 * char_budget(tokenizer, MAX))
    recorder = Recorder(tokenizer, monkeypatch)
    out = translate(
        model, ["a b", line], source_tokenizer=tokenizer, target_tokenizer=tokenizer, max_new_tokens=2
    )
    assert recorder.longest == char_budget(tokenizer, MAX) and len(out) == 2
