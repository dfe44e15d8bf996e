"""A line far over the length limit is cut before it is encoded, keeping the tokens truncation would keep."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from zoo.io.tokenizer import Tokenizer, train_tokenizer
from zoo.io.tokenizer.lengths import char_budget, cut_before_encoding, cut_words
from zoo.training.data import DataError
from zoo.training.data.sources import Record
from zoo.training.tasks import base as task_base
from zoo.training.tasks import get_task
from zoo.training.tasks.base import Framing, LengthCuts, Limits, Tokenizers

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
    """Wraps the tasks' batch encoding, keeping the longest text it was given."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.longest = 0
        encode = task_base.raw_ids

        def raw_ids(tokenizer: Tokenizer, texts: list[str]) -> list[list[int]]:
            self.longest = max([self.longest, *map(len, texts)])
            return encode(tokenizer, texts)

        for module in ("language_model", "seq2seq", "classification"):
            monkeypatch.setattr(f"zoo.training.tasks.{module}.raw_ids", raw_ids)


class TokenizerRecorder:
    """Wraps a tokenizer's encode calls, keeping the longest text it was given."""

    def __init__(self, tokenizer: Tokenizer, monkeypatch: pytest.MonkeyPatch) -> None:
        self.longest = 0
        batch = tokenizer.encode_batch

        def encode_batch(texts: list[str], **kwargs: Any) -> Any:
            self.longest = max([self.longest, *map(len, texts)])
            return batch(texts, **kwargs)

        monkeypatch.setattr(tokenizer, "encode_batch", encode_batch)


def encode(
    task: str,
    rows: list[dict[str, Any]],
    tokenizer: Tokenizer,
    *,
    file: str,
    too_long: str = "truncate",
    **kw: Any,
) -> dict[str, list[Any]]:
    """Rows of fields encoded by ``task`` as a prepare with a limit of MAX would (raw ids: no framing; a
    dropped row None)."""
    records = [Record(Path(file), i + 1, dict(fields)) for i, fields in enumerate(rows)]
    cuts = LengthCuts(Limits(MAX, too_long))  # type: ignore[arg-type]
    return get_task(task).encoder(Tokenizers(tokenizer), cuts=cuts, **kw)(records)


def framed(tokenizer: Tokenizer, ids: list[int]) -> list[int]:
    return Framing(tokenizer.bos_id, tokenizer.eos_id)(ids, MAX)


def test_a_long_line_is_cut_to_the_character_budget_before_it_is_encoded(
    tokenizer: Tokenizer, words: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    budget = char_budget(tokenizer, MAX)
    line = long_line(words, 50 * budget)
    recorder = Recorder(monkeypatch)
    encoded = encode("causal_lm", [{"text": "a b"}, {"text": line}], tokenizer, file="d.txt")
    assert recorder.longest == budget < len(line)
    assert len(framed(tokenizer, encoded["text"][1])) == MAX


@pytest.mark.parametrize("seed", range(5))
def test_cutting_before_encoding_keeps_the_tokens_truncation_would_keep(
    tokenizer: Tokenizer, words: list[str], seed: int
) -> None:
    line = long_line(words, 3 * char_budget(tokenizer, MAX), seed=seed)
    whole = tokenizer.encode(line, add_bos=True, add_eos=True)
    encoded = encode("causal_lm", [{"text": line}], tokenizer, file="d.txt")
    assert framed(tokenizer, encoded["text"][0]) == [*whole[: MAX - 1], whole[-1]]


def test_a_long_seq2seq_source_is_cut_and_keeps_its_first_tokens(
    tokenizer: Tokenizer, words: list[str]
) -> None:
    source = long_line(words, 3 * char_budget(tokenizer, MAX))
    encoded = encode("seq2seq", [{"source": source, "target": "a b"}], tokenizer, file="d.tsv")
    eos = Framing(eos=tokenizer.eos_id)(encoded["source"][0], MAX)
    assert eos == [*tokenizer.encode(source, add_eos=True)[: MAX - 1], tokenizer.eos_id]


def test_too_long_error_names_the_line_and_its_characters_without_encoding_it_whole(
    tokenizer: Tokenizer, words: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    line = long_line(words, 10 * char_budget(tokenizer, MAX))
    recorder = Recorder(monkeypatch)
    with pytest.raises(
        DataError, match=rf"d\.txt:2: {len(line):,} characters, more than the limit of {MAX} tokens"
    ):
        encode("causal_lm", [{"text": "a"}, {"text": line}], tokenizer, file="d.txt", too_long="error")
    assert recorder.longest <= char_budget(tokenizer, MAX)


def test_too_long_skip_drops_a_line_over_the_character_budget(tokenizer: Tokenizer, words: list[str]) -> None:
    line = long_line(words, 10 * char_budget(tokenizer, MAX))
    encoded = encode("causal_lm", [{"text": "a b"}, {"text": line}], tokenizer, file="d.txt", too_long="skip")
    assert encoded["text"][0] is not None and encoded["text"][1] is None


def test_a_long_classification_text_is_cut_before_encoding(
    tokenizer: Tokenizer, words: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    line = long_line(words, 20 * char_budget(tokenizer, MAX))
    whole = tokenizer.encode(line, add_bos=True, add_eos=True)
    recorder = Recorder(monkeypatch)
    rows = [{"text": "a b", "label": "x"}, {"text": line, "label": "y"}]
    encoded = encode("sequence_classification", rows, tokenizer, file="c.tsv", labels=("x", "y"))
    assert recorder.longest == char_budget(tokenizer, MAX)
    assert framed(tokenizer, encoded["text"][1]) == [*whole[: MAX - 1], whole[-1]]
    assert encoded["label"] == [0, 1]


def test_a_long_tagged_sentence_is_cut_at_a_word_and_keeps_its_tags_aligned(
    tokenizer: Tokenizer, words: list[str]
) -> None:
    row = long_line(words, 20 * char_budget(tokenizer, MAX)).split()
    tags = ["A" if i % 2 else "B" for i in range(len(row))]
    task, kw = "token_classification", {"file": "t.jsonl", "labels": ("A", "B")}
    cut = encode(task, [{"tokens": row, "tags": tags}], tokenizer, **kw)
    reference = encode(task, [{"tokens": row[:40], "tags": tags[:40]}], tokenizer, **kw)
    assert cut == reference
    with pytest.raises(DataError, match=r"t\.jsonl:1: [0-9,]+ characters, more than the limit"):
        encode(task, [{"tokens": row, "tags": tags}], tokenizer, too_long="error", **kw)


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
    recorder = TokenizerRecorder(tokenizer, monkeypatch)
    out = translate(
        model, ["a b", line], source_tokenizer=tokenizer, target_tokenizer=tokenizer, max_new_tokens=2
    )
    assert recorder.longest == char_budget(tokenizer, MAX) and len(out) == 2
