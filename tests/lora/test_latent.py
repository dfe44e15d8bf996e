"""LoRA on multi-head latent attention (`zoo.blocks.mla`): the ``qkv`` target reaches its q and kv
projections, and a trained adapter on ``kv_b_proj`` keeps cached decoding equal to a full forward (the
absorbed decode path folds only a plain linear, so an adapted one runs through the plain path)."""

from __future__ import annotations

import torch
from lora.lora_support import tiny

import zoo


def test_qkv_reaches_every_latent_projection() -> None:
    model = zoo.lora.apply(tiny("deepseek-tiny"), r=2, targets=["qkv", "out"])
    names = {name.split("self_attn.")[1] for name in zoo.lora.adapter_modules(model) if "layers.0." in name}
    assert names == {"q_a_proj", "q_b_proj", "kv_a_proj", "kv_b_proj", "out_proj"}


def test_an_adapted_latent_model_decodes_as_its_full_forward() -> None:
    torch.manual_seed(0)
    model = zoo.lora.apply(tiny("deepseek-tiny"), r=2, targets=["qkv"])
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, 0.5)  # a trained adapter: its update shows in the logits
    ids = torch.randint(3, 500, (2, 9))
    mask = torch.ones_like(ids)
    mask[1, :4] = 0
    with torch.no_grad():
        out = model.generate(ids, attention_mask=mask, max_new_tokens=5, eos_token_id=[])
        full_mask = torch.cat([mask, torch.ones(2, 5, dtype=mask.dtype)], dim=1)
        greedy = model(out, attention_mask=full_mask).logits[:, 8:-1].argmax(-1)
    assert torch.equal(out[:, 9:], greedy)
