"""The chunked loss through the LM head equals the plain one over the whole logits -- the loss, each token's
loss and every gradient, within 1e-5 in float32 -- for every head option, label smoothing, ignored tokens
and chunk sizes that do not divide the tokens; and its forward keeps no logit for the backward."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.nn import functional as F

import zoo
from zoo.losses import IGNORE_INDEX, label_smoothed_cross_entropy, shift_labels_left
from zoo.losses.chunked import ChunkedLoss, auto_chunk_tokens, chunked_token_losses
from zoo.models.heads import LMHead

# Every option an LM head can have (zoo.spec.LMHeadSpec), alone or together.
HEADS: dict[str, dict[str, Any]] = {
    "tied": {},
    "untied": {"lm_head.tied": False},
    "bias and logits bias": {"lm_head.bias": True, "lm_head.logits_bias": True},
    "softcap": {"lm_head.softcap": 2.0},
    "rescaled tied": {"lm_head.rescale_tied": True},
    "untied, bias, softcap": {"lm_head.tied": False, "lm_head.bias": True, "lm_head.softcap": 5.0},
}


def tiny(options: dict[str, Any], dtype: torch.dtype = torch.float32) -> zoo.DecoderModel:
    """gpt2-tiny with ``options`` on its head, random biases (they start at zero), in eval mode (no
    dropout: two forwards must see the same function)."""
    torch.manual_seed(0)
    model = zoo.build(zoo.preset("gpt2-tiny").override(**options), dtype=dtype).eval()
    head = model.lm_head
    assert isinstance(head, LMHead)
    with torch.no_grad():
        if head.bias is not None:
            head.bias.normal_()
        if head.final_logits_bias is not None:
            head.final_logits_bias.normal_()
    assert isinstance(model, zoo.DecoderModel)
    return model


def grads(loss: torch.Tensor, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    return list(torch.autograd.grad(loss, tensors))


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal within 1e-5 (and a millionth of a large sum's size: float32 rounding)."""
    return a.shape == b.shape and bool(torch.allclose(a, b, atol=1e-5, rtol=1e-6))


@pytest.mark.parametrize("eps", [0.0, 0.1], ids=["plain", "smoothed"])
@pytest.mark.parametrize("chunk", [1, 5, 64], ids=["1", "5", "over-N"])
@pytest.mark.parametrize("options", HEADS.values(), ids=HEADS.keys())
def test_each_tokens_loss_and_every_gradient_equal_the_plain_loss(
    options: dict[str, Any], chunk: int, eps: float
) -> None:
    model = tiny(options)
    head = model.lm_head
    assert isinstance(head, LMHead)
    generator = torch.Generator().manual_seed(1)
    N, V = 23, model.spec.vocab_size
    hidden = torch.randn(N, model.spec.embedding_dim, generator=generator, requires_grad=True)
    targets = torch.randint(0, V, (N,), generator=generator)
    targets[[0, 7, 8, 22]] = IGNORE_INDEX
    weights = torch.rand(N, generator=generator)  # a gradient per token, as DPO's is
    params = [hidden, *(p for p in head.parameters()), *([head.output_weight] if head.weight is None else [])]

    logits = head(hidden)  # (N, V)
    plain = F.cross_entropy(logits, targets, ignore_index=IGNORE_INDEX, label_smoothing=eps, reduction="none")
    chunked = chunked_token_losses(
        head.logits, hidden, head.output_weight, head.bias, targets, label_smoothing=eps, chunk_tokens=chunk
    )
    assert chunked.dtype == torch.float32 and close(chunked, plain)
    sums = label_smoothed_cross_entropy(logits, targets, label_smoothing=eps)
    assert close(chunked.sum(), sums.loss)
    for a, b in zip(grads((plain * weights).sum(), params), grads((chunked * weights).sum(), params)):
        assert close(a, b)
    assert not chunked[targets == IGNORE_INDEX].any()


