"""Packed rows attended per group of documents (`zoo.blocks.segments`) give what the dense mask gives."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from zoo.blocks import masks, segments
from zoo.blocks.attention import sdpa
from zoo.models.build import build_model
from zoo.spec import preset

H, K, D = 4, 2, 8
# per row: document lengths; -1 fills the row (padding). Lengths of several groups (SMALL=32 merges short ones)
ROWS = [[40, 3, 70, 9], [100, 1, 20], [5, 5, 5]]


def documents(rows: list[list[int]], *, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T) document ids (-1 on padding) and (B, T) padding (1 = token) of rows holding ``rows``."""
    width = max(sum(r) for r in rows) + 3
    ids = torch.full((len(rows), width), -1)
    for b, lengths in enumerate(rows):
        ids[b, : sum(lengths)] = torch.cat([torch.full((n,), d) for d, n in enumerate(lengths)])
    order = torch.randperm(len(rows[0]), generator=torch.Generator().manual_seed(seed))
    ids[0] = torch.where(ids[0] >= 0, order[ids[0].clamp(min=0)], -1)  # ids need not count up
    return ids, (ids >= 0).long()


def dense(q, k, v, rule, frame):  # type: ignore[no-untyped-def]
    return sdpa(q, k, v, masks.pattern_mask(rule, frame), False, scale=D**-0.5)


@pytest.fixture(autouse=True)
def every_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(segments, "MIN_KEYS_SPARED", 0)  # small rows: a plan although it spares little


@pytest.mark.parametrize("causal", [False, True])
def test_self_attention_per_document_equals_the_dense_document_mask(causal: bool) -> None:
    ids, padding = documents(ROWS)
    B, T = ids.shape
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(B, H, T, D, generator=gen, requires_grad=True)
    k, v = (torch.randn(B, K, T, D, generator=gen, requires_grad=True) for _ in range(2))
    plan = segments.self_plan(ids, padding, causal=causal)
    assert plan is not None and len(plan.shapes) > 1  # several groups
    got = segments.attend(q, k, v, plan, lambda *a: sdpa(*a, scale=D**-0.5))
    rule = masks.within_documents((lambda b, i, j: j <= i) if causal else None, ids)
    frame = masks.make_frame(padding, q_len=T, offset=0)
    want = dense(q, k, v, rule, frame)
    real = (ids >= 0)[:, None, :, None].expand_as(want)
    torch.testing.assert_close(got[real], want[real], atol=1e-5, rtol=1e-5)
    assert torch.equal(got[~real], torch.zeros_like(got[~real]))  # tokens of no document
    grads = [torch.autograd.grad(out[real].square().sum(), (q, k, v)) for out in (got, want)]
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_cross_attention_per_pair_equals_the_dense_pair_mask() -> None:
    targets, target_padding = documents([[30, 4, 60, 9], [90, 2, 25], [6, 4, 5]])
    sources, source_padding = documents(ROWS)
    B, T, S = *targets.shape, sources.shape[1]
    gen = torch.Generator().manual_seed(2)
    q = torch.randn(B, H, T, D, generator=gen)
    k, v = torch.randn(B, K, S, D, generator=gen), torch.randn(B, K, S, D, generator=gen)
    plan = segments.cross_plan(targets, target_padding, sources, source_padding)
    assert plan is not None
    got = segments.attend(q, k, v, plan, lambda *a: sdpa(*a, scale=D**-0.5))
    frame = masks.cross_frame(source_padding, q_len=T, k_len=S, rows=B, device=torch.device("cpu"))
    want = dense(q, k, v, masks.pair_rule(targets, sources), frame)
    real = (targets >= 0)[:, None, :, None].expand_as(want)
    torch.testing.assert_close(got[real], want[real], atol=1e-5, rtol=1e-5)


def test_no_plan_where_a_target_has_no_source_or_ids_cost_a_sync() -> None:
    ids, padding = documents([[4, 4], [8]])
    assert segments.cross_plan(ids, padding, torch.where(ids == 1, -1, ids), None) is None
    assert segments.self_plan(ids.to("meta"), None, causal=True) is None


def test_short_rows_keep_the_dense_mask(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.undo()
    short, _ = documents([[10, 12, 9], [20, 11]])  # rows of ~34: too little to spare
    long, _ = documents([[40, 30, 100, 80], [200, 50]])
    assert segments.self_plan(short, None, causal=True) is None
    assert segments.self_plan(long, None, causal=True) is not None


@pytest.mark.parametrize("name", ["llama-tiny", "bert-tiny"])  # rotary and GQA; an encoder
def test_a_packed_row_through_the_plan_gives_each_document_its_logits_alone(name: str) -> None:
    torch.manual_seed(0)
    model = build_model(preset(name)).eval()
    lengths = [7, 12, 5]
    docs = [torch.randint(5, 100, (n,)) for n in lengths]
    ids = torch.cat([torch.full((n,), i) for i, n in enumerate(lengths)])[None]
    calls = []
    attend = segments.attend

    def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(1)
        return attend(*args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(segments, "attend", spy)
        together = model(torch.cat(docs)[None], document_ids=ids).logits[0]
    assert calls  # the plan ran
    alone = torch.cat([model(d[None]).logits[0] for d in docs])
    torch.testing.assert_close(together, alone, atol=1e-5, rtol=1e-5)
    assert F.mse_loss(together, alone) < 1e-10
