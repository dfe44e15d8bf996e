"""Shared by the decoder families' parity tests (tests/io/test_hf_{llama_family,gemma,neox_phi3,moe}.py):
livened transformers models, left-padded batches with the position ids transformers' generate passes, the
logits comparison at real positions, and reloading an export with nothing missing."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

import zoo

LENGTHS = [40, 34, 12]  # left-padded: the longest rows pass position 32 and a window of 8


@torch.no_grad()
def liven(model: torch.nn.Module) -> torch.nn.Module:
    """Weights large enough that greedy decoding (and routing) depend on the context; every vector perturbed."""
    torch.manual_seed(0)
    for name, param in model.named_parameters():
        if param.dim() >= 2:
            param.normal_(0.0, 0.3 if "embed" in name else 2.0 / math.sqrt(model.config.hidden_size))
        else:
            param.add_(torch.randn_like(param) * 0.1)
    return model.eval()


def left_padded(lengths: list[int], vocab: int = 128) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ids, mask, the position ids transformers' generate passes: cumsum - 1, padding at 1)."""
    g = torch.Generator().manual_seed(3)
    T = max(lengths)
    mask = torch.tensor([[0] * (T - n) + [1] * n for n in lengths])
    ids = torch.randint(3, vocab, (len(lengths), T), generator=g).masked_fill(mask == 0, 0)
    positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)
    return ids, mask, positions


@torch.no_grad()
def assert_logits_match(
    model: zoo.ZooModel,
    hf: torch.nn.Module,
    lengths: list[int] = LENGTHS,
    *,
    signal: float = 1e-1,
    **hf_kwargs: Any,
) -> tuple[Any, Any]:
    """zoo's and transformers' logits equal to 1e-4 at the real positions of a left-padded batch, transformers'
    at least ``signal`` somewhere (a real signal); returns both outputs for further checks."""
    ids, mask, positions = left_padded(lengths)
    ours = model(ids, attention_mask=mask)
    theirs = hf(input_ids=ids, attention_mask=mask, position_ids=positions, **hf_kwargs)
    real = mask.bool()
    assert theirs.logits[real].abs().max() > signal
    torch.testing.assert_close(ours.logits[real], theirs.logits[real], atol=1e-4, rtol=1e-4)
    return ours, theirs


def reload_hf(path: Path) -> torch.nn.Module:
    import transformers

    model, info = transformers.AutoModelForCausalLM.from_pretrained(path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    return model.eval()
