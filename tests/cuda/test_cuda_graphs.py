"""On a CUDA GPU: ``generate(compile="cuda-graphs")`` captures one CUDA graph per run and replays it for every
token after the first, and gives eager greedy decoding's tokens on left-padded prompts, for a decoder and an
encoder-decoder. Without CUDA every test here is collected and skipped; nothing CUDA-only runs at import.

float32, so the graph's attention over all L cache slots under a mask (another SDPA kernel than eager's
over the keys so far) can only differ from eager in the last bits, far from a greedy tie on these weights.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

import zoo

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available())"),
]


def lively(name: str, **overrides: Any) -> zoo.ZooModel:
    """A seeded model on CUDA whose greedy path depends on the whole context (as `liven` in tests/generation)."""
    spec = zoo.preset(name).override(**overrides) if overrides else zoo.preset(name)
    torch.manual_seed(0)
    model = zoo.build(spec).eval()
    with torch.no_grad():
        for param_name, param in model.named_parameters():
            if param.dim() >= 2:
                lookup = "embed" in param_name or "positions" in param_name
                param.normal_(0.0, 0.3 if lookup else 2.0 / math.sqrt(param.shape[-1]))
    return model.to("cuda")


def left_padded(vocab_size: int, lengths: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    T = max(lengths)
    mask = torch.tensor([[0] * (T - n) + [1] * n for n in lengths])
    ids = torch.randint(3, vocab_size, (len(lengths), T), generator=g).masked_fill(mask == 0, 0)
    return ids.to("cuda"), mask.to("cuda")


@pytest.mark.parametrize(
    ("name", "overrides"),
    [
        ("gpt2-tiny", {}),
        ("llama-tiny", {}),  # rotary + GQA
        ("transformer-tiny", {"num_layers": 2}),  # encoder-decoder: cross-attention cached at the first step
        ("bart-tiny", {}),
    ],
)
def test_cuda_graph_decoding_gives_the_eager_greedy_tokens(
    name: str, overrides: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    model = lively(name, **overrides)
    ids, mask = left_padded(model.spec.vocab_size, [9, 5, 2, 7])
    new = 12
    kwargs: dict[str, Any] = dict(attention_mask=mask, max_new_tokens=new, eos_token_id=[])
    eager = model.generate(ids, **kwargs)
    replays: list[int] = []
    replay = torch.cuda.CUDAGraph.replay

    def counted(graph: torch.cuda.CUDAGraph) -> None:
        replays.append(1)
        replay(graph)

    monkeypatch.setattr(torch.cuda.CUDAGraph, "replay", counted)
    graphed = model.generate(ids, compile="cuda-graphs", **kwargs)
    assert torch.equal(graphed, eager)
    assert len(replays) == new - 1  # the first new token comes from the eager prefill
    one = {**kwargs, "attention_mask": None}  # a single unpadded row: positions (1, 1)
    assert torch.equal(model.generate(ids[:1], compile="cuda-graphs", **one), model.generate(ids[:1], **one))


def test_cuda_graph_decoding_in_bf16_stays_with_eager_bf16() -> None:
    """bf16 on a mid-size decoder: the graph and eager run different attention kernels (bf16 rounds their
    sums differently), so a near tie may flip a later token and the rows diverge from there; the first four
    new tokens of every row must agree."""
    model = lively("gpt2-tiny", d_model=256, num_layers=4, **{"attention.num_heads": 4}).to(torch.bfloat16)
    ids, mask = left_padded(model.spec.vocab_size, [16, 11, 16, 3])
    kwargs: dict[str, Any] = dict(attention_mask=mask, max_new_tokens=16, eos_token_id=[])
    eager = model.generate(ids, **kwargs)[:, 16:]
    graphed = model.generate(ids, compile="cuda-graphs", **kwargs)[:, 16:]
    assert torch.equal(graphed[:, :4], eager[:, :4])
