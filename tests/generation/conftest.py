"""Tiny models of every position scheme, for the generation tests."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch

import zoo


def _with_position(name: str, position: dict) -> zoo.ModelSpec:
    """A preset with its position scheme replaced (``override`` would deep-merge the old scheme's fields)."""
    data = zoo.preset(name).model_dump()
    data["position"] = position
    return zoo.parse_spec(data)


# Decoder-only shapes: learned, rotary + GQA, ALiBi, sinusoidal, ALBERT-style shared layers, Gemma's, experts,
# YaRN with no-rope layers.
DECODERS: dict[str, Callable[[], zoo.ModelSpec]] = {
    "gpt2-tiny": lambda: zoo.preset("gpt2-tiny"),
    "llama-tiny": lambda: zoo.preset("llama-tiny"),
    "alibi": lambda: _with_position("gpt2-tiny", {"kind": "alibi"}),
    "sinusoidal": lambda: _with_position("gpt2-tiny", {"kind": "sinusoidal"}),
    "shared-layers": lambda: zoo.preset("llama-tiny").override(num_layers=3, decoder={"share_layers": True}),
    # every Gemma block at once: sandwich (1 + w) norms, soft-capped attention (the math path) and logits,
    # (1 + w) q/k norms, local and global layers with their own rope bases (no one HF Gemma has all of them)
    "gemma-tiny": lambda: zoo.preset("gemma-tiny").override(
        **{"attention.qk_norm": True, "position.local_theta": 1000.0}
    ),
    # YaRN past an original context of 8 (with DeepSeek's attention factor) and a layer without rotary (NoPE)
    "yarn-nope": lambda: zoo.preset("llama-tiny").override(
        **{
            "position.scaling": {
                "type": "yarn",
                "factor": 4.0,
                "original_max_positions": 8,
                "mscale": 0.8,
                "mscale_all_dim": 1.0,
            },
            "position.nope_layers": [1],
        }
    ),
    # Mixture-of-Experts: a dense layer, then a sparse one with a gated shared expert
    "moe-tiny": lambda: zoo.preset("moe-tiny").override(
        **{"ffn.shared_d_ff": 32, "ffn.sparse_step": 2, "ffn.dense_d_ff": 96}
    ),
    # DeepSeek-V3: latent attention (the cache holds latents; absorbed decode steps) with a sliding first
    # layer (a rolling latent cache), sigmoid group-limited routing with a routing bias, a dense first layer
    "deepseek-tiny": lambda: zoo.preset("deepseek-tiny").override(
        decoder={
            "layer_patterns": [
                {"kind": "sliding_window", "window": 8},
                {"kind": "causal"},
                {"kind": "causal"},
            ]
        }
    ),
    # OLMo 2: norms on each sub-layer's output only, q/k norms over all heads
    "olmo2-tiny": lambda: zoo.preset("olmo2-tiny"),
    # Cohere 2: one norm feeding parallel branches, scaled logits, a local layer of 4 (rolling) and a global one
    "cohere2-tiny": lambda: zoo.preset("cohere2-tiny").override(
        decoder={
            "pattern": None,
            "layer_patterns": [{"kind": "sliding_window", "window": 4}, {"kind": "causal"}],
        }
    ),
    # gpt-oss: attention sinks, sliding and full layers alternating, biased router and experts, clamped SwiGLU
    "gpt-oss-tiny": lambda: zoo.preset("gpt-oss-tiny"),
    # Llama 4: chunks of 8 on the rotary layers (the full cache), a no-rope layer with temperature tuning,
    # weightless q/k norms on the rotary layers, sparse layers (input-weighted top-1, shared expert) and dense;
    # tuning by position (transformers' count by slot makes a left-padded row differ from the row alone)
    "llama4-tiny": lambda: zoo.preset("llama4-tiny").override(
        **{"attention.temperature_tuning.count": "position"}
    ),
}
# Encoder-decoder shapes: T5 relative bias, BART learned + offset, the 2017 Transformer's sinusoids.
ENCODER_DECODERS: dict[str, Callable[[], zoo.ModelSpec]] = {
    "t5-tiny": lambda: zoo.preset("t5-tiny"),
    "bart-tiny": lambda: zoo.preset("bart-tiny"),
    "transformer-tiny": lambda: zoo.preset("transformer-tiny").override(num_layers=2, vocab_size=600),
}
ALL_MODELS = {**DECODERS, **ENCODER_DECODERS}


def liven(model: zoo.ZooModel) -> zoo.ZooModel:
    """Re-draw a model's matrices large enough that its greedy path depends on the whole context.

    At the presets' small init a tied model mostly echoes its last token, so a broken position or cache
    would go unnoticed; matrices with std 2/sqrt(fan_in) and embeddings with std 0.3 avoid that.
    """
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() >= 2:
                lookup = "embed" in name or "positions" in name
                param.normal_(0.0, 0.3 if lookup else 2.0 / math.sqrt(param.shape[-1]))
    return model


def build_tiny(name: str, **overrides: object) -> zoo.ZooModel:
    """A seeded tiny model of `ALL_MODELS` in eval mode, with lively random weights (`liven`)."""
    spec = ALL_MODELS[name]()
    if overrides:
        spec = spec.override(**overrides)
    torch.manual_seed(0)
    return liven(zoo.build(spec).eval())


@pytest.fixture
def tiny() -> Callable[..., zoo.ZooModel]:
    """``tiny(name, **overrides)``: a seeded tiny model of one of `ALL_MODELS`."""
    return build_tiny


@pytest.fixture
def lively() -> Callable[[zoo.ZooModel], zoo.ZooModel]:
    """`liven`, for tests that build their own models."""
    return liven


@pytest.fixture(params=list(DECODERS))
def decoder(request: pytest.FixtureRequest) -> zoo.ZooModel:
    return build_tiny(request.param)


@pytest.fixture(params=list(ENCODER_DECODERS))
def encoder_decoder(request: pytest.FixtureRequest) -> zoo.ZooModel:
    return build_tiny(request.param)


@pytest.fixture(params=list(ALL_MODELS))
def any_model(request: pytest.FixtureRequest) -> zoo.ZooModel:
    return build_tiny(request.param)


def left_padded(
    vocab_size: int, lengths: list[int], *, pad: int = 0, seed: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded (B, max(lengths)) prompt ids (``pad`` where masked) and the 1/0 mask."""
    g = torch.Generator().manual_seed(seed)
    T = max(lengths)
    mask = torch.tensor([[0] * (T - n) + [1] * n for n in lengths])
    ids = torch.randint(3, vocab_size, (len(lengths), T), generator=g).masked_fill(mask == 0, pad)
    return ids, mask


@pytest.fixture
def prompts() -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """``prompts(vocab_size, lengths)``: left-padded ids and mask (decoder prompts or encoder sources)."""
    return left_padded
