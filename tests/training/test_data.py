"""Data: every bad line found up front with its file and line, bucketed batches, framing, teacher forcing."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from zoo.io.tokenizer import Tokenizer, train_tokenizer
from zoo.losses import IGNORE_INDEX
from zoo.spec import preset
from zoo.training.batching import BatchOrder
from zoo.training.config import ParallelFiles
from zoo.training.corpus import prepare_split
from zoo.training.data import DataError
from zoo.training.data.shards import ShardWriter, SideInfo, open_prepared
from zoo.training.tasks import get_task
from zoo.training.tasks.base import Limits, Split, Tokenizers, Units


@pytest.fixture(scope="module")
def tokenizer(toy_files: tuple[Path, Path]) -> Tokenizer:
    return train_tokenizer([toy_files[0]], kind="bpe", vocab_size=400)


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def read(files: Any, task: str = "seq2seq") -> list[dict[str, Any]]:
    """Every record of a raw split as ``task`` reads it: (origin, fields)."""
    return [{"origin": r.origin, **r.fields} for r in get_task(task).records(get_task(task).source(files))]


def shards(tmp_path: Path, sides: dict[str, list[list[int]]]) -> Split:
    """A prepared split holding exactly these raw ids."""
    n = len(next(iter(sides.values())))
    with ShardWriter(tmp_path / "data", {name: SideInfo(vocab_size=100) for name in sides}) as writer:
        writer.write(sides, origins=[(0, i + 1) for i in range(n)])
        writer.close(sources=[{"path": "f", "bytes": 0, "mtime_ns": 0, "sha256": ""}])
    return Split("train", open_prepared(tmp_path / "data"))


def test_tsv_line_without_a_tab_names_file_and_line(tmp_path: Path) -> None:
    path = write(tmp_path / "bad.tsv", "a b\tc d\n\nno tab here\ne\tf\n")
    with pytest.raises(DataError, match=r"bad\.tsv:3: expected 2 tab-separated columns, found no tab"):
        read(path)


def test_tsv_line_with_two_tabs_or_an_empty_side_is_refused(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"x\.tsv:1: .*found 2 tabs"):
        read(write(tmp_path / "x.tsv", "a\tb\tc\n"))
    with pytest.raises(DataError, match=r"y\.tsv:2: empty target"):
        read(write(tmp_path / "y.tsv", "a\tb\nc\t \n"))


def test_missing_and_empty_files_are_clear_errors(tmp_path: Path, tokenizer: Tokenizer) -> None:
    with pytest.raises(FileNotFoundError, match=r"nope\.tsv: data file not found"):
        read(tmp_path / "nope.tsv")
    with pytest.raises(DataError, match=r"empty\.txt: no examples"):
        prepare_split(
            get_task("causal_lm"),
            write(tmp_path / "empty.txt", "\n  \n"),
            Tokenizers(tokenizer),
            name="train",
            limits=None,
        )
    with pytest.raises(DataError, match=r"latin1\.txt:1: not UTF-8"):
        (tmp_path / "latin1.txt").write_bytes("caf\xe9\n".encode("latin-1"))
        read(tmp_path / "latin1.txt", "causal_lm")


def test_aligned_files_must_have_the_same_number_of_lines(tmp_path: Path) -> None:
    files = ParallelFiles(source=write(tmp_path / "s.en", "a\nb\n"), target=write(tmp_path / "t.ko", "c\n"))
    with pytest.raises(DataError, match=r"t\.ko ends at line 1 but .*s\.en goes on"):
        read(files)
    ok = ParallelFiles(source=files.source, target=write(tmp_path / "t2.ko", "c\nd\n"))
    assert [(r["source"], r["target"]) for r in read(ok)] == [("a", "c"), ("b", "d")]


def test_plain_text_skips_blank_lines_and_keeps_line_numbers(tmp_path: Path) -> None:
    records = read(write(tmp_path / "lm.txt", "one two\n\nthree\n"), "causal_lm")
    assert [r["text"] for r in records] == ["one two", "three"]
    assert [r["origin"] for r in records] == [f"{tmp_path / 'lm.txt'}:1", f"{tmp_path / 'lm.txt'}:3"]


def test_seq2seq_framing_ends_both_sides_with_eos(tokenizer: Tokenizer, toy_files: tuple[Path, Path]) -> None:
    task, tokenizers = get_task("seq2seq"), Tokenizers(tokenizer)
    split = prepare_split(task, toy_files[1], tokenizers, name="valid", limits=Limits(64))
    spec = preset("transformer-tiny").override(vocab_size=400, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    units = task.units(split, tokenizers=tokenizers, limits=Limits(64))
    batch = task.collator(split, units, spec=spec, tokenizers=tokenizers, limits=Limits(64))(np.array([0]))
    source, target = read(toy_files[1])[0]["source"], read(toy_files[1])[0]["target"]
    assert batch.inputs["input_ids"][0].tolist() == tokenizer.encode(source, add_eos=True)
    assert batch.targets[0].tolist() == tokenizer.encode(target, add_eos=True)
    assert tokenizer.decode(batch.targets[0].tolist()) == target


def test_too_long_sequences_are_truncated_with_a_warning_skipped_or_refused(
    tokenizer: Tokenizer, toy_files: tuple[Path, Path], caplog: pytest.LogCaptureFixture
) -> None:
    task, tokenizers, valid = get_task("seq2seq"), Tokenizers(tokenizer), toy_files[1]
    total = len(read(valid))
    with caplog.at_level(logging.WARNING, logger="zoo.training"):
        cut = prepare_split(task, valid, tokenizers, name="valid", limits=Limits(6, "truncate"))
    assert "were truncated" in caplog.text and "valid.tsv:" in caplog.text
    assert cut.data.num_examples == total
    assert all(int(n) <= 5 for side in ("source", "target") for n in cut.data.lengths(side))  # + eos: 6
    skipped = prepare_split(task, valid, tokenizers, name="valid", limits=Limits(10, "skip"))
    assert 0 < skipped.data.num_examples < total
    assert all(int(n) <= 9 for side in ("source", "target") for n in skipped.data.lengths(side))
    with pytest.raises(DataError, match=r"valid\.tsv:\d+: \d+ tokens, more than the limit of 6"):
        prepare_split(task, valid, tokenizers, name="valid", limits=Limits(6, "error"))


def test_prepared_data_cut_to_a_longer_limit_is_cut_again_when_batching(tmp_path: Path) -> None:
    split = shards(tmp_path, {"text": [[5] * 3, [6] * 30, [7] * 4]})
    task, tokenizers = (
        get_task("causal_lm"),
        Tokenizers(train_tokenizer(iter(["a b"] * 5), kind="bpe", vocab_size=20)),
    )
    units = task.units(split, tokenizers=tokenizers, limits=Limits(10, "truncate"))
    assert units.lengths[:, 0].tolist() == [5, 10, 6]  # bos + ids + eos, cut to 10
    skipped = task.units(split, tokenizers=tokenizers, limits=Limits(10, "skip"))
    assert skipped.example_indices(np.arange(2)).tolist() == [0, 2]
    with pytest.raises(DataError, match=r"f:2: 32 tokens, more than the limit of 10"):
        task.units(split, tokenizers=tokenizers, limits=Limits(10, "error"))


def order_of(lengths: list[int], **kw: Any) -> BatchOrder:
    return BatchOrder(np.array(lengths)[:, None], **{"max_tokens": 256, "group": 1, "seed": 3, **kw})


def test_batches_hold_every_example_once_per_epoch_within_the_token_budget() -> None:
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(2, 60, (500,), generator=gen).tolist()
    order = order_of(lengths)
    for epoch in (0, 1):
        batches = order.batches(epoch)
        assert sorted(int(i) for batch in batches for i in batch) == list(range(500))
        assert all(len(b) * max(lengths[i] for i in b) <= 256 for b in batches)
    real = sum(lengths)
    padded = sum(len(b) * max(lengths[i] for i in b) for b in order.batches(0))
    assert real / padded > 0.8  # bucketing by length pads little (random batches: ~0.55)
    assert [b.tolist() for b in order_of(lengths).batches(0)] == [b.tolist() for b in order.batches(0)]
    assert all(len(b) <= 5 for b in order_of(lengths, max_sentences=5).batches(0))


def test_an_example_over_the_token_budget_is_named(tmp_path: Path) -> None:
    units = Units(np.array([[3, 3], [25, 25]]), name=lambda u: f"f:{u + 1}")
    with pytest.raises(DataError, match=r"f:2: one example has 50 tokens, more than batch.max_tokens \(40\)"):
        BatchOrder(units.lengths, max_tokens=40, group=1, seed=0, describe=units.describe)


def test_epoch_order_is_reproducible_and_differs_between_epochs() -> None:
    lengths = [5] * 50
    first, again = order_of(lengths, max_tokens=5), order_of(lengths, max_tokens=5)
    assert [b.tolist() for b in first.batches(2)] == [b.tolist() for b in again.batches(2)]
    assert [b.tolist() for b in first.batches(2)] != [b.tolist() for b in first.batches(3)]
    assert [int(b[0]) for b in order_of(lengths, max_tokens=5, shuffle=False).batches(2)] == list(range(50))


def test_a_resumed_batch_order_continues_exactly() -> None:
    lengths = list(range(2, 40))
    straight = order_of(lengths, max_tokens=40, group=2)
    taken = [[b.tolist() for _, b in straight.next_group()] for _ in range(20)]
    resumed = order_of(lengths, max_tokens=40, group=2)
    for _ in range(7):
        resumed.next_group()
    again = order_of(lengths, max_tokens=40, group=2)
    again.epoch, again.position = resumed.epoch, resumed.position
    assert [[b.tolist() for _, b in again.next_group()] for _ in range(13)] == taken[7:]


def collate(
    task: str, split: Split, units: np.ndarray, *, spec: Any, tokenizers: Tokenizers, **kw: Any
) -> Any:
    t = get_task(task)
    all_units = t.units(split, tokenizers=tokenizers, limits=Limits(64))
    return t.collator(split, all_units, spec=spec, tokenizers=tokenizers, limits=Limits(64))(units, **kw)


class Specials:
    """A stand-in tokenizer with bos 1, eos 2 and mask 4."""

    bos_id, eos_id, mask_id, pad_id, vocab_size = 1, 2, 4, 0, 50

    def special_ids(self) -> dict[str, int]:
        return {"pad": 0, "bos": 1, "eos": 2, "unk": 3, "mask": 4}


def test_teacher_forcing_shifts_decoder_inputs_right_and_pads_labels_with_ignore(tmp_path: Path) -> None:
    split = shards(tmp_path, {"source": [[9], [10, 11, 12]], "target": [[5, 6, 7], [8]]})
    spec = preset("transformer-tiny").override(vocab_size=100, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    batch = collate("seq2seq", split, np.array([0, 1]), spec=spec, tokenizers=Tokenizers(Specials()))  # type: ignore[arg-type]
    assert batch.inputs["input_ids"].tolist() == [[9, 2, 0, 0], [10, 11, 12, 2]]
    assert batch.inputs["attention_mask"].tolist() == [[1, 1, 0, 0], [1, 1, 1, 1]]
    assert batch.inputs["decoder_input_ids"].tolist() == [[1, 5, 6, 7], [1, 8, 0, 0]]
    assert batch.inputs["decoder_attention_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]
    assert batch.targets.tolist() == [[5, 6, 7, 2], [8, 2, IGNORE_INDEX, IGNORE_INDEX]]
    assert batch.num_tokens == 6 + 6


def test_moving_a_batch_drops_only_the_masks_that_hide_nothing(tmp_path: Path) -> None:
    split = shards(tmp_path, {"source": [[9], [10]], "target": [[5, 6, 7], [8, 9]]})
    spec = preset("transformer-tiny").override(vocab_size=100, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    batch = collate("seq2seq", split, np.array([0, 1]), spec=spec, tokenizers=Tokenizers(Specials()))  # type: ignore[arg-type]
    moved = batch.to("cpu")
    assert "attention_mask" not in moved.inputs  # both sources are 2 tokens: nothing to mask
    assert moved.inputs["decoder_attention_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 1, 0]]
    assert set(batch.inputs) == {"input_ids", "attention_mask", "decoder_input_ids", "decoder_attention_mask"}


def test_causal_lm_targets_are_the_next_tokens(tmp_path: Path) -> None:
    split = shards(tmp_path, {"text": [[5, 6], [7]]})
    spec = preset("gpt2-tiny").override(vocab_size=100, pad_token_id=0)
    batch = collate("causal_lm", split, np.array([0, 1]), spec=spec, tokenizers=Tokenizers(Specials()))  # type: ignore[arg-type]
    assert batch.inputs["input_ids"].tolist() == [[1, 5, 6, 2], [1, 7, 2, 0]]
    assert batch.targets.tolist() == [[5, 6, 2, IGNORE_INDEX], [7, 2, IGNORE_INDEX, IGNORE_INDEX]]


def test_masked_lm_batches_mask_only_real_non_special_tokens(tmp_path: Path) -> None:
    split = shards(tmp_path, {"text": [list(range(5, 45)), [5, 6]]})
    spec = preset("bert-tiny").override(vocab_size=50, pad_token_id=0)
    config_kw = {"spec": spec, "tokenizers": Tokenizers(Specials())}  # type: ignore[arg-type]
    batch = collate(
        "masked_lm", split, np.array([0, 1]), generator=torch.Generator().manual_seed(0), **config_kw
    )
    picked = batch.targets != IGNORE_INDEX
    assert picked.any()
    assert not picked[0, 0] and not picked[0, 41] and not picked[1, 3:].any() and not picked[1, 0]
    again = collate(
        "masked_lm", split, np.array([0, 1]), generator=torch.Generator().manual_seed(0), **config_kw
    )
    assert torch.equal(again.inputs["input_ids"], batch.inputs["input_ids"])


def test_units_are_read_from_the_offsets_in_chunks_into_the_narrowest_type(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import zoo.training.tasks.base as base

    monkeypatch.setattr(base, "LENGTH_CHUNK", 2)  # several chunks, one partial
    rows = [[5] * n for n in (3, 1, 4, 1, 5)]
    split = shards(tmp_path, {"text": rows})
    assert split.data.read_lengths("text", 1, 4).tolist() == [1, 4, 1]
    tokenizers = Tokenizers(Specials())  # type: ignore[arg-type]
    units = get_task("causal_lm").units(split, tokenizers=tokenizers, limits=Limits(6))
    assert units.lengths.dtype == np.uint16 and units.lengths[:, 0].tolist() == [5, 3, 6, 3, 6]


def test_batches_read_rows_from_the_files_as_the_maps_hold_them(tmp_path: Path) -> None:
    rows = [[5, 6, 7], [8], [9, 10]]
    data = shards(tmp_path, {"text": rows}).data
    read = data.read_rows(np.array([2, 0, 1]), "text")
    assert [r.tolist() for r in read] == [[9, 10], [5, 6, 7], [8]]
    assert [r.tolist() for r in read] == [r.tolist() for r in data.gather([2, 0, 1], "text")]
    assert data.read_span("text", 1, 4).tolist() == [6, 7, 8]
    assert data.read_span("text", 1, 3, what="offsets").tolist() == [3, 4]
