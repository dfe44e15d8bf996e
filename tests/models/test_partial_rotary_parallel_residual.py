"""Partial rotary (``position.fraction``), the parallel residual (``norm.residual: parallel``) and LongRoPE
(``position.scaling.type: longrope``) are spec options of any stack: encoders, decoders and both stacks of
an encoder-decoder build and run with them, and generation (cache, beams), LoRA and torch.export work.

Parity with transformers (GPT-NeoX, Phi-3) is `tests/io/test_hf_neox_phi3.py`; compile is
`tests/generation/test_compile_rotary_options.py`.
"""

from __future__ import annotations

import math

import pytest
import torch

import zoo
from zoo.blocks.position import RotaryPositions, apply_rotary
from zoo.export import compare_program, example_inputs, export_program
from zoo.spec import LongRopeScaling

PARTIAL = {"kind": "rotary", "theta": 500.0, "fraction": 0.5}
PARALLEL = {"placement": "pre", "residual": "parallel"}
LONGROPE = {
    "kind": "rotary", "fraction": 0.75,
    "scaling": {"type": "longrope", "short_factor": [1.0, 1.2, 1.5, 2.0, 2.5, 3.0],
                "long_factor": [1.0, 2.0, 4.0, 6.0, 8.0, 12.0], "original_max_positions": 12},
}  # fmt: skip


def with_options(name: str, position: dict | None = PARTIAL, **changes: object) -> zoo.ModelSpec:
    """A tiny preset with its position scheme replaced whole and the parallel residual (norm kept)."""
    data = zoo.preset(name).model_dump()
    if position is not None:
        data["position"] = position
    data["norm"] = {**data["norm"], **PARALLEL, "final": True}
    data |= changes
    return zoo.parse_spec(data)


def lively(spec: zoo.ModelSpec) -> zoo.ZooModel:
    torch.manual_seed(0)
    model = zoo.build(spec).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() >= 2:
                param.normal_(0.0, 0.3 if "embed" in name else 2.0 / math.sqrt(param.shape[-1]))
    return model