@pytest.mark.parametrize("eps", [0.0, 0.1], ids=["plain", "smoothed"])
@pytest.mark.parametrize("options", HEADS.values(), ids=HEADS.keys())
def test_a_decoder_given_chunked_loss_has_the_plain_loss_and_gradients(
    options: dict[str, Any], eps: float
) -> None:
    model = tiny(options)
    ids = torch.randint(0, model.spec.vocab_size, (3, 11), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0  # padding
    targets = shift_labels_left(ids.masked_fill(mask == 0, IGNORE_INDEX))  # (B, T)
    targets[2, :4] = IGNORE_INDEX  # a prompt, not scored (chat)
    scored = targets != IGNORE_INDEX
    params = [p for p in model.parameters() if p.requires_grad]

    out = model(ids, attention_mask=mask, logits_mask=scored)
    plain = label_smoothed_cross_entropy(out.logits, targets[scored], label_smoothing=eps).loss
    chunked_out = model(
        ids,
        attention_mask=mask,
        logits_mask=scored,
        chunked_loss=ChunkedLoss(targets[scored], chunk_tokens=4, label_smoothing=eps),  # 4 does not divide N
    )
    assert chunked_out.logits is None and chunked_out.token_losses is not None
    chunked = chunked_out.token_losses.sum()
    assert close(chunked, plain)
    for p, a, b in zip(params, grads(plain, params), grads(chunked, params)):
        assert close(a, b), p.shape


def test_without_logits_mask_every_position_is_a_token_and_ignored_ones_count_nothing() -> None:
    model = tiny({})
    ids = torch.randint(0, model.spec.vocab_size, (2, 9), generator=torch.Generator().manual_seed(3))
    targets = shift_labels_left(ids)  # (B, T): the last position -100
    out = model(ids, chunked_loss=ChunkedLoss(targets.reshape(-1), chunk_tokens=7))
    assert out.token_losses is not None and out.token_losses.shape == (18,)
    assert close(out.token_losses.sum() / 16, model(ids, labels=ids).loss)


def _saved_shapes(run: Any) -> list[tuple[int, ...]]:
    """The shapes of the tensors autograd saves for the backward while ``run()`` runs."""
    shapes: list[tuple[int, ...]] = []

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        shapes.append(tuple(tensor.shape))
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        run()
    return shapes


def test_the_forward_keeps_no_logit_for_the_backward() -> None:
    model = tiny({"lm_head.softcap": 2.0})
    ids = torch.randint(0, model.spec.vocab_size, (2, 40), generator=torch.Generator().manual_seed(4))
    targets = shift_labels_left(ids).reshape(-1)  # (N,)
    V = model.spec.vocab_size
    plain = _saved_shapes(lambda: model(ids).logits)
    chunked = _saved_shapes(lambda: model(ids, chunked_loss=ChunkedLoss(targets, chunk_tokens=8)))
    assert (2, 40, V) in plain  # the plain path keeps the logits (the test can fail)
    assert [shape for shape in chunked if shape[-1] == V] == []  # no logits, not even a chunk's


def test_bfloat16_weights_and_autocast_follow_the_plain_path() -> None:
    # Low precision is not exact; the chunked loss must round as the plain one does (a backward that
    # forgot autocast, or rounded the weight's gradient per chunk, would differ by more).
    for dtype, autocast in ((torch.bfloat16, False), (torch.float32, True)):
        model = tiny({"lm_head.tied": False}, dtype=dtype)
        ids = torch.randint(0, model.spec.vocab_size, (2, 16), generator=torch.Generator().manual_seed(5))
        targets = shift_labels_left(ids).reshape(-1)
        params = [p for p in model.parameters() if p.requires_grad]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            logits = model(ids).logits
            chunked = model(ids, chunked_loss=ChunkedLoss(targets, chunk_tokens=5)).token_losses
        assert chunked is not None
        plain = label_smoothed_cross_entropy(logits, targets).loss
        assert torch.allclose(chunked.sum(), plain, rtol=1e-3)
        for p, a, b in zip(params, grads(plain, params), grads(chunked.sum(), params)):
            assert a.dtype == b.dtype == p.dtype
            assert torch.allclose(a.float(), b.float(), atol=2e-2, rtol=2e-2), p.shape


def test_float64_stays_float64() -> None:
    model = tiny({}, dtype=torch.float64)
    ids = torch.randint(0, model.spec.vocab_size, (1, 8), generator=torch.Generator().manual_seed(6))
    targets = shift_labels_left(ids).reshape(-1)
    losses = model(ids, chunked_loss=ChunkedLoss(targets, chunk_tokens=3)).token_losses
    plain = F.cross_entropy(model(ids).logits[0], targets, ignore_index=IGNORE_INDEX, reduction="none")
    assert losses is not None and losses.dtype == torch.float64
    assert torch.allclose(losses, plain, atol=1e-12)


def test_frozen_head_gets_no_gradient_and_hidden_still_does() -> None:
    model = tiny({"lm_head.tied": False})
    head = model.lm_head
    assert isinstance(head, LMHead) and head.weight is not None
    head.weight.requires_grad_(False)  # LoRA's frozen base
    hidden = torch.randn(6, model.spec.embedding_dim, requires_grad=True)
    targets = torch.randint(0, model.spec.vocab_size, (6,))
    loss = head.token_losses(hidden, ChunkedLoss(targets, chunk_tokens=4)).sum()
    (grad,) = torch.autograd.grad(loss, [hidden])
    plain = label_smoothed_cross_entropy(head(hidden), targets).loss
    assert close(grad, torch.autograd.grad(plain, [hidden])[0])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"labels": True}, "pass labels .* or chunked_loss, not both"),
        ({"targets": 5}, r"chunked_loss.targets must have shape \(16,\)"),
        ({"dtype": torch.float32}, "chunked_loss.targets must hold integer class ids"),
        ({"loss": "not a ChunkedLoss"}, "chunked_loss must be a zoo.losses.chunked.ChunkedLoss"),
    ],
)
def test_a_wrong_chunked_loss_is_one_line_naming_it(kwargs: dict[str, Any], message: str) -> None:
    model = tiny({})
    ids = torch.randint(0, model.spec.vocab_size, (2, 8))
    targets = torch.zeros(kwargs.get("targets", 16), dtype=kwargs.get("dtype", torch.long))
    loss = kwargs.get("loss", ChunkedLoss(targets, chunk_tokens=4))
    labels = ids if kwargs.get("labels") else None
    with pytest.raises(ValueError, match=message):
        model(ids, labels=labels, chunked_loss=loss)


def test_auto_chunks_hold_a_fixed_number_of_logits() -> None:
    assert auto_chunk_tokens(128_256) == 523  # 64M logits: 256 MiB in float32
    assert auto_chunk_tokens(512) == 131_072
    assert auto_chunk_tokens(1 << 30) == 1
