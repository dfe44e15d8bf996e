"""Data: every bad line found up front with its file and line, bucketed batches, teacher forcing."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from zoo.io.tokenizer import Tokenizer, train_tokenizer
from zoo.losses import IGNORE_INDEX
from zoo.training.batching import Collator, epoch_order, plan_batches
from zoo.training.config import ParallelFiles
from zoo.training.data import DataError, EncodedExamples, encode_examples, read_examples


@pytest.fixture(scope="module")
def tokenizer(toy_files: tuple[Path, Path]) -> Tokenizer:
    return train_tokenizer([toy_files[0]], kind="bpe", vocab_size=400)


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def test_tsv_line_without_a_tab_names_file_and_line(tmp_path: Path) -> None:
    path = write(tmp_path / "bad.tsv", "a b\tc d\n\nno tab here\ne\tf\n")
    with pytest.raises(DataError, match=r"bad\.tsv:3: expected 'source<TAB>target', found no tab"):
        read_examples(path, task="seq2seq")


def test_tsv_line_with_two_tabs_or_an_empty_side_is_refused(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"x\.tsv:1: .*found 2 tabs"):
        read_examples(write(tmp_path / "x.tsv", "a\tb\tc\n"), task="seq2seq")
    with pytest.raises(DataError, match=r"y\.tsv:2: empty target"):
        read_examples(write(tmp_path / "y.tsv", "a\tb\nc\t \n"), task="seq2seq")


def test_missing_and_empty_files_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"nope\.tsv: data file not found"):
        read_examples(tmp_path / "nope.tsv", task="seq2seq")
    with pytest.raises(DataError, match=r"empty\.txt: no examples"):
        read_examples(write(tmp_path / "empty.txt", "\n  \n"), task="causal_lm")
    with pytest.raises(DataError, match=r"not UTF-8"):
        (tmp_path / "latin1.txt").write_bytes("caf\xe9\n".encode("latin-1"))
        read_examples(tmp_path / "latin1.txt", task="causal_lm")


def test_aligned_files_must_have_the_same_number_of_lines(tmp_path: Path) -> None:
    files = ParallelFiles(source=write(tmp_path / "s.en", "a\nb\n"), target=write(tmp_path / "t.ko", "c\n"))
    with pytest.raises(DataError, match=r"s\.en has 2 lines but .*t\.ko has 1"):
        read_examples(files, task="seq2seq")
    ok = ParallelFiles(source=files.source, target=write(tmp_path / "t2.ko", "c\nd\n"))
    text = read_examples(ok, task="seq2seq")
    assert text.sources == ["a", "b"] and text.targets == ["c", "d"]


def test_plain_text_skips_blank_lines_and_keeps_line_numbers(tmp_path: Path) -> None:
    text = read_examples(write(tmp_path / "lm.txt", "one two\n\nthree\n"), task="causal_lm")
    assert text.targets == ["one two", "three"] and text.sources is None
    assert text.origins == [f"{tmp_path / 'lm.txt'}:1", f"{tmp_path / 'lm.txt'}:3"]


def test_seq2seq_framing_ends_both_sides_with_eos(tokenizer: Tokenizer, toy_files: tuple[Path, Path]) -> None:
    text = read_examples(toy_files[1], task="seq2seq")
    data = encode_examples(text, task="seq2seq", target_tokenizer=tokenizer, max_length=64)
    assert data.sources[0] == tokenizer.encode(text.sources[0])  # type: ignore[index]
    assert all(ids[-1] == tokenizer.eos_id for ids in data.sources + data.targets)  # type: ignore[operator]
    assert tokenizer.decode(data.targets[0]) == text.targets[0]


def test_too_long_sequences_are_truncated_with_a_warning_skipped_or_refused(
    tokenizer: Tokenizer, toy_files: tuple[Path, Path], caplog: pytest.LogCaptureFixture
) -> None:
    text = read_examples(toy_files[1], task="seq2seq")
    kwargs = dict(task="seq2seq", target_tokenizer=tokenizer, max_length=6)
    with caplog.at_level(logging.WARNING, logger="zoo.training"):
        cut = encode_examples(text, too_long="truncate", **kwargs)
    assert "were truncated" in caplog.text and "valid.tsv:" in caplog.text
    assert len(cut) == len(text.targets)
    assert all(len(ids) <= 6 and ids[-1] == tokenizer.eos_id for ids in cut.sources + cut.targets)  # type: ignore[operator]
    skipped = encode_examples(text, too_long="skip", **{**kwargs, "max_length": 10})
    assert 0 < len(skipped) < len(text.targets)
    assert all(len(ids) <= 10 for ids in skipped.sources + skipped.targets)  # type: ignore[operator]
    with pytest.raises(DataError, match=r"valid\.tsv:\d+: \d+ tokens, more than the limit of 6"):
        encode_examples(text, too_long="error", **kwargs)


def _data(lengths: list[tuple[int, int]]) -> EncodedExamples:
    sources = [[7] * (s - 1) + [2] for s, _ in lengths]
    targets = [[8] * (t - 1) + [2] for _, t in lengths]
    return EncodedExamples(targets=targets, sources=sources, origins=[f"f:{i}" for i in range(len(lengths))])


def test_batches_hold_every_example_once_within_the_token_budget() -> None:
    gen = torch.Generator().manual_seed(0)
    lengths = [(int(s), int(t)) for s, t in torch.randint(2, 30, (500, 2), generator=gen)]
    data = _data(lengths)
    plan = plan_batches(data, max_tokens=256, seed=3)
    assert sorted(i for batch in plan for i in batch) == list(range(500))
    padded = real = 0
    for batch in plan:
        longest = max(lengths[i][0] for i in batch) + max(lengths[i][1] for i in batch)
        assert len(batch) * longest <= 256
        padded += len(batch) * longest
        real += sum(lengths[i][0] + lengths[i][1] for i in batch)
    assert real / padded > 0.8  # bucketing by length pads little (random batches: ~0.55)
    assert plan_batches(data, max_tokens=256, seed=3) == plan
    assert all(len(b) <= 5 for b in plan_batches(data, max_tokens=256, max_sentences=5))


def test_an_example_over_the_token_budget_is_named() -> None:
    with pytest.raises(DataError, match=r"f:1: one example has 50 tokens, more than batch.max_tokens \(40\)"):
        plan_batches(_data([(3, 3), (25, 25)]), max_tokens=40)


def test_epoch_order_is_reproducible_and_differs_between_epochs() -> None:
    assert epoch_order(50, seed=1, epoch=2) == epoch_order(50, seed=1, epoch=2)
    assert epoch_order(50, seed=1, epoch=2) != epoch_order(50, seed=1, epoch=3)
    assert sorted(epoch_order(50, seed=1, epoch=2)) == list(range(50))
    assert epoch_order(5, seed=1, epoch=2, shuffle=False) == [0, 1, 2, 3, 4]


def test_teacher_forcing_shifts_decoder_inputs_right_and_pads_labels_with_ignore() -> None:
    data = EncodedExamples(
        targets=[[5, 6, 7, 2], [8, 2]], sources=[[9, 2], [10, 11, 12, 2]], origins=["a", "b"]
    )
    batch = Collator(data, task="seq2seq", pad_id=0, start_id=1)([0, 1])
    assert batch.inputs["input_ids"].tolist() == [[9, 2, 0, 0], [10, 11, 12, 2]]
    assert batch.inputs["attention_mask"].tolist() == [[1, 1, 0, 0], [1, 1, 1, 1]]
    assert batch.inputs["decoder_input_ids"].tolist() == [[1, 5, 6, 7], [1, 8, 0, 0]]
    assert batch.inputs["decoder_attention_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]
    assert batch.targets.tolist() == [[5, 6, 7, 2], [8, 2, IGNORE_INDEX, IGNORE_INDEX]]
    assert batch.num_tokens == 6 + 6


def test_moving_a_batch_drops_only_the_masks_that_hide_nothing() -> None:
    data = EncodedExamples(targets=[[5, 6, 7, 2], [8, 9, 2]], sources=[[9, 2], [10, 2]], origins=["a", "b"])
    batch = Collator(data, task="seq2seq", pad_id=0, start_id=1)([0, 1])
    moved = batch.to("cpu")
    assert "attention_mask" not in moved.inputs  # both sources are 2 tokens: nothing to mask
    assert moved.inputs["decoder_attention_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 1, 0]]
    assert set(batch.inputs) == {"input_ids", "attention_mask", "decoder_input_ids", "decoder_attention_mask"}


def test_causal_lm_targets_are_the_next_tokens() -> None:
    data = EncodedExamples(targets=[[1, 5, 6, 2], [1, 7, 2]], sources=None, origins=["a", "b"])
    batch = Collator(data, task="causal_lm", pad_id=0)([0, 1])
    assert batch.inputs["input_ids"].tolist() == [[1, 5, 6, 2], [1, 7, 2, 0]]
    assert batch.targets.tolist() == [[5, 6, 2, IGNORE_INDEX], [7, 2, IGNORE_INDEX, IGNORE_INDEX]]


def test_masked_lm_batches_mask_only_real_non_special_tokens() -> None:
    data = EncodedExamples(targets=[[1, *range(5, 45), 2], [1, 5, 6, 2]], sources=None, origins=["a", "b"])
    collate = Collator(data, task="masked_lm", pad_id=0, mask_id=4, special_ids=(0, 1, 2, 3, 4), vocab_size=50,
                       mlm_probability=0.5)  # fmt: skip
    batch = collate([0, 1], generator=torch.Generator().manual_seed(0))
    picked = batch.targets != IGNORE_INDEX
    assert picked.any()
    original = collate.data.targets[0]
    assert not picked[0, 0] and not picked[0, len(original) - 1] and not picked[1, 4:].any()
    again = collate([0, 1], generator=torch.Generator().manual_seed(0))
    assert torch.equal(again.inputs["input_ids"], batch.inputs["input_ids"])
