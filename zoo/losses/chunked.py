"""Cross-entropy through the output head in chunks of tokens: the (N, V) logits never exist all at once.

Liger Kernel's fused linear cross-entropy and torchtune's chunked output loss: at 2,048 tokens and a 128k
vocabulary the float32 logits alone are 1 GiB, and the plain loss keeps several copies of them alive until
its backward (the logits, their log-softmax, its gradient). Here one `torch.autograd.Function` holds none:

    forward    per chunk of n tokens: logits (n, V) = head(hidden[chunk], weight, bias), float32; their
               log-sum-exp (n,) and each token's loss; the logits are dropped. Saved: hidden, weight, bias,
               targets and the log-sum-exps -- never a logit.
    backward   per chunk: the logits again, with a graph through the head; d loss / d logits formed in
               place from them and the saved log-sum-exps; pulled back through the head's graph to hidden,
               weight and bias (the weight's gradient summed over the chunks in float32).

``head`` is the output head's own function of (hidden, weight, bias), so every option it has (a scaled
input, a bias, a fixed logits bias, soft-capping) and the ambient autocast hold in both passes, and the
weight's gradient flows through normal autograd (into the embedding table when tied; DDP and FSDP see it
as any other). The price: the head's matmul runs once more than in the plain loss (four times, not three).

Each token's loss is the plain one, written through the log-sum-exp ``lse`` of its logits ``z``:

    nll_i  = lse_i - z_i[target_i]                 uniform_i = lse_i - mean_v z_i[v]
    loss_i = (1 - eps) nll_i + eps uniform_i       d loss_i / d z_i = softmax(z_i) - (1 - eps) onehot - eps / V

A token whose target is -100 has loss 0 and no gradient.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch

from zoo.losses import IGNORE_INDEX

# (n, E) hidden, (V, E) weight, (V,) bias or None -> (n, V) logits: an output head's function
HeadFunction = Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor]

# `auto` chunks: this many logits per chunk (256 MiB in float32), whatever the vocabulary. Smaller chunks
# hold less, but each adds a (V, E) weight gradient: 1,024 tokens through a 128,256 x 512 head, forward and
# backward, took 1.44x the plain loss's CPU time in chunks of 130 tokens (16M logits), 1.17x in 520.
CHUNK_LOGITS = 1 << 26


@dataclass(frozen=True)
class ChunkedLoss:
    """What a decoder's forward computes through its LM head instead of logits (``chunked_loss=``): each
    scored token's loss against ``targets``, `chunk_tokens` tokens at a time (`chunked_token_losses`)."""

    targets: torch.Tensor  # (N,) aligned with the logits the forward would return, -100 = not scored
    chunk_tokens: int  # tokens per chunk of logits
    label_smoothing: float = 0.0