def left_padded(vocab: int, lengths: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    T = max(lengths)
    mask = torch.tensor([[0] * (T - n) + [1] * n for n in lengths])
    return torch.randint(3, vocab, (len(lengths), T), generator=g).masked_fill(mask == 0, 0), mask


STACKS = {  # every stack kind, with both options in every stack it has
    "encoder": lambda: with_options("bert-tiny"),
    "decoder": lambda: with_options("llama-tiny"),
    "decoder-longrope": lambda: with_options("llama-tiny", LONGROPE),
    "decoder-longrope-window": lambda: with_options(  # a rolling KV cache of 5 slots
        "llama-tiny", LONGROPE, decoder={"pattern": {"kind": "sliding_window", "window": 5}}
    ),
    "encoder-decoder": lambda: with_options("bart-tiny"),
    "encoder-decoder-t5": lambda: with_options("t5-tiny"),
}


@pytest.mark.parametrize("name", list(STACKS))
def test_every_stack_builds_and_runs_with_partial_rotary_and_the_parallel_residual(name) -> None:
    spec = STACKS[name]()
    for stack in spec.stacks().values():
        assert stack.norm.residual == "parallel" and stack.position.kind == "rotary"
    model = lively(spec)
    ids, mask = left_padded(spec.vocab_size, [14, 9])
    kwargs = {"decoder_input_ids": ids[:, :5]} if spec.family == "encoder-decoder" else {}
    out = model(ids, attention_mask=mask, **kwargs)
    hidden = out.logits if out.logits is not None else out.last_hidden_state
    assert hidden.shape[:2] == (2, ids.shape[1] if not kwargs else 5) and torch.isfinite(hidden).all()
    sequential = zoo.build(spec.override(norm={"residual": "sequential"})).eval()
    sequential.load_state_dict(model.state_dict())
    again = sequential(ids, attention_mask=mask, **kwargs)
    other = again.logits if again.logits is not None else again.last_hidden_state
    assert (other - hidden).abs().max() > 1e-3  # the option changes what is computed


def test_the_parallel_residual_adds_both_branches_to_the_layer_input() -> None:
    model = lively(with_options("llama-tiny"))
    layer, x = model.decoder.layers[0], torch.randn(2, 5, 64)
    with torch.no_grad():
        rotary = model.decoder.positions(torch.arange(5)[None])
        attention, _ = layer.self_attn(layer.self_attn_norm(x), is_causal=True, rotary=rotary)
        expected = x + attention + layer.ffn(layer.ffn_norm(x))
        got = layer(x, is_causal=True, rotary=rotary).hidden
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_partial_rotary_turns_the_first_dims_and_passes_the_rest() -> None:
    positions = RotaryPositions(theta=100.0, max_positions=16, head_dim=4)  # R = 4 of D = 10
    cos, sin = positions(torch.arange(16)[None])
    x = torch.randn(1, 2, 16, 10)
    out = apply_rotary(x, cos, sin)
    assert torch.equal(out[..., 4:], x[..., 4:])
    torch.testing.assert_close(out[..., :4], apply_rotary(x[..., :4], cos, sin))
    assert not torch.allclose(out[..., :4], x[..., :4])


def test_longrope_reads_the_long_tables_once_a_position_passes_the_original_context() -> None:
    scaling = LongRopeScaling(short_factor=[1.0, 2.0], long_factor=[3.0, 5.0], original_max_positions=8)
    positions = RotaryPositions(theta=10.0, max_positions=32, head_dim=4, scaling=scaling)
    scale = math.sqrt(1 + math.log(32 / 8) / math.log(8))  # transformers' default attention factor
    short, _ = positions(torch.arange(8)[None])  # positions 0..7: within the 8 original positions
    long, _ = positions(torch.arange(9)[None])  # position 8 passes it: the long factors, for every position
    rates = torch.tensor([1.0, 10.0**-0.5])
    torch.testing.assert_close(short[0, 0, 3, :2], torch.cos(3 * rates / torch.tensor([1.0, 2.0])) * scale)
    torch.testing.assert_close(long[0, 0, 3, :2], torch.cos(3 * rates / torch.tensor([3.0, 5.0])) * scale)
    assert positions.switch_length == 9


@pytest.mark.parametrize(
    "name", ["decoder", "decoder-longrope", "decoder-longrope-window", "encoder-decoder"]
)
def test_cached_greedy_and_beams_equal_full_recomputation(name) -> None:
    """The longrope cases cross their original context (12) while decoding: the step that does recomputes
    the cache with the long factors (`Session.refill_column`; without it the tokens differ), so cached
    equals uncached, with a full or a rolling cache."""
    model = lively(STACKS[name]())
    ids, mask = left_padded(model.spec.vocab_size, [9, 4, 7])
    for beams in (1, 3):
        settings = dict(attention_mask=mask, max_new_tokens=8, eos_token_id=[], num_beams=beams)
        cached = model.generate(ids, **settings)
        assert torch.equal(cached, model.generate(ids, use_cache=False, **settings))


@pytest.mark.parametrize("preset", ["pythia-tiny", "phi3-tiny"])
def test_lora_adapters_merge_into_the_weights_they_adapt(preset) -> None:
    model = lively(zoo.preset(preset))
    zoo.lora.apply(model, r=4, alpha=8, targets=["qkv", "out", "ffn_in", "ffn_out"])
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("lora_B"):
                param.normal_(0.0, 0.2)
    ids, mask = left_padded(model.spec.vocab_size, [40, 14])  # phi3-tiny: past its original 32, long factors
    with torch.no_grad():
        adapted = model(ids, attention_mask=mask).logits
        merged = zoo.lora.merge_and_unload(model)(ids, attention_mask=mask).logits
    torch.testing.assert_close(merged, adapted, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(
    "spec",
    [
        lambda: with_options("llama-tiny", LONGROPE, num_layers=1),
        pytest.param(lambda: with_options("bart-tiny", num_layers=1), marks=pytest.mark.slow),  # ~6 s
    ],
    ids=["decoder-longrope", "encoder-decoder"],
)
def test_exported_program_equals_eager_on_new_shapes(spec) -> None:
    torch.manual_seed(0)
    model = zoo.build(spec())
    program = export_program(model)
    for batch, length, target in [(3, 15, 5), (1, 1, 1), (2, 4, 9)]:  # past and within the original 12
        example = example_inputs(model, batch=batch, length=length, target_length=target, seed=batch)
        assert max(compare_program(model, program, example).values()) <= 1e-5, (batch, length)
