"""Test helpers: the tiny presets and small padded batches. Import as ``from support import ...``."""

from __future__ import annotations

import torch

TINY_PRESETS = ["bert-tiny", "gpt2-tiny", "llama-tiny", "t5-tiny", "bart-tiny", "transformer-tiny"]
TINY_PRESETS += ["pythia-tiny", "phi3-tiny"]  # partial rotary, the parallel residual, LongRoPE


def padded_batch(vocab_size: int, lengths: list[int], *, low: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded (B, max(lengths)) ids (pad id 0 where masked) and the matching 1/0 mask."""
    T = max(lengths)
    mask = torch.tensor([[1] * n + [0] * (T - n) for n in lengths])
    ids = torch.randint(low, vocab_size, (len(lengths), T)) * mask
    return ids, mask
