"""Packed encoder-decoder rows: several (source, target) pairs a row, each computed as it would be alone.

The per-pair token losses and the gradients of a packed batch must equal those of every pair run alone
(within 1e-5), for each position scheme the encoder-decoders use: T5's relative bias, BART's learned
positions, Marian's and the 2017 Transformer's sinusoids."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from zoo.blocks import masks, segments
from zoo.blocks.flex import attention_kernel
from zoo.losses import IGNORE_INDEX
from zoo.models.build import build_model
from zoo.spec import ModelSpec, preset

VOCAB = 96
TINY = {"d_model": 32, "num_layers": 2, "attention.num_heads": 4, "ffn.d_ff": 64, "max_positions": 128}
SPECS = {
    "t5": lambda: preset("t5-tiny").override(vocab_size=VOCAB),  # relative bias
    "bart": lambda: preset("bart-tiny").override(vocab_size=VOCAB),  # learned positions
    "marian": lambda: preset("marian-en-de").override(  # sinusoids, scaled embeddings
        vocab_size=VOCAB, pad_token_id=VOCAB - 1, decoder_start_token_id=VOCAB - 1, eos_token_id=0, **TINY
    ),
    "transformer": lambda: preset("transformer-tiny").override(vocab_size=VOCAB),  # the 2017 sinusoids
}
# (source length, target length) per pair; rows: pairs 0-2 in the first, 3-4 in the second (padded)
LENGTHS = [(5, 4), (9, 7), (3, 6), (6, 2), (4, 5)]
ROWS = [[0, 1, 2], [3, 4]]


def pairs(seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    return [
        (torch.randint(2, VOCAB - 2, (s,), generator=gen), torch.randint(2, VOCAB - 2, (t,), generator=gen))
        for s, t in LENGTHS
    ]


def right_pad(rows: list[torch.Tensor], value: int) -> torch.Tensor:
    width = max(len(r) for r in rows)
    return torch.stack([F.pad(r, (0, width - len(r)), value=value) for r in rows])


def packed_batch(data: list[tuple[torch.Tensor, torch.Tensor]], pad_id: int) -> dict[str, torch.Tensor]:
    """The pairs packed ROWS-wise: ids, masks, pair ids (-1 on padding) and labels (-100 on padding)."""
    sources = [torch.cat([data[i][0] for i in row]) for row in ROWS]
    targets = [torch.cat([data[i][1] for i in row]) for row in ROWS]
    source_docs = [torch.cat([torch.full((len(data[i][0]),), i) for i in row]) for row in ROWS]
    target_docs = [torch.cat([torch.full((len(data[i][1]),), i) for i in row]) for row in ROWS]
    return {
        "input_ids": right_pad(sources, pad_id),
        "attention_mask": right_pad([torch.ones_like(s) for s in sources], 0),
        "document_ids": right_pad(source_docs, -1),
        "labels": right_pad(targets, IGNORE_INDEX),
        "decoder_attention_mask": right_pad([torch.ones_like(t) for t in targets], 0),
        "decoder_document_ids": right_pad(target_docs, -1),
    }


def token_losses(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """(B, T, V), (B, T) -> the loss of every scored token, row-major."""
    losses = F.cross_entropy(logits.transpose(1, 2), labels, reduction="none", ignore_index=IGNORE_INDEX)
    return losses[labels != IGNORE_INDEX]


def model_of(name: str) -> tuple[torch.nn.Module, ModelSpec]:
    torch.manual_seed(0)
    spec = SPECS[name]()
    return build_model(spec).eval(), spec


def packed_and_alone(model: torch.nn.Module, spec: ModelSpec) -> tuple[torch.Tensor, torch.Tensor]:
    data = pairs()
    batch = packed_batch(data, spec.pad_token_id or 0)
    labels = batch["labels"]
    together = token_losses(model(**batch).logits, labels)
    order = [i for row in ROWS for i in row]  # the pairs in the packed batch's row-major order
    alone = torch.cat([token_losses(model(data[i][0][None], labels=data[i][1][None]).logits, data[i][1][None])
                       for i in order])  # fmt: skip
    return together, alone


@pytest.mark.parametrize("name", list(SPECS))
def test_packed_pairs_have_the_losses_and_gradients_of_each_pair_alone(name: str) -> None:
    model, spec = model_of(name)
    together, alone = packed_and_alone(model, spec)
    assert together.shape == alone.shape == (sum(t for _, t in LENGTHS),)
    torch.testing.assert_close(together, alone, atol=1e-5, rtol=1e-5)
    grads = []
    for loss in (together.sum(), alone.sum()):
        model.zero_grad()
        loss.backward(retain_graph=True)
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys() and grads[0]
    for n in grads[0]:
        torch.testing.assert_close(grads[0][n], grads[1][n], atol=1e-5, rtol=1e-4, msg=n)


@pytest.mark.parametrize("name", ["bart", "transformer"])
def test_pairs_attended_per_group_of_pairs_have_the_losses_of_each_pair_alone(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same, through `segments.SegmentPlan` (long rows take it; these short ones are made to)."""
    monkeypatch.setattr(segments, "MIN_KEYS_SPARED", 0)
    calls: list[int] = []
    attend = segments.attend
    monkeypatch.setattr(segments, "attend", lambda *a: calls.append(1) or attend(*a))
    model, spec = model_of(name)
    together, alone = packed_and_alone(model, spec)
    assert len(calls) == 3 * spec.num_layers  # encoder, decoder and cross-attention
    torch.testing.assert_close(together, alone, atol=1e-5, rtol=1e-5)


