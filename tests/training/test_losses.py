"""Objectives: label smoothing exactly as PyTorch defines it, padding never counted, BERT's masking."""

from __future__ import annotations

import torch
from torch.nn import functional as F

from zoo.losses import IGNORE_INDEX, label_smoothed_cross_entropy
from zoo.training.tasks.masking import mask_tokens


def test_label_smoothed_loss_equals_pytorch_and_a_hand_computation() -> None:
    logits = torch.randn(3, 5, 11)
    targets = torch.randint(0, 11, (3, 5))
    targets[0, 3:] = IGNORE_INDEX
    eps = 0.1
    sums = label_smoothed_cross_entropy(logits, targets, label_smoothing=eps)
    reference = F.cross_entropy(
        logits.reshape(-1, 11), targets.reshape(-1), ignore_index=IGNORE_INDEX, label_smoothing=eps
    )
    assert int(sums.tokens) == 13
    assert torch.allclose(sums.loss / sums.tokens, reference, atol=1e-6)
    # By hand: the target distribution is (1 - eps) on the target plus eps / V on every class.
    total = 0.0
    for b in range(3):
        for t in range(5):
            if targets[b, t] == IGNORE_INDEX:
                continue
            logp = torch.log_softmax(logits[b, t].double(), dim=-1)
            q = torch.full((11,), eps / 11, dtype=torch.float64)
            q[targets[b, t]] += 1 - eps
            total += float(-(q * logp).sum())
    assert abs(float(sums.loss) - total) < 1e-4


def test_nll_is_the_unsmoothed_cross_entropy() -> None:
    logits, targets = torch.randn(2, 4, 7), torch.randint(0, 7, (2, 4))
    sums = label_smoothed_cross_entropy(logits, targets, label_smoothing=0.2)
    expected = F.cross_entropy(logits.reshape(-1, 7), targets.reshape(-1), reduction="sum")
    assert torch.allclose(sums.nll, expected, atol=1e-5)
    assert not torch.allclose(sums.loss, sums.nll)


def test_padding_never_contributes_to_loss_or_token_count() -> None:
    logits = torch.randn(2, 6, 9)
    targets = torch.randint(0, 9, (2, 6))
    targets[1, 2:] = IGNORE_INDEX
    before = label_smoothed_cross_entropy(logits, targets, label_smoothing=0.1)
    scrambled = logits.clone()
    scrambled[1, 2:] = torch.randn(4, 9) * 100  # whatever the model says at padded positions
    after = label_smoothed_cross_entropy(scrambled, targets, label_smoothing=0.1)
    assert torch.equal(before.loss, after.loss) and int(after.tokens) == 8
    alone = label_smoothed_cross_entropy(logits[1:, :2], targets[1:, :2], label_smoothing=0.1)
    first = label_smoothed_cross_entropy(logits[:1], targets[:1], label_smoothing=0.1)
    assert torch.allclose(before.loss, alone.loss + first.loss)


def _masking(ids: torch.Tensor, maskable: torch.Tensor, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    return mask_tokens(
        ids,
        maskable=maskable,
        mask_token_id=4,
        replacement_ids=torch.arange(5, 100),
        probability=0.15,
        generator=torch.Generator().manual_seed(seed),
    )


def test_masking_never_touches_special_tokens_or_padding() -> None:
    ids = torch.randint(5, 100, (64, 40))
    ids[:, 0], ids[:, -1], ids[:, 30:35] = 1, 2, 0  # bos, eos, a run of padding
    maskable = ids >= 5
    for seed in range(5):
        masked, targets = _masking(ids, maskable, seed)
        assert torch.equal(masked[~maskable], ids[~maskable])
        assert (targets[~maskable] == IGNORE_INDEX).all()


def test_masking_follows_the_80_10_10_rule() -> None:
    ids = torch.randint(5, 100, (400, 250))
    masked, targets = _masking(ids, torch.ones_like(ids, dtype=torch.bool))
    picked = targets != IGNORE_INDEX
    assert torch.equal(targets[picked], ids[picked])  # targets are the original tokens
    share = picked.float().mean().item()
    assert abs(share - 0.15) < 0.005
    n = picked.sum().item()
    as_mask = (masked[picked] == 4).sum().item() / n
    unchanged = (masked[picked] == ids[picked]).sum().item() / n
    assert abs(as_mask - 0.8) < 0.01
    # "unchanged" includes the random draws that hit the original token (1 in 95 of the 10%).
    assert abs(unchanged - (0.1 + 0.1 / 95)) < 0.01
    assert ((masked[picked] >= 5) | (masked[picked] == 4)).all()  # random ids never special
    assert torch.equal(masked[~picked], ids[~picked])
