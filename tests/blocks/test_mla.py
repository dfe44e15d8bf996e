"""Multi-head latent attention (`zoo.blocks.mla`) and DeepSeek-V3's routing (`zoo.blocks.moe`): the cache holds
the latent and the rope key only, cached decoding equals the full forward (full and rolling caches), the
absorbed path equals the plain one, and the routing picks, weighs and balances as the technical report says."""

from __future__ import annotations

import pytest
import torch

import zoo
from zoo.blocks import LatentAttention
from zoo.blocks.moe import MoEFeedForward
from zoo.generation.cache import KVCache
from zoo.spec import AttentionSpec, MoESpec


def _latent_model(**overrides: object) -> zoo.ZooModel:
    torch.manual_seed(0)
    model = zoo.build(zoo.preset("deepseek-tiny").override(**overrides)).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() >= 2:
                param.normal_(0.0, 0.3 if "embed" in name else 2.0 / param.shape[-1] ** 0.5)
    return model


def test_the_cache_holds_the_latent_and_rope_key_not_keys_and_values() -> None:
    model = _latent_model()
    cache = KVCache.for_stack(model.decoder, batch_size=2, max_length=10)
    # (N, 2, B, 1, L, (R + P) / 2): [latent 24 | rope key 8] per token and layer, split in two halves
    assert tuple(cache.buffer.shape) == (3, 2, 2, 1, 10, 16)
    per_token = cache.buffer[:, :, 0, :, 0].numel()
    assert per_token == 3 * (24 + 8)  # against 3 * 2 * 4 * (16 + 8) for the same heads' keys and values


@pytest.mark.parametrize("rolling", [False, True])
def test_cached_decoding_equals_the_full_forward(rolling: bool) -> None:
    patterns = [{"kind": "sliding_window", "window": 5}] + [{"kind": "causal"}] * 2 if rolling else None
    model = _latent_model(**({"decoder": {"layer_patterns": patterns}} if rolling else {}))
    ids = torch.randint(3, 500, (2, 9))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    with torch.no_grad():
        out = model.generate(ids, attention_mask=mask, max_new_tokens=8, eos_token_id=[])
        full = model(out, attention_mask=torch.cat([mask, torch.ones(2, 8, dtype=mask.dtype)], 1)).logits
    assert torch.equal(out[:, 9:], full[:, 8:-1].argmax(-1))


def test_the_absorbed_path_equals_the_plain_path_step_by_step() -> None:
    spec = AttentionSpec(num_heads=4, head_dim=12, bias=True, latent={"kv_lora_rank": 20, "rope_head_dim": 6})
    torch.manual_seed(1)
    block = LatentAttention(spec, d_model=32).eval()
    x = torch.randn(2, 7, 32)
    angles = torch.arange(7.0)[None, None, :, None] * torch.tensor([1.0, 0.1, 0.01]).repeat(2)  # (1, 1, T, P)
    rotary = (angles.cos(), angles.sin())
    mask = torch.ones(2, 1, 7, 7, dtype=torch.bool).tril()
    with torch.no_grad():
        plain, _ = block(x, mask=mask, rotary=rotary)
        block.absorb = "always"
        absorbed, _ = block(x, mask=mask, rotary=rotary)
    torch.testing.assert_close(absorbed, plain, atol=1e-5, rtol=1e-5)
    assert plain.abs().max() > 0.1


def test_latent_attention_refuses_kv_groups_qk_norm_and_cross_attention() -> None:
    latent = {"kv_lora_rank": 16, "rope_head_dim": 4}
    with pytest.raises(ValueError, match=r"num_kv_heads \(2\) must be unset or num_heads \(4\) with latent"):
        AttentionSpec(num_heads=4, num_kv_heads=2, latent=latent)
    with pytest.raises(ValueError, match="qk_norm cannot go with latent"):
        AttentionSpec(qk_norm=True, latent=latent)
    with pytest.raises(ValueError, match=r"rope_head_dim \(5\) must be even"):
        zoo.preset("deepseek-tiny").override(**{"attention.latent.rope_head_dim": 5})
    with pytest.raises(ValueError, match="latent attention takes rotary positions"):
        zoo.preset("deepseek-tiny").override(position={"kind": "learned"})


# -- DeepSeek-V3 routing -----------------------------------------------------------------------------------


def _router(**spec: object) -> MoEFeedForward:
    torch.manual_seed(2)
    defaults = dict(num_experts=8, top_k=2, d_ff=8, scoring="sigmoid", score_bias=True)
    block = MoEFeedForward(MoESpec(**{**defaults, **spec}), d_model=16)
    with torch.no_grad():
        block.router.weight.normal_()
    return block