def test_without_pair_ids_the_pairs_of_a_row_would_see_each_other() -> None:
    """The check above can fail: the same row without the pair ids gives other losses."""
    model, spec = model_of("transformer")
    batch = packed_batch(pairs(), spec.pad_token_id or 0)
    with torch.no_grad():
        packed = model(**batch).logits
        joined = model(**{k: v for k, v in batch.items() if not k.endswith("document_ids")}).logits
    assert not torch.allclose(packed, joined, atol=1e-3)


def test_labels_shift_right_behind_one_start_token_per_pair() -> None:
    model, spec = model_of("transformer")
    labels = torch.tensor([[11, 12, 2, 13, 2, IGNORE_INDEX]])
    documents = torch.tensor([[0, 0, 0, 1, 1, -1]])
    start, pad = spec.start_token_id, spec.pad_token_id
    assert model.shift_right(labels, documents).tolist() == [[start, 11, 12, start, 13, start]]
    assert model.shift_right(labels).tolist() == [[start, 11, 12, 2, 13, 2]]
    assert pad is not None


def test_cross_attention_reads_only_the_pairs_own_source() -> None:
    targets, sources = torch.tensor([[0, 0, 1, -1]]), torch.tensor([[0, 1, 1, -1, -1]])
    frame = masks.cross_frame(
        torch.tensor([[1, 1, 1, 0, 0]]), q_len=4, k_len=5, rows=1, device=torch.device("cpu")
    )
    mask = masks.pattern_mask(masks.pair_rule(targets, sources), frame)
    assert mask is not None and mask.shape == (1, 1, 4, 5)
    assert mask[0, 0, :3].int().tolist() == [[1, 0, 0, 0, 0], [1, 0, 0, 0, 0], [0, 1, 1, 0, 0]]


def test_pair_ids_are_checked_by_name() -> None:
    model, spec = model_of("transformer")
    batch = packed_batch(pairs(), spec.pad_token_id or 0)
    with pytest.raises(
        ValueError, match=r"need document_ids \(source\) and decoder_document_ids \(target\) together"
    ):
        model(**{k: v for k, v in batch.items() if k != "decoder_document_ids"})
    with pytest.raises(ValueError, match=r"decoder_document_ids must have shape \(2, 17\)"):
        model(**batch | {"decoder_document_ids": batch["decoder_document_ids"][:, :4]})
    with pytest.raises(ValueError, match="document_ids must hold integer document ids"):
        model(**batch | {"document_ids": batch["document_ids"].float()})


@pytest.mark.slow  # flex_attention compiles on first use (~25 s a shape on a CPU)
@pytest.mark.parametrize("name", ["transformer", "t5"])
def test_flex_pair_masks_match_the_dense_path(name: str) -> None:
    model, spec = model_of(name)
    batch = packed_batch(pairs(), spec.pad_token_id or 0)
    with torch.no_grad():
        dense = model(**batch).logits
        with attention_kernel("flex"):
            flexed = model(**batch).logits
    real = batch["labels"] != IGNORE_INDEX
    torch.testing.assert_close(flexed[real], dense[real], atol=1e-5, rtol=1e-5)
