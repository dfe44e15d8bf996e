"""Packed seq2seq data: whole (source, target) pairs several to a row, each token with its pair's id, and
each pair trained as it would be alone; `zoo train` runs packed from raw files and from prepared shards."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from zoo.cli import main
from zoo.demo import toy_corpus, write_tsv
from zoo.io.tokenizer import train_tokenizer
from zoo.losses import IGNORE_INDEX
from zoo.models.build import build_model
from zoo.spec import ModelSpec, preset
from zoo.training.config import PackingConfig
from zoo.training.data.packing import pack_rows
from zoo.training.data.shards import ShardWriter, SideInfo, open_prepared
from zoo.training.task_settings import settings_for
from zoo.training.tasks import build_task
from zoo.training.tasks.base import Limits, Split, Tokenizers

EOS, START = 2, 5
# raw ids per pair (framing adds eos to each side)
PAIRS = [
    ([7, 8, 9], [10, 11]),
    ([12], [13, 14, 15, 16]),
    ([17, 18, 19, 20, 21], [22]),
    ([23, 24], [25, 26, 27]),
    ([28, 29, 30, 31], [32, 33, 34, 35, 36]),
    ([37], [38]),
]


class Specials:
    """A stand-in tokenizer: pad 0, bos 1, eos 2, unk 3."""

    bos_id, eos_id, mask_id, pad_id, vocab_size = 1, EOS, None, 0, 64

    def special_ids(self) -> dict[str, int]:
        return {"pad": 0, "bos": 1, "eos": EOS, "unk": 3}


def split_of(tmp_path: Path, pairs: list[tuple[list[int], list[int]]]) -> Split:
    sides = {"source": SideInfo(vocab_size=64), "target": SideInfo(vocab_size=64)}
    with ShardWriter(tmp_path / "pairs", sides) as writer:
        writer.write(
            {"source": [s for s, _ in pairs], "target": [t for _, t in pairs]},
            origins=[(0, i + 1) for i in range(len(pairs))],
        )
        writer.close(sources=[{"path": "pairs.tsv", "bytes": 0, "mtime_ns": 0, "sha256": ""}])
    return Split("train", open_prepared(tmp_path / "pairs"))


def spec_of(name: str) -> ModelSpec:
    return preset(name).override(
        vocab_size=64, pad_token_id=0, eos_token_id=EOS, decoder_start_token_id=START, max_positions=64
    )


def collator(split: Split, spec: ModelSpec, packing: dict[str, Any] | None, **limits: Any) -> tuple[Any, Any]:
    task = build_task(settings_for("seq2seq"), packing=PackingConfig(**packing) if packing else None)
    tokenizers, limit = Tokenizers(Specials()), Limits(spec.max_positions, **limits)  # type: ignore[arg-type]
    units = task.units(split, tokenizers=tokenizers, limits=limit)
    return units, task.collator(split, units, spec=spec, tokenizers=tokenizers, limits=limit)


def test_rows_take_whole_pairs_under_the_block_on_each_side() -> None:
    lengths = np.array([[4, 3], [2, 5], [6, 2], [3, 4], [5, 6], [2, 2]])
    rows = pack_rows(lengths, block=8)
    # pair 5 has no room in row 0 (its target side would hold 10): the first open row with room takes it
    assert [rows.members(r).tolist() for r in range(len(rows))] == [[0, 1], [2, 5], [3], [4]]
    assert rows.lengths.tolist() == [[6, 8], [8, 4], [3, 4], [5, 6]]
    assert (rows.lengths <= 8).all() and sorted(rows.order.tolist()) == list(range(6))
    assert rows.lengths.sum(axis=0).tolist() == lengths.sum(axis=0).tolist()
    with pytest.raises(ValueError, match=r"each at most block \(8\)"):
        pack_rows(np.array([[9, 1]]), block=8)


def test_a_packed_row_holds_its_pairs_end_to_end_with_their_ids(tmp_path: Path) -> None:
    units, collate = collator(split_of(tmp_path, PAIRS[:3]), spec_of("transformer-tiny"), {"block_size": 16})
    assert len(units) == 1 and units.lengths.tolist() == [[4 + 2 + 6, 3 + 5 + 2]]
    inputs, targets = (batch := collate(np.array([0]))).inputs, batch.targets
    assert inputs["input_ids"].tolist() == [[7, 8, 9, EOS, 12, EOS, 17, 18, 19, 20, 21, EOS]]
    assert inputs["document_ids"].tolist() == [[0, 0, 0, 0, 1, 1, 2, 2, 2, 2, 2, 2]]
    assert targets.tolist() == [[10, 11, EOS, 13, 14, 15, 16, EOS, 22, EOS]]
    assert inputs["decoder_input_ids"].tolist() == [[START, 10, 11, START, 13, 14, 15, 16, START, 22]]
    assert inputs["decoder_document_ids"].tolist() == [[0, 0, 0, 1, 1, 1, 1, 1, 2, 2]]
    assert batch.num_tokens == 22


def test_padding_is_a_pair_of_its_own_and_skipped_pairs_are_left_out(tmp_path: Path) -> None:
    pairs = [*PAIRS, (list(range(6, 26)), [7])]  # the last is longer than the block: skipped
    units, collate = collator(split_of(tmp_path, pairs), spec_of("transformer-tiny"), {"block_size": 10},
                              too_long="skip")  # fmt: skip
    batch = collate(np.arange(len(units)))
    documents, ids = batch.inputs["document_ids"], batch.inputs["input_ids"]
    assert ((documents == -1) == (batch.inputs["attention_mask"] == 0)).all()
    assert ((batch.inputs["decoder_document_ids"] == -1) == (batch.targets == IGNORE_INDEX)).all()
    sources = sorted(tuple(t for t in row.tolist() if t not in (0, EOS)) for row in ids)
    assert sum(len(s) for s in sources) == sum(
        len(s) for s, _ in PAIRS
    )  # every kept pair once, not the long one
    assert 25 not in ids


def per_token_losses(model: torch.nn.Module, batch: Any) -> torch.Tensor:
    logits = model(**batch.inputs).logits
    losses = F.cross_entropy(
        logits.transpose(1, 2), batch.targets, reduction="none", ignore_index=IGNORE_INDEX
    )
    return losses[batch.targets != IGNORE_INDEX]


@pytest.mark.parametrize("name", ["transformer-tiny", "t5-tiny", "bart-tiny"])
def test_a_packed_batch_has_the_losses_of_each_pair_alone(name: str, tmp_path: Path) -> None:
    split, spec = split_of(tmp_path, PAIRS), spec_of(name)
    units, packed = collator(split, spec, {"block_size": 12})
    assert len(units) < len(PAIRS)  # rows do hold several pairs
    _, alone = collator(split, spec, None)
    torch.manual_seed(0)
    model = build_model(spec).eval()
    task = build_task(settings_for("seq2seq"), packing=PackingConfig(block_size=12))
    rows = task._packed_pairs(split, Tokenizers(Specials()), Limits(spec.max_positions))[1]  # type: ignore[arg-type]
    order = [int(e) for r in range(len(rows)) for e in rows.members(r)]
    with torch.no_grad():
        together = per_token_losses(model, packed(np.arange(len(units))).to("cpu"))
        one_by_one = torch.cat([per_token_losses(model, alone(np.array([e]))) for e in order])
    assert together.shape == one_by_one.shape == (sum(len(t) + 1 for _, t in PAIRS),)
    torch.testing.assert_close(together, one_by_one, atol=1e-5, rtol=1e-5)


# --- zoo train, packed -----------------------------------------------------------------------------------


@pytest.fixture
def corpus(tmp_path: Path) -> tuple[Path, Path, Path]:
    toy = toy_corpus(seed=0, train_size=200, valid_size=10)
    write_tsv(toy.train, tmp_path / "train.tsv")
    write_tsv(toy.valid, tmp_path / "valid.tsv")
    train_tokenizer([tmp_path / "train.tsv"], kind="bpe", vocab_size=300).save(tmp_path / "tok.json")
    return tmp_path / "train.tsv", tmp_path / "valid.tsv", tmp_path / "tok.json"


def test_zoo_train_packs_pairs_read_from_prepared_shards(
    corpus: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    train_file, valid_file, tok = corpus
    out = tmp_path / "prepared"
    assert (
        main(
            [
                "data",
                "prepare",
                "--task",
                "seq2seq",
                "--tokenizer",
                str(tok),
                "--out",
                str(out),
                str(train_file),
            ]
        )
        == 0
    )
    run = tmp_path / "run"
    argv = ["train", "examples/translate.yaml", "--no-progress", "--max-steps", "2", "--output-dir", str(run),
            "--set", f"data.train={{prepared: {out}}}", "--set", f"data.valid={valid_file}",
            "--set", f"tokenizer={{path: {tok}}}", "--set", "data.packing={block_size: 64}",
            "--set", "task.bleu=false", "--set", "batch.max_tokens=512"]  # fmt: skip
    root = Path(__file__).resolve().parents[2]
    cwd = Path.cwd()
    try:
        import os

        os.chdir(root)  # the example's model and settings; its data replaced
        assert main(argv) == 0
    finally:
        os.chdir(cwd)
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r.get("loss") is not None][-1] == 2
    saved = (run / "train_config.yaml").read_text()
    assert "block_size: 64" in saved
