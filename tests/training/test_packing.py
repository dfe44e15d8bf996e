"""Packed language-model data: documents framed, concatenated and cut into windows; with separate
documents, each token sees only its own document, at the position it would have alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from zoo.losses import IGNORE_INDEX
from zoo.models.build import build_model
from zoo.spec import preset
from zoo.training.config import TrainConfig
from zoo.training.data.shards import ShardWriter, SideInfo, open_prepared
from zoo.training.task_settings import settings_for
from zoo.training.tasks import build_task
from zoo.training.tasks.base import Limits, Split, Tokenizers

DOCS = [[7, 8, 9, 10, 11], [12, 13], [14, 15, 16, 17, 18, 19, 20], [21], [22, 23, 24]]


class Specials:
    """A stand-in tokenizer: pad 0, bos 1, eos 2, unk 3, mask 4."""

    bos_id, eos_id, mask_id, pad_id, vocab_size = 1, 2, 4, 0, 64

    def special_ids(self) -> dict[str, int]:
        return {"pad": 0, "bos": 1, "eos": 2, "unk": 3, "mask": 4}


def split_of(tmp_path: Path, docs: list[list[int]]) -> Split:
    with ShardWriter(tmp_path / "docs", {"text": SideInfo(vocab_size=64)}) as writer:
        writer.write({"text": docs}, origins=[(0, i + 1) for i in range(len(docs))])
        writer.close(sources=[{"path": "docs.txt", "bytes": 0, "mtime_ns": 0, "sha256": ""}])
    return Split("train", open_prepared(tmp_path / "docs"))


def collator(task: str, split: Split, *, model: str, packing: dict[str, Any] | None) -> tuple[Any, Any]:
    data: dict[str, Any] = {"train": "docs.txt"} | ({"packing": packing} if packing else {})
    config = TrainConfig.from_dict({"model": model, "data": data, "max_steps": 1})
    spec = preset(model).override(vocab_size=64, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    tokenizers, limits = Tokenizers(Specials()), Limits(spec.max_positions)  # type: ignore[arg-type]
    t = build_task(settings_for(task), packing=config.data.packing)
    units = t.units(split, tokenizers=tokenizers, limits=limits)
    return units, t.collator(split, units, spec=spec, tokenizers=tokenizers, limits=limits)


def token_losses(model: torch.nn.Module, batch: Any) -> torch.Tensor:
    """The loss of every scored position, in row-major order."""
    logits = model(**batch.inputs).logits  # (B, T, V)
    losses = F.cross_entropy(
        logits.transpose(1, 2), batch.targets, reduction="none", ignore_index=IGNORE_INDEX
    )
    return losses[batch.targets != IGNORE_INDEX]


def test_windows_cut_the_framed_stream_end_to_end(tmp_path: Path) -> None:
    split = split_of(tmp_path, DOCS)
    stream = [t for doc in DOCS for t in (1, *doc, 2)]
    units, collate = collator("causal_lm", split, model="gpt2-tiny", packing={"block_size": 8})
    assert units.lengths[:, 0].tolist() == [8, 8, 8, len(stream) - 24]
    batch = collate(np.arange(len(units)))
    rows = [
        row[mask.bool()].tolist()
        for row, mask in zip(batch.inputs["input_ids"], batch.inputs["attention_mask"])
    ]
    assert [t for row in rows for t in row] == stream
    assert "document_ids" not in batch.inputs  # joined documents: one window attends across them
    # joined: the eos of one document predicts the bos of the next, inside a window
    assert batch.targets[0, 6].item() == 1 and batch.inputs["input_ids"][0, 6].item() == 2


def test_separate_documents_get_ids_and_no_target_across_a_boundary(tmp_path: Path) -> None:
    split = split_of(tmp_path, DOCS)
    _, collate = collator(
        "causal_lm", split, model="gpt2-tiny", packing={"block_size": 8, "documents": "separate"}
    )
    batch = collate(np.array([0, 1]))
    documents = batch.inputs["document_ids"]
    assert documents[0].tolist() == [0] * 7 + [1]  # [bos a eos] then the start of document 1
    assert documents[1].tolist() == [1, 1, 1, 2, 2, 2, 2, 2]  # document 1 continues in the next window
    boundary = documents[:, 1:] != documents[:, :-1]
    assert (batch.targets[:, :-1][boundary] == IGNORE_INDEX).all()


OPTIONS: dict[str, dict[str, object]] = {
    # YaRN (original context 4, shorter than the documents) with a layer that rotates nothing
    "llama-tiny-yarn-nope": {
        "position": {
            "kind": "rotary",
            "scaling": {
                "type": "yarn",
                "factor": 4.0,
                "original_max_positions": 4,
                "mscale": 0.8,
                "mscale_all_dim": 1.0,
            },
            "nope_layers": [0],
        }
    },
}


@pytest.mark.parametrize(
    "model", ["llama-tiny", "gpt2-tiny", "llama-tiny-yarn-nope", "deepseek-tiny", "llama4-tiny"]
)  # rotary, learned, options, latent, chunks with temperature tuning
def test_a_packed_batch_of_separate_documents_has_the_losses_of_each_document_alone(
    model: str, tmp_path: Path
) -> None:
    options = OPTIONS.get(model, {})
    model = model.removesuffix("-yarn-nope")
    split = split_of(tmp_path, DOCS)
    block = sum(len(doc) + 2 for doc in DOCS)  # one window holds them all
    _, packed = collator(
        "causal_lm", split, model=model, packing={"block_size": block, "documents": "separate"}
    )
    _, alone = collator("causal_lm", split, model=model, packing=None)
    torch.manual_seed(0)
    net = build_model(
        preset(model).override(vocab_size=64, pad_token_id=0, bos_token_id=1, eos_token_id=2, **options)
    ).eval()
    with torch.no_grad():
        together = token_losses(net, packed(np.array([0])))
        one_by_one = torch.cat([token_losses(net, alone(np.array([i]))) for i in range(len(DOCS))])
    assert together.shape == one_by_one.shape == (sum(len(doc) + 1 for doc in DOCS),)
    torch.testing.assert_close(together, one_by_one, atol=1e-5, rtol=1e-5)


def test_masked_lm_on_packed_separate_documents_matches_each_document_alone(tmp_path: Path) -> None:
    split = split_of(tmp_path, DOCS)
    block = sum(len(doc) + 2 for doc in DOCS)
    _, packed = collator(
        "masked_lm", split, model="bert-tiny", packing={"block_size": block, "documents": "separate"}
    )
    torch.manual_seed(0)
    spec = preset("bert-tiny").override(vocab_size=64, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    net = build_model(spec).eval()
    batch = packed(np.array([0]), generator=torch.Generator().manual_seed(3))  # the mask, fixed
    ids, targets, documents = batch.inputs["input_ids"][0], batch.targets[0], batch.inputs["document_ids"][0]
    assert (targets != IGNORE_INDEX).any()
    with torch.no_grad():
        together = token_losses(net, batch)
        one_by_one = []
        for d in range(len(DOCS)):  # the same masked ids, one document at a time
            keep = documents == d
            alone = type(batch)({"input_ids": ids[keep][None]}, targets[keep][None], int(keep.sum()))
            one_by_one.append(token_losses(net, alone))
    torch.testing.assert_close(together, torch.cat(one_by_one), atol=1e-5, rtol=1e-5)


def test_a_block_over_the_length_limit_is_refused(tmp_path: Path) -> None:
    from zoo.training.config import ConfigError

    with pytest.raises(ConfigError, match=r"data.packing.block_size \(4096\) exceeds the length limit \(128"):
        collator("causal_lm", split_of(tmp_path, DOCS), model="gpt2-tiny", packing={"block_size": 4096})
