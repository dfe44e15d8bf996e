"""Build a preset and a custom spec file, run a padded batch through each, print what came out."""

from __future__ import annotations

from pathlib import Path

import torch

import zoo

here = Path(__file__).parent
for source in ("transformer-tiny", here / "my_stack.yaml", here / "gpt_small.json"):
    model = zoo.build(source).eval()
    spec = model.spec
    ids = torch.randint(3, spec.vocab_size, (2, 6))
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])
    extra = {"decoder_input_ids": ids[:, :4]} if spec.family == "encoder-decoder" else {}
    out = model(ids, attention_mask=mask, **extra)
    print(f"{source}: {spec.family}, {model.num_parameters():,} parameters, logits {tuple(out.logits.shape)}")
