"""Helpers for the LoRA tests: tiny models, a padded batch for any family, adapters made nonzero."""

from __future__ import annotations

import torch
from support import padded_batch

import zoo


def tiny(name: str, **overrides: object) -> zoo.ZooModel:
    """A tiny preset, dropout off (so train and eval forwards agree), in eval mode."""
    return zoo.build(zoo.preset(name, dropout=0.0, **overrides)).eval()


def batch(model: zoo.ZooModel) -> dict[str, torch.Tensor]:
    """Right-padded inputs for ``model``'s family: (2, 7) ids + mask, (2, 6) decoder ids for seq2seq."""
    ids, mask = padded_batch(model.spec.vocab_size, [7, 4], low=5)
    inputs = {"input_ids": ids, "attention_mask": mask}
    if model.spec.family == "encoder-decoder":
        inputs["decoder_input_ids"] = torch.randint(5, model.spec.vocab_size, (2, 6))
    return inputs


def logits(model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    with torch.no_grad():
        return model(**inputs).logits


@torch.no_grad()
def liven(model: torch.nn.Module, *, seed: int = 1) -> None:
    """Random B (and magnitudes 0.5-1.5x their start) so the adapters change the outputs, as after training."""
    generator = torch.Generator().manual_seed(seed)
    for name, param in model.named_parameters():
        if name.endswith("lora_B"):
            param.copy_(torch.randn(param.shape, generator=generator) * 0.2)
        elif name.endswith("lora_magnitude"):
            param.mul_(torch.rand(param.shape, generator=generator) + 0.5)