def test_group_limited_routing_picks_only_from_the_best_groups() -> None:
    block = _router(num_groups=4, top_groups=2, top_k=3)
    x = torch.randn(64, 16)
    with torch.no_grad():
        _, _, experts = block.route(x)
        scores = torch.sigmoid(block.router(x))  # (N, 8), groups of 2
    group_scores = scores.view(64, 4, 2).sum(-1)  # the two best of a group of two: both
    best = group_scores.topk(2, dim=-1).indices  # (N, 2)
    assert all(set((experts[n] // 2).tolist()) <= set(best[n].tolist()) for n in range(64))


def test_group_score_max_ranks_a_group_by_its_best_softmax_score() -> None:
    """DeepSeek-V2's group_limited_greedy: softmax scores, a group's score its best expert's."""
    block = _router(num_experts=12, num_groups=4, top_groups=2, top_k=3, scoring="softmax", score_bias=False,
                    group_score="max", normalize_top_k=False)  # fmt: skip
    x = torch.randn(64, 16)
    with torch.no_grad():
        _, weights, experts = block.route(x)
        scores = torch.softmax(block.router(x), dim=-1)  # (N, 12), groups of 3
    best = scores.view(64, 4, 3).amax(-1).topk(2, dim=-1).indices  # (N, 2)
    assert all(set((experts[n] // 3).tolist()) <= set(best[n].tolist()) for n in range(64))
    summed = scores.view(64, 4, 3).topk(2, dim=-1).values.sum(-1).topk(2, dim=-1).indices
    differ = [set(best[n].tolist()) != set(summed[n].tolist()) for n in range(64)]
    assert any(differ)  # the two rules choose other groups here
    kept = scores.view(64, 4, 3).scatter(1, best.unsqueeze(-1).expand(-1, -1, 3), 2.0).view(64, 12) == 2.0
    expected = scores.masked_fill(~kept, 0.0).topk(3, dim=-1)
    torch.testing.assert_close(weights.sort(-1).values, expected.values.sort(-1).values)  # not renormalised


def test_the_score_bias_chooses_experts_but_never_weighs_them() -> None:
    block = _router(normalize_top_k=False, routed_scale=2.5)
    x = torch.randn(32, 16)
    with torch.no_grad():
        block.score_bias.copy_(torch.tensor([10.0, 10.0, 0, 0, 0, 0, 0, 0]))  # experts 0 and 1 always chosen
        _, weights, experts = block.route(x)
        scores = torch.sigmoid(block.router(x))
    assert torch.equal(experts.sort(-1).values, torch.tensor([[0, 1]]).expand(32, 2))
    torch.testing.assert_close(weights, 2.5 * scores.gather(1, experts))  # unbiased sigmoid scores, scaled


def test_the_bias_update_moves_toward_balance_in_training_only() -> None:
    block = _router(bias_update_rate=0.01)
    x = torch.randn(1, 256, 16)
    block.eval()
    block(x)
    assert torch.equal(block.score_bias, torch.zeros(8))  # inference leaves it alone
    block.train()
    with torch.no_grad():
        _, _, experts = block.route(x[0])
    load = torch.bincount(experts.reshape(-1), minlength=8).float()
    block(x)
    expected = 0.01 * torch.sign(load.mean() - load)  # under-loaded experts up, over-loaded down
    assert torch.equal(block.score_bias, expected) and expected.abs().sum() > 0


def test_routing_options_are_checked() -> None:
    with pytest.raises(ValueError, match=r"num_experts \(8\) must be divisible by num_groups \(3\)"):
        MoESpec(num_experts=8, num_groups=3)
    with pytest.raises(
        ValueError, match=r"top_k \(5\) is more than the experts of top_groups \(1\) groups hold"
    ):
        MoESpec(num_experts=8, top_k=5, num_groups=2, top_groups=1)
    with pytest.raises(ValueError, match=r"bias_update_rate \(0.1\) needs score_bias: true"):
        MoESpec(bias_update_rate=0.1)
    with pytest.raises(ValueError, match=r"num_groups \(4\) leaves one expert a group"):
        MoESpec(num_experts=4, num_groups=4, top_groups=2)
    MoESpec(num_experts=4, num_groups=4, top_groups=2, group_score="max")  # a group of one has a best


def test_the_flex_kernel_gives_the_sdpa_logits() -> None:
    """A flex_attention BlockMask (a pattern's fused kernel) through latent attention, whose values are
    narrower than its queries and keys."""
    from zoo.blocks.flex import attention_kernel

    model = _latent_model(decoder={"pattern": {"kind": "sliding_window", "window": 4}})
    ids = torch.randint(3, 500, (2, 12))
    with torch.no_grad():
        with attention_kernel("sdpa"):
            dense = model(ids).logits
        with attention_kernel("flex"):
            flex = model(ids).logits
    torch.testing.assert_close(flex, dense, atol=1e-4, rtol=1e-4)
