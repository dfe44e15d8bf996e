"""A line far over the length limit is cut before it is encoded, keeping the tokens truncation would keep."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from zoo.io.tokenizer import Tokenizer, train_tokenizer
from zoo.io.tokenizer.lengths import char_budget, cut_before_encoding, cut_messages, cut_words
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
    assert cut_messages(["ab", "cd", "ef"], 3) == (["ab", "cd"], True)  # 4 characters: over the budget
    assert cut_messages(["abcdef"], 3) == (["abcd"], True)
    assert cut_messages(["", "", "", "", ""], 2) == (["", "", ""], True)  # 3 messages: over it too
    assert cut_messages(["ab", "c"], 3) == (["ab", "c"], False)


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


class RenderRecorder:
    """Wraps the chat task's template rendering, keeping the longest text a render wrote and counting them."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.longest = self.renders = 0
        from zoo.training.tasks import chat

        render = chat.render

        def recorded(*args: Any, **kwargs: Any) -> str:
            text = render(*args, **kwargs)
            self.longest = max(self.longest, len(text))
            self.renders += 1
            return text

        monkeypatch.setattr(chat, "render", recorded)


def chat_rows(tokenizer: Tokenizer, messages: list[dict[str, str]]) -> tuple[list[int], list[int]]:
    """(ids, trained mask) of the whole conversation, rendered and encoded uncut, then truncated to MAX."""
    from zoo.training.tasks.chat import chat_template, rendering, trained_tokens

    record = Record(Path("c.jsonl"), 1, chat_record(messages))
    text, spans = rendering(record, tokenizer, chat_template(tokenizer))
    encoding = tokenizer.hf.encode(text, add_special_tokens=False)
    mask = trained_tokens(np.asarray(encoding.offsets, dtype=np.int64).reshape(-1, 2), spans)
    return encoding.ids[:MAX], mask[:MAX].tolist()


def chat_template_text(tokenizer: Tokenizer, messages: list[dict[str, str]]) -> str:
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    assert isinstance(text, str)
    return text


def chat_record(messages: list[dict[str, str]]) -> dict[str, Any]:
    return {"roles": [m["role"] for m in messages], "contents": [m["content"] for m in messages]}


@pytest.mark.parametrize("shape", ["one long message", "many messages", "many empty messages"])
def test_a_long_conversation_is_cut_before_it_is_rendered_and_keeps_the_tokens_truncation_would_keep(
    tokenizer: Tokenizer, words: list[str], monkeypatch: pytest.MonkeyPatch, shape: str
) -> None:
    """A 50 MB chat line was rendered whole (several times: once per prompt before an answer), past the
    renderer's bound, before the rendering was cut to the length limit."""
    budget = char_budget(tokenizer, MAX)
    if shape == "one long message":
        messages = [
            {"role": "user", "content": "a b"},
            {"role": "assistant", "content": long_line(words, 40 * budget)},
        ]
    else:  # hundreds of short turns: rendering each answer's prompt, whole, would be quadratic
        messages = [
            {"role": role, "content": long_line(words, 10, seed=i) if shape == "many messages" else ""}
            for i in range(300)
            for role in ("user", "assistant")
        ]
    whole = chat_rows(tokenizer, messages)
    recorder = RenderRecorder(monkeypatch)
    encoded = encode("chat", [chat_record(messages)], tokenizer, file="c.jsonl")
    # Rendered: the contents up to the budget, or (empty ones) its number of messages, each with its markup.
    kept = messages[: budget + 1] if shape == "many empty messages" else messages[:0]
    bound = len(chat_template_text(tokenizer, kept)) if kept else 3 * budget
    assert recorder.longest <= bound < len(chat_template_text(tokenizer, messages)) * 3 / 4
    assert recorder.renders < 60  # not one per message (601): only the answers that begin before the cut
    assert (encoded["tokens"][0], encoded["labels"][0]) == whole


def test_a_chat_line_longer_than_the_renderer_allows_is_truncated_not_refused(
    tokenizer: Tokenizer, words: list[str], tmp_path: Path
) -> None:
    """Rendered whole, a message of 9 million characters went past the template renderer's bound of 8 Mi
    characters: a run with a length limit refused the line instead of cutting it."""
    import json

    from zoo.io.tokenizer.chat import MAX_CHARS
    from zoo.training.corpus import prepare_corpus

    content = (" ".join(words[:50]) + " ") * (MAX_CHARS // len(" ".join(words[:50])) + 10)
    assert len(content) > MAX_CHARS
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps({"prompt": "a b", "response": content}) + "\n", encoding="utf-8")
    done = prepare_corpus("chat", [path], tokenizer=tokenizer, out=tmp_path / "p", max_length=MAX)
    assert done.manifest.counts["over_max_length"] == 1
    assert done.manifest.sides["tokens"].tokens == MAX
