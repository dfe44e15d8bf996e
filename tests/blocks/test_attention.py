"""Attention: a worked example by hand, SDPA vs eager, weights on padding/future keys, GQA."""

from __future__ import annotations

import pytest
import torch

from zoo.blocks import Attention, masks
from zoo.spec import AttentionSpec

# A toy example: four keys, values, and queries that match one or two keys.
K = torch.tensor([[10.0, 0, 0], [0, 10, 0], [0, 0, 10], [0, 0, 10]])
V = torch.tensor([[1.0, 0], [10, 0], [100, 5], [1000, 6]])


def scaled_dot_product(q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The single-head case through zoo's eager path: identity projections, d_k = 3."""
    attention = Attention(AttentionSpec(num_heads=1, head_dim=3, bias=False), d_model=3)
    with torch.no_grad():
        attention.qkv_proj.weight.zero_()
    # Feed q, k, v straight into the eager kernel the module uses.
    out, weights = attention._eager(q[None, None], K[None, None], V[None, None], None, False)
    return out[0, 0], weights[0, 0]


@pytest.mark.parametrize(
    ("query", "expected_out", "expected_weights"),
    [
        ([[0.0, 10, 0]], [[10.0, 0]], [[0, 1, 0, 0]]),
        ([[0.0, 0, 10]], [[550.0, 5.5]], [[0, 0, 0.5, 0.5]]),
        (
            [[0.0, 0, 10], [0, 10, 0], [10, 10, 0]],
            [[550.0, 5.5], [10, 0], [5.5, 0]],
            [[0, 0, 0.5, 0.5], [0, 1, 0, 0], [0.5, 0.5, 0, 0]],
        ),
    ],
)
def test_hand_worked_attention_example(query, expected_out, expected_weights):
    out, weights = scaled_dot_product(torch.tensor(query))
    torch.testing.assert_close(out, torch.tensor(expected_out), atol=1e-3, rtol=0)
    torch.testing.assert_close(
        weights, torch.tensor(expected_weights, dtype=torch.float32), atol=1e-4, rtol=0
    )


def _self_attention(spec: AttentionSpec, d_model: int = 32) -> Attention:
    return Attention(spec, d_model=d_model).eval()


@pytest.mark.parametrize("spec", [AttentionSpec(num_heads=4), AttentionSpec(num_heads=4, num_kv_heads=2, bias=False),
                                  AttentionSpec(num_heads=4, num_kv_heads=1, scaled=False, qk_norm=True)])  # fmt: skip
@pytest.mark.parametrize("causal", [False, True])
def test_sdpa_and_eager_paths_agree(spec, causal):
    attention = _self_attention(spec)
    x = torch.randn(3, 6, 32)
    attention_mask = torch.tensor([[1] * 6, [1] * 4 + [0] * 2, [0] * 2 + [1] * 4])
    mask, is_causal = masks.self_attention_mask(attention_mask, q_len=6, k_len=6, causal=causal)
    fast, none = attention(x, mask=mask, is_causal=is_causal)
    eager, weights = attention(x, mask=mask, is_causal=is_causal, output_attentions=True)
    assert none is None and weights.shape == (3, 4, 6, 6)
    torch.testing.assert_close(fast, eager, atol=1e-5, rtol=0)


def test_eager_weights_sum_to_one_over_real_keys_and_vanish_on_padding_and_future():
    attention = _self_attention(AttentionSpec(num_heads=2))
    attention_mask = torch.tensor([[1, 1, 1, 1, 0, 0]])
    mask, is_causal = masks.self_attention_mask(attention_mask, q_len=6, k_len=6, causal=True)
    _, weights = attention(torch.randn(1, 6, 32), mask=mask, is_causal=is_causal, output_attentions=True)
    real = weights[0, :, :4]  # (H, 4 real queries, 6 keys)
    torch.testing.assert_close(real.sum(-1), torch.ones(2, 4))
    assert real[..., 4:].abs().max() == 0  # padding keys
    future = torch.ones(4, 6, dtype=torch.bool).triu(1)
    assert real[:, future].abs().max() == 0  # future keys


def test_grouped_query_attention_equals_mha_with_repeated_kv_heads():
    gqa = _self_attention(AttentionSpec(num_heads=4, num_kv_heads=2))
    mha = _self_attention(AttentionSpec(num_heads=4))
    D = 8
    q_w, k_w, v_w = gqa.qkv_proj.weight.split([32, 16, 16])
    q_b, k_b, v_b = gqa.qkv_proj.bias.split([32, 16, 16])

    def repeat(t: torch.Tensor) -> torch.Tensor:  # kv head j serves query heads 2j and 2j + 1
        return t.view(2, D, *t.shape[1:]).repeat_interleave(2, dim=0).reshape(4 * D, *t.shape[1:])

    with torch.no_grad():
        mha.qkv_proj.weight.copy_(torch.cat([q_w, repeat(k_w), repeat(v_w)]))
        mha.qkv_proj.bias.copy_(torch.cat([q_b, repeat(k_b), repeat(v_b)]))
        mha.out_proj.load_state_dict(gqa.out_proj.state_dict())
    x = torch.randn(2, 5, 32)
    torch.testing.assert_close(gqa(x, is_causal=True)[0], mha(x, is_causal=True)[0], atol=1e-5, rtol=0)


def test_cross_attention_uses_memory_for_keys_and_values():
    cross = Attention(AttentionSpec(num_heads=4), d_model=32, cross=True).eval()
    x, memory = torch.randn(2, 3, 32), torch.randn(2, 7, 32)
    out, weights = cross(x, memory=memory, output_attentions=True)
    assert out.shape == (2, 3, 32) and weights.shape == (2, 4, 3, 7)
    changed, _ = cross(x, memory=memory + 1.0)
    assert not torch.allclose(out, changed)


def _reference(q, k, v, *, scale: float, softcap: float | None, mask: torch.Tensor) -> torch.Tensor:
    """Soft-capped attention written out (transformers' eager Gemma 2): scale, cap, mask, softmax."""
    scores = q @ k.transpose(-2, -1) * scale
    if softcap is not None:
        scores = softcap * torch.tanh(scores / softcap)
    return scores.masked_fill(~mask, float("-inf")).softmax(-1) @ v


def test_soft_capped_attention_takes_the_math_path_and_caps_the_scaled_logits():
    torch.manual_seed(0)
    spec = AttentionSpec(num_heads=2, bias=False, scale=0.7, softcap=2.0)
    attn = Attention(spec, d_model=8).eval()
    x = torch.randn(2, 5, 8) * 3
    with torch.no_grad():
        out, weights = attn(x, is_causal=True)
        qkv = attn.qkv_proj(x).view(2, 5, 6, 4).transpose(1, 2)  # (B, 3H, T, D)
        q, k, v = qkv.split(2, dim=1)
        expected = _reference(q, k, v, scale=0.7, softcap=2.0, mask=masks.causal_mask(5, 5))
        expected = attn.out_proj(expected.transpose(1, 2).reshape(2, 5, 8))
        uncapped = Attention(spec.model_copy(update={"softcap": None}), d_model=8).eval()
        uncapped.load_state_dict(attn.state_dict())
        plain, _ = uncapped(x, is_causal=True)
    assert weights is None  # not asked for
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    assert (plain - out).abs().max() > 1e-2  # the cap bites at these logits


def test_a_scale_without_scaled_logits_is_refused():
    with pytest.raises(ValueError, match=r"scale \(0\.5\) is given but scaled is false"):
        AttentionSpec(scale=0.5, scaled=False)


@pytest.mark.slow  # flex_attention compiles on first use (~25 s on a CPU)
def test_soft_capping_through_flex_score_mod_equals_the_math_path():
    from zoo.blocks import flex
    from zoo.blocks.layer_masks import StackPatterns, self_attention_masks
    from zoo.spec import SlidingWindowPattern

    torch.manual_seed(0)
    attn = Attention(AttentionSpec(num_heads=4, num_kv_heads=2, bias=False, softcap=3.0), d_model=32).eval()
    x = torch.randn(2, 20, 32) * 3
    padding = torch.ones(2, 20, dtype=torch.long)
    padding[1, :6] = 0
    patterns = StackPatterns.of([SlidingWindowPattern(window=5)])

    def run(kernel):
        with flex.attention_kernel(kernel), torch.no_grad():
            [(mask, is_causal)] = self_attention_masks(
                patterns, causal=True, attention_mask=padding, q_len=20, device=torch.device("cpu")
            )
            return mask, attn(x, mask=mask, is_causal=is_causal)[0]

    flex_mask, flexed = run("flex")
    dense_mask, dense = run("sdpa")
    assert isinstance(flex_mask, flex.BlockMask) and isinstance(dense_mask, torch.Tensor)
    real = padding.bool()
    torch.testing.assert_close(flexed[real], dense[real], atol=1e-5, rtol=1e-5)


def _with_sinks(spec: AttentionSpec) -> Attention:
    attention = _self_attention(spec.model_copy(update={"sinks": True}))
    with torch.no_grad():
        attention.sinks.normal_(0.0, 2.0)
    return attention


@pytest.mark.parametrize("kv_heads", [4, 2])
@pytest.mark.parametrize("causal", [False, True])
def test_sinks_equal_a_softmax_with_one_more_zero_valued_key_on_every_path(kv_heads, causal):
    """The textbook sink: softmax over [scores, sink] with the sink column's value zero; SDPA (sink column in
    the mask), the math path and the weights returned agree with it, and weights sum to less than one."""
    torch.manual_seed(0)
    attention = _with_sinks(AttentionSpec(num_heads=4, num_kv_heads=kv_heads))
    x = torch.randn(3, 6, 32)
    attention_mask = torch.tensor([[1] * 6, [1] * 4 + [0] * 2, [0] * 2 + [1] * 4])
    mask, is_causal = masks.self_attention_mask(attention_mask, q_len=6, k_len=6, causal=causal)
    fast, _ = attention(x, mask=mask, is_causal=is_causal)
    eager, weights = attention(x, mask=mask, is_causal=is_causal, output_attentions=True)
    q, k, v = attention._project(x, None, None, None)
    k, v = k.repeat_interleave(4 // kv_heads, 1), v.repeat_interleave(4 // kv_heads, 1)  # (B, H, S, D)
    scores = q @ k.transpose(-1, -2) * attention.scale  # (B, H, T, S)
    full = mask if mask is not None else masks.causal_mask(6, 6)
    scores = scores.masked_fill(~full, float("-inf"))
    sink = attention.sinks.view(1, 4, 1, 1).expand(3, 4, 6, 1)
    expected_weights = torch.cat([scores, sink], -1).softmax(-1)[..., :-1]
    expected = attention.out_proj((expected_weights @ v).transpose(1, 2).reshape(3, 6, -1))
    torch.testing.assert_close(weights, expected_weights, atol=1e-5, rtol=0)
    torch.testing.assert_close(fast, expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(eager, expected, atol=1e-5, rtol=0)
    assert (weights.sum(-1) < 1).all()


def test_sinks_through_flex_log_sum_exp_equal_the_dense_path(monkeypatch):
    """flex's rescaling by sigmoid(lse - sink), run uncompiled (a CPU's compiled flex has no lse; CUDA's has)."""
    from torch.nn.attention.flex_attention import flex_attention

    from zoo.blocks import flex
    from zoo.blocks.layer_masks import StackPatterns, self_attention_masks
    from zoo.spec import SlidingWindowPattern

    monkeypatch.setattr(flex, "_compiled", lambda: flex_attention)
    torch.manual_seed(0)
    attention = _with_sinks(AttentionSpec(num_heads=4, num_kv_heads=2, bias=False)).eval()
    x = torch.randn(2, 20, 32) * 3
    padding = torch.ones(2, 20, dtype=torch.long)
    padding[1, :6] = 0
    patterns = StackPatterns.of([SlidingWindowPattern(window=5)])

    def run(kernel):
        with flex.attention_kernel(kernel), torch.no_grad():
            [(mask, is_causal)] = self_attention_masks(
                patterns, causal=True, attention_mask=padding, q_len=20, device=torch.device("cpu")
            )
            return mask, attention(x, mask=mask, is_causal=is_causal)[0]

    flex_mask, flexed = run("flex")
    dense_mask, dense = run("sdpa")
    assert isinstance(flex_mask, flex.BlockMask) and isinstance(dense_mask, torch.Tensor)
    real = padding.bool()
    torch.testing.assert_close(flexed[real], dense[real], atol=1e-5, rtol=1e-5)