def auto_chunk_tokens(vocab_size: int) -> int:
    """Tokens per chunk for a ``vocab_size``-wide head: `CHUNK_LOGITS` logits a chunk (523 at 128,256)."""
    return max(1, CHUNK_LOGITS // vocab_size)


def chunked_token_losses(
    head: HeadFunction,
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    *,
    label_smoothing: float = 0.0,
    chunk_tokens: int,
) -> torch.Tensor:
    """Each token's (label-smoothed) cross-entropy of ``head(hidden, weight, bias)`` against ``targets``,
    computed ``chunk_tokens`` tokens at a time: hidden (N, E), targets (N,), -100 = not scored -> (N,)
    float32 (float64 for a float64 head), 0 where not scored. Equal to `zoo.losses.label_smoothed_cross_entropy`'s per-token loss on the
    whole logits, and so are the gradients, without ever holding them."""
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be a positive number of tokens, got {chunk_tokens}")
    losses: torch.Tensor = _ChunkedCrossEntropy.apply(
        hidden, weight, bias, targets, head, float(label_smoothing), int(chunk_tokens)
    )
    return losses


class _ChunkedCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        targets: torch.Tensor,
        head: HeadFunction,
        label_smoothing: float,
        chunk_tokens: int,
    ) -> torch.Tensor:
        losses, lses = [], []
        for start in range(0, max(hidden.shape[0], 1), chunk_tokens):
            logits = _wide(head(hidden[start : start + chunk_tokens], weight, bias))  # (n, V)
            target = targets[start : start + chunk_tokens]  # (n,)
            lse = torch.logsumexp(logits, dim=-1)  # (n,)
            picked = logits.gather(1, target.clamp(min=0)[:, None]).squeeze(1)  # (n,) z[target]
            loss = lse - picked  # (n,) nll
            if label_smoothing > 0:
                uniform = lse - logits.mean(dim=-1)  # (n,) cross-entropy against uniform
                loss = (1.0 - label_smoothing) * loss + label_smoothing * uniform
            losses.append(torch.where(target != IGNORE_INDEX, loss, 0.0))
            lses.append(lse)
            del logits
        ctx.save_for_backward(hidden, weight, bias, targets, torch.cat(lses))
        ctx.head, ctx.label_smoothing, ctx.chunk_tokens = head, label_smoothing, chunk_tokens
        device = hidden.device.type  # the backward recomputes under the forward's autocast
        ctx.autocast = (
            (device, torch.get_autocast_dtype(device)) if torch.is_autocast_enabled(device) else None
        )
        return torch.cat(losses)

    @staticmethod
    def backward(ctx: Any, grad_losses: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        hidden, weight, bias, targets, lse = ctx.saved_tensors
        need_hidden, need_weight, need_bias = ctx.needs_input_grad[:3]
        eps, chunk = ctx.label_smoothing, ctx.chunk_tokens
        grad_hidden = torch.empty_like(hidden) if need_hidden else None  # (N, E)
        grad_weight = (
            torch.zeros(weight.shape, device=weight.device, dtype=torch.float32) if need_weight else None
        )
        grad_bias = torch.zeros(bias.shape, device=bias.device, dtype=torch.float32) if need_bias else None
        w = weight.detach().requires_grad_(need_weight)
        b = bias.detach().requires_grad_(need_bias) if bias is not None else None
        autocast = torch.autocast(ctx.autocast[0], ctx.autocast[1]) if ctx.autocast else nullcontext()
        N = hidden.shape[0]
        for start in range(0, N, chunk):
            stop = min(start + chunk, N)
            h = hidden[start:stop].detach().requires_grad_(need_hidden)  # (n, E)
            with torch.enable_grad(), autocast:
                logits = _wide(ctx.head(h, w, b))  # (n, V), with a graph back to h, w, b
            target = targets[start:stop]  # (n,)
            real = target != IGNORE_INDEX
            with torch.no_grad():  # d loss / d logits, in the logits' own memory
                coef = torch.where(real, grad_losses[start:stop].to(logits.dtype), 0.0)  # (n,)
                grad = logits.detach().sub_(lse[start:stop, None]).exp_().mul_(coef[:, None])  # p * g
                if eps > 0:
                    grad.sub_((coef * (eps / grad.shape[-1]))[:, None])
                grad.scatter_add_(1, target.clamp(min=0)[:, None], -(1.0 - eps) * coef[:, None])
            inputs = [
                t
                for t, need in ((h, need_hidden), (w, need_weight), (b, need_bias))
                if need and t is not None
            ]
            grads = list(torch.autograd.grad(logits, inputs, grad))
            del logits, grad
            if need_hidden:
                assert grad_hidden is not None
                grad_hidden[start:stop] = grads.pop(0)
            if need_weight:
                assert grad_weight is not None
                grad_weight += grads.pop(0)
            if need_bias:
                assert grad_bias is not None
                grad_bias += grads.pop(0)
        return (
            grad_hidden,
            grad_weight.to(weight.dtype) if grad_weight is not None else None,
            grad_bias.to(bias.dtype) if grad_bias is not None else None,
            None,
            None,
            None,
            None,
        )


def _wide(logits: torch.Tensor) -> torch.Tensor:
    """Logits in at least float32, for the range of exp and the log-sum-exp (float64 stays float64)."""
    return logits.to(torch.promote_types(logits.dtype, torch.float32))
