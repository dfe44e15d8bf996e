"""Positions: the paper's sinusoid (and a hand-computed table), half layout, rotary, T5 buckets, ALiBi."""

from __future__ import annotations

import math

import pytest
import torch

from zoo.blocks.position import (
    AlibiBias,
    RelativeBias,
    RotaryPositions,
    SinusoidalPositions,
    alibi_slopes,
    apply_rotary,
    sinusoidal_table,
)

# d_model 10, positions 0-4, computed with the formula in plain Python.
HAND_ROW_1 = [0.8414709848078965, 0.5403023058681398, 0.1578266401303058, 0.987466835729271, 0.025116222909773774,
               0.9996845379152098, 0.003981061189587565, 0.9999920755445039, 0.0006309573026154199, 0.9999998009464214]  # fmt: skip
HAND_ROW_4 = [-0.7568024953079282, -0.6536436208636119, 0.5923377252484391, 0.8056897785422777, 0.10030648729934574,
               0.9949565862919176, 0.01592361380950573, 0.999873211223926, 0.0025238266985760983, 0.9999968151443261]  # fmt: skip


def test_sinusoidal_table_reproduces_a_hand_computed_table():
    table = sinusoidal_table(5, 10)
    assert table.shape == (5, 10)
    assert table[0].tolist() == [0.0, 1.0] * 5
    torch.testing.assert_close(table[1], torch.tensor(HAND_ROW_1), atol=1e-7, rtol=0)
    torch.testing.assert_close(table[4], torch.tensor(HAND_ROW_4), atol=1e-7, rtol=0)


def test_sinusoidal_table_equals_the_paper_formula():
    d_model, table = 16, sinusoidal_table(50, 16)
    for pos in (0, 7, 49):
        for i in range(d_model // 2):
            angle = pos / 10000 ** (2 * i / d_model)
            assert math.isclose(table[pos, 2 * i], math.sin(angle), abs_tol=1e-6)
            assert math.isclose(table[pos, 2 * i + 1], math.cos(angle), abs_tol=1e-6)


def test_half_layout_puts_sines_first():
    interleaved, half = sinusoidal_table(9, 8), sinusoidal_table(9, 8, layout="half")
    torch.testing.assert_close(half[:, :4], interleaved[:, 0::2])
    torch.testing.assert_close(half[:, 4:], interleaved[:, 1::2])


def test_rotary_preserves_norms_and_depends_only_on_relative_position():
    rope = RotaryPositions(theta=10000.0, max_positions=64, head_dim=8)
    q, k = torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8)

    def score(qp: int, kp: int) -> torch.Tensor:
        cq, sq = rope(torch.tensor([[qp]]))
        ck, sk = rope(torch.tensor([[kp]]))
        return (apply_rotary(q, cq, sq) * apply_rotary(k, ck, sk)).sum()

    torch.testing.assert_close(score(5, 2), score(30, 27), atol=1e-5, rtol=0)
    cos, sin = rope(torch.tensor([[13]]))
    torch.testing.assert_close(apply_rotary(q, cos, sin).norm(), q.norm())


def test_t5_buckets_match_the_reference_layout():
    bidirectional = RelativeBias(num_buckets=32, max_distance=128, num_heads=2, bidirectional=True)
    relative = torch.tensor([0, -1, 1, -7, 7, -8, -20, -127, -500, 500])
    # small distances exact (0..7 before, 16..23 after), then log-spaced, saturating at the last bucket
    assert bidirectional.bucket(relative).tolist() == [0, 1, 17, 7, 23, 8, 10, 15, 15, 31]
    causal = RelativeBias(num_buckets=32, max_distance=128, num_heads=2, bidirectional=False)
    assert causal.bucket(torch.tensor([0, -1, 5, -15, -16, -1000])).tolist() == [0, 1, 0, 15, 16, 31]


@pytest.mark.parametrize(("num_buckets", "max_distance"), [(32, 128), (12, 24), (64, 20), (32, 8)])
@pytest.mark.parametrize("bidirectional", [True, False])
def test_t5_buckets_equal_transformers_at_every_distance(num_buckets, max_distance, bidirectional):
    """(64, 20) and (32, 8) put max_distance below the exact range: the scaled log is negative there, and
    only truncating it before adding max_exact (as transformers does) gives the same buckets."""
    transformers = pytest.importorskip("transformers")
    reference = transformers.models.t5.modeling_t5.T5Attention._relative_position_bucket
    relative = torch.arange(-700, 700)
    theirs = reference(relative, bidirectional, num_buckets, max_distance)
    bias = RelativeBias(
        num_buckets=num_buckets, max_distance=max_distance, num_heads=1, bidirectional=bidirectional
    )
    assert torch.equal(bias.bucket(relative), theirs)


def test_per_layer_bias_reads_each_layers_table():
    shared = RelativeBias(num_buckets=8, max_distance=16, num_heads=2, bidirectional=False)
    per_layer = RelativeBias(num_buckets=8, max_distance=16, num_heads=2, bidirectional=False, num_layers=3)
    tables = torch.randn(3, 8, 2)
    with torch.no_grad():
        per_layer.weight.copy_(tables)
        shared.weight.copy_(tables[1])
    assert per_layer.weight.shape == (3, 8, 2) and per_layer.per_layer and not shared.per_layer
    torch.testing.assert_close(per_layer(2, 5, layer=1), shared(2, 5), atol=0, rtol=0)
    assert per_layer(2, 5, layer=0).shape == (1, 2, 2, 5)
    with pytest.raises(ValueError, match="per-layer"):
        per_layer(2, 5)


def test_alibi_slopes_follow_the_paper():
    torch.testing.assert_close(
        alibi_slopes(8), torch.tensor([2 ** (-i) for i in range(1, 9)], dtype=torch.float32)
    )
    bias = AlibiBias(num_heads=8, bidirectional=False)(3, 3)
    assert bias.shape == (1, 8, 3, 3)
    assert bias[0, 0, 2].tolist() == [-1.0, -0.5, 0.0]


@pytest.mark.parametrize(
    "make",
    [
        lambda: SinusoidalPositions(layout="interleaved", max_positions=64, dim=8),
        lambda: RotaryPositions(theta=10000.0, max_positions=64, head_dim=8),
        lambda: AlibiBias(num_heads=12, bidirectional=False),  # 12 heads: slopes 2^-0.5k, inexact in bf16
    ],
    ids=["sinusoidal", "rotary", "alibi"],
)
def test_fixed_tables_stay_float32_through_dtype_casts_and_follow_the_device(make):
    fresh = dict(make().named_buffers())
    for cast in (lambda m: m.to(torch.bfloat16), lambda m: m.half(), lambda m: m.bfloat16().float()):
        tables = dict(cast(make()).named_buffers())
        assert all(torch.equal(tables[name], table) for name, table in fresh.items())  # float32, unrounded
    moved = make().to("meta", torch.bfloat16)
    assert all(t.is_meta and t.dtype == torch.float32 for t in moved.buffers())
    moved.to_empty(device="cpu").reset_buffers()
    assert all(torch.equal(t, fresh[name]) for name, t in moved.named_buffers())
