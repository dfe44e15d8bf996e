"""Log-likelihoods of continuations: one forward pass scores a batch of requests.

A request is a row of input ids and a continuation: the row's last ``len(continuation)`` positions predict
the continuation's tokens (position t predicts token t + 1). Several requests may share a row (the choices
of a multiple-choice question whose answers are one token each): the row runs once.

    rows     (U, T)  right-padded; the pads come after each row's tokens, where causal attention never
                     lets a real position see them, so no attention mask is needed (as lm-eval's `hf` model)
    scored   (U, T)  True at the positions some request reads: the LM head runs there alone
                     (``logits_mask``), so the logits are (N, V) with N = the positions scored, not (U, T, V)
    result   per request: the sum of the continuation's log-probabilities, and whether every continuation
             token is the argmax (lm-eval's ``is_greedy``)

Everything after building the rows is tensor work on the model's device; the only host read is the answer.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from zoo.models.base import ZooModel


def right_padded(rows: Sequence[Sequence[int]], *, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of ids -> (R, T) ids padded on the right with ``pad_id``, and (R,) lengths."""
    lengths = torch.tensor([len(row) for row in rows], dtype=torch.long)  # (R,)
    width = int(lengths.max())
    real = torch.arange(width) < lengths.unsqueeze(1)  # (R, T) True = a token, on the left
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    ids[real] = torch.tensor(list(chain.from_iterable(rows)), dtype=torch.long)  # row-major, as `real`
    return ids, lengths


@torch.inference_mode()
def score(
    model: ZooModel,
    rows: Sequence[Sequence[int]],
    requests: Sequence[tuple[int, Sequence[int]]],
    *,
    pad_id: int = 0,
) -> tuple[list[float], list[bool]]:
    """Score ``requests`` = [(row index, continuation ids), ...] against ``rows`` in one forward pass.

    Returns each request's summed log-probability (float32 log-softmax) and whether it is greedy.
    Every continuation must be non-empty and no longer than its row.
    """
    ids, lengths = right_padded(rows, pad_id=pad_id)  # (U, T), (U,)
    U, T = ids.shape
    owner = torch.tensor([row for row, _ in requests], dtype=torch.long)  # (I,)
    count = torch.tensor([len(cont) for _, cont in requests], dtype=torch.long)  # (I,)
    # Each row is scored at its last `need` positions: the longest continuation read from it.
    need = torch.zeros(U, dtype=torch.long).scatter_reduce_(0, owner, count, reduce="amax")  # (U,)
    positions = torch.arange(T).unsqueeze(0)  # (1, T)
    scored = (positions < lengths.unsqueeze(1)) & (positions >= (lengths - need).unsqueeze(1))  # (U, T)

    # The scored positions come back row by row: row u's `need[u]` of them start at offsets[u].
    offsets = torch.cumsum(need, 0) - need  # (U,)
    first = offsets[owner] + need[owner] - count  # (I,) a request reads its row's last `count` positions
    item = torch.repeat_interleave(torch.arange(len(requests)), count)  # (M,) the request of each token
    start_of_item = torch.cumsum(count, 0) - count  # (I,)
    at = first[item] + torch.arange(int(count.sum())) - start_of_item[item]  # (M,) into the scored rows
    targets = torch.tensor(list(chain.from_iterable(cont for _, cont in requests)), dtype=torch.long)  # (M,)

    device = next(model.parameters()).device
    net: Any = model
    logits = net(ids.to(device), logits_mask=scored).logits  # (N, V)
    logprobs = torch.log_softmax(logits.float(), dim=-1)  # (N, V)
    at, targets, item = at.to(device), targets.to(device), item.to(device)
    token_logprobs = logprobs[at, targets]  # (M,)
    missed = (logprobs.argmax(dim=-1)[at] != targets).float()  # (M,) 1 where greedy decoding differs
    totals = torch.zeros(len(requests), device=device).index_add_(0, item, token_logprobs)  # (I,)
    misses = torch.zeros(len(requests), device=device).index_add_(0, item, missed)  # (I,)
    answer = torch.stack([totals, misses]).cpu()  # one host read for the batch
    return answer[0].tolist(), (answer[1] == 0).tolist()
