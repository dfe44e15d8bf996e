"""Precision: hidden rows stay finite in every dtype, additive masks stay finite under autocast, and fixed
position tables are float32 however a model is made (built in bfloat16, cast, or loaded)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from support import TINY_PRESETS

import zoo

# A batch with a left-padded row (its first decoder queries see no real key), a row of padding only (no
# real key at all) and a right-padded row.
MASK = torch.tensor([[0, 0, 1, 1, 1], [0, 0, 0, 0, 0], [1, 1, 1, 0, 0]])


def _alibi(num_heads: int = 4) -> zoo.ModelSpec:
    data = zoo.preset("gpt2-tiny").model_dump()
    data["position"] = {"kind": "alibi"}
    data["attention"]["num_heads"] = num_heads
    return zoo.parse_spec(data)


SPECS = {**{name: (lambda name=name: zoo.preset(name)) for name in TINY_PRESETS}, "alibi": _alibi}


def _forward(model: zoo.ZooModel, ids: torch.Tensor, **kwargs: object) -> torch.Tensor:
    extra = (
        {"decoder_input_ids": ids, "decoder_attention_mask": MASK}
        if model.spec.family == "encoder-decoder"
        else {}
    )
    out = model(ids, attention_mask=MASK, **extra, **kwargs)
    return out.logits if out.logits is not None else out.last_hidden_state


@pytest.mark.parametrize("output_attentions", [False, True], ids=["sdpa", "eager"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", list(SPECS))
def test_hidden_rows_give_finite_outputs_and_gradients(name, dtype, output_attentions):
    torch.manual_seed(0)
    model = zoo.build(SPECS[name](), dtype=dtype)
    ids = torch.randint(3, model.spec.vocab_size, MASK.shape) * MASK
    out = _forward(model, ids, output_attentions=output_attentions)
    out.float().square().mean().backward()  # every row, the garbage ones included, reaches the weights
    assert torch.isfinite(out).all()
    assert all(p.grad is None or torch.isfinite(p.grad).all() for p in model.parameters())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", ["t5-tiny", "alibi"])
def test_additive_masks_stay_finite_under_autocast(name, dtype, monkeypatch):
    """A float32 model under autocast runs attention in ``dtype``: its bias-carrying mask must not become
    -inf there. CPU's SDPA turns an all -inf row into zeros, so the outputs alone cannot show it (other
    kernels give NaN): the test reads the masks SDPA receives."""
    sdpa, masks = torch.nn.functional.scaled_dot_product_attention, []

    def spy(*args: object, attn_mask: torch.Tensor | None = None, **kwargs: object) -> torch.Tensor:
        masks.append(attn_mask)
        return sdpa(*args, attn_mask=attn_mask, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    torch.manual_seed(0)
    model = zoo.build(SPECS[name]())
    ids = torch.randint(3, model.spec.vocab_size, MASK.shape) * MASK
    with torch.autocast("cpu", dtype=dtype):
        out = _forward(model, ids)
    out.float().square().mean().backward()
    additive = [m for m in masks if m is not None and m.dtype != torch.bool]
    assert additive and all(m.dtype == dtype and torch.isfinite(m).all() for m in additive)
    assert torch.isfinite(out).all() and all(
        torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None
    )


# ALiBi with 16 heads has slopes 2^(-k/2), which bfloat16 rounds; rotary and sinusoid tables round at use.
@pytest.mark.parametrize("name", ["llama-tiny", "transformer-tiny", "alibi-16-heads"])
def test_a_bfloat16_model_computes_the_same_built_cast_or_loaded(name, tmp_path: Path):
    spec = _alibi(num_heads=16) if name == "alibi-16-heads" else zoo.preset(name)
    ids = torch.randint(3, spec.vocab_size, (2, 100))

    def logits(model: zoo.ZooModel) -> torch.Tensor:
        extra = {"decoder_input_ids": ids} if spec.family == "encoder-decoder" else {}
        with torch.no_grad():
            return model.eval()(ids, **extra).logits

    torch.manual_seed(0)
    built = zoo.build(spec, dtype=torch.bfloat16)
    zoo.save(built, tmp_path / "bf16")
    assert torch.equal(logits(built), logits(zoo.load(tmp_path / "bf16", dtype=torch.bfloat16)))
    torch.manual_seed(0)
    full = zoo.build(spec)
    zoo.save(full, tmp_path / "fp32")
    cast = full.to(torch.bfloat16)
    assert torch.equal(logits(cast), logits(zoo.load(tmp_path / "fp32", dtype=torch.bfloat16)))
    assert all(t.dtype == torch.float32 for t in [*built.buffers(), *cast.buffers()])
