"""GQA reaches SDPA in a form a fused kernel accepts: the choice table, and that every form gives the same
numbers (CPU here; on a CUDA machine the `cuda` test forbids the math kernel outright)."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from zoo.blocks.attention import Attention, gqa_mode
from zoo.spec import AttentionSpec


@pytest.mark.parametrize(
    ("device_type", "masked", "num_heads", "num_kv_heads", "expected"),
    [
        ("cpu", False, 8, 8, "mha"),
        ("cuda", True, 8, 8, "mha"),
        ("cpu", False, 8, 2, "enable_gqa"),
        ("cpu", True, 8, 2, "enable_gqa"),  # CPU's fused kernel takes a mask and GQA together
        ("cuda", False, 8, 2, "enable_gqa"),  # flash: GQA without a mask (causal by is_causal)
        ("cuda", True, 8, 2, "expand"),  # only memory-efficient takes a mask, and it has no GQA
        ("cuda", True, 8, 1, "expand"),  # MQA likewise
    ],
)
def test_gqa_mode_table(
    device_type: str, masked: bool, num_heads: int, num_kv_heads: int, expected: str
) -> None:
    mode = gqa_mode(device_type=device_type, masked=masked, num_heads=num_heads, num_kv_heads=num_kv_heads)
    assert mode == expected


def test_expanded_keys_equal_enable_gqa() -> None:
    torch.manual_seed(0)
    q = torch.randn(2, 8, 5, 4)  # (B, H, T, D)
    k, v = torch.randn(2, 2, 7, 4), torch.randn(2, 2, 7, 4)  # (B, K, S, D)
    mask = torch.rand(2, 1, 5, 7) > 0.3
    mask[..., 0] = True
    shared = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    expanded = F.scaled_dot_product_attention(
        q, k.repeat_interleave(4, dim=1), v.repeat_interleave(4, dim=1), attn_mask=mask
    )
    torch.testing.assert_close(shared, expanded, atol=1e-6, rtol=1e-6)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("masked", [False, True])
def test_masked_gqa_runs_on_a_fused_cuda_kernel(masked: bool) -> None:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    attention = Attention(AttentionSpec(num_heads=8, num_kv_heads=2), d_model=256).cuda().half().eval()
    x = torch.randn(2, 64, 256, device="cuda", dtype=torch.half)
    mask = torch.ones(2, 1, 64, 64, dtype=torch.bool, device="cuda").tril() if masked else None
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]), torch.no_grad():
        out, _ = attention(x, mask=mask, is_causal=not masked)  # raises if only the math kernel would do
    assert out.shape == x.shape
