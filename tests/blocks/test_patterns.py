"""Attention patterns: every pattern, through SDPA's dense mask and through flex_attention, equals a plain
dense masked attention written out here from the definitions, with left and right padding; the kernel
choice; the spec's checks; properties of the mask rules."""

from __future__ import annotations

import json
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import zoo
from zoo.blocks import Attention, flex, masks
from zoo.blocks.layer_masks import StackPatterns, self_attention_masks
from zoo.spec import (
    AttentionSpec,
    BlockSparsePattern,
    CausalPattern,
    FullPattern,
    PrefixLMPattern,
    SlidingWindowPattern,
)

B, T, C, H, K = (
    2,
    18,
    64,
    4,
    2,
)  # llama-tiny's heads; one shape for every case: flex compiles once per pattern
PREFIX = [5, 3]  # prefix_lm: real tokens of each row's prefix
BLOCKS = BlockSparsePattern(block_size=4, window_blocks=1, global_blocks=1, random_blocks=1, seed=3)

# (name, pattern, causal stack)
CASES = {
    "full": (FullPattern(), False),
    "causal": (CausalPattern(), True),
    "sliding_window-causal": (SlidingWindowPattern(window=4), True),
    "sliding_window-bidirectional": (SlidingWindowPattern(window=3), False),
    "prefix_lm": (PrefixLMPattern(), True),
    "block_sparse": (BLOCKS, False),  # 18 tokens: four blocks of 4 and a short last block of 2
}


def _padding(side: str) -> torch.Tensor:
    """(B, T) 1/0: row 0 padded by 4 on ``side``, row 1 by 1."""
    mask = torch.ones(B, T, dtype=torch.long)
    for row, pads in enumerate([4, 1]):
        if side == "left":
            mask[row, :pads] = 0
        else:
            mask[row, T - pads :] = 0
    return mask


def _allowed(pattern, *, causal: bool, b: int, i: int, j: int, padding: torch.Tensor) -> bool:
    """The definitions, one query/key pair at a time (positions are slots, padding included)."""
    if not padding[b, j]:
        return False
    kind = pattern.kind
    if kind == "full":
        return True
    if kind == "causal":
        return j <= i
    if kind == "sliding_window":
        w = pattern.window
        return (i - w < j <= i) if causal else abs(i - j) < w
    if kind == "prefix_lm":
        real_before_j = int(padding[b, : j + 1].sum())  # j's place among the row's real tokens, from 1
        return j <= i or real_before_j <= PREFIX[b]
    size, blocks = pattern.block_size, math.ceil(T / pattern.block_size)
    qb, kb = i // size, j // size
    edge = lambda n: n < pattern.global_blocks or n >= blocks - pattern.global_blocks  # noqa: E731
    if edge(qb) or edge(kb) or abs(qb - kb) <= (pattern.window_blocks - 1) // 2:
        return True
    return bool(masks.block_sparse_layout(pattern, num_blocks=blocks, layer=0)[qb, kb])  # the random blocks


def _reference(attention: Attention, x: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """Multi-head attention written out: scores, -inf where not allowed, softmax, weighted values."""
    D = attention.head_dim
    q, k, v = attention.qkv_proj(x).split([H * D, K * D, K * D], dim=-1)
    q = q.view(B, T, H, D).transpose(1, 2)  # (B, H, T, D)
    k = k.view(B, T, K, D).transpose(1, 2).repeat_interleave(H // K, dim=1)  # (B, H, T, D)
    v = v.view(B, T, K, D).transpose(1, 2).repeat_interleave(H // K, dim=1)
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(D)  # (B, H, T, T)
    weights = scores.masked_fill(~allowed[:, None], float("-inf")).softmax(dim=-1).nan_to_num()
    out = (weights @ v).transpose(1, 2).reshape(B, T, H * D)
    return attention.out_proj(out)


def _run(case: str, kernel: str, side: str) -> None:
    pattern, causal = CASES[case]
    padding = _padding(side)
    attention = Attention(AttentionSpec(num_heads=H, num_kv_heads=K), d_model=C).eval()
    x = torch.randn(B, T, C)
    prefix = torch.tensor(PREFIX) if pattern.kind == "prefix_lm" else None
    with flex.attention_kernel(kernel), torch.no_grad():
        [(mask, is_causal)] = self_attention_masks(
            StackPatterns.of([pattern]),
            causal=causal,
            attention_mask=padding,
            q_len=T,
            prefix_lengths=prefix,
            device=x.device,
        )
        assert isinstance(mask, flex.BlockMask) == (kernel == "flex")
        out, _ = attention(x, mask=mask, is_causal=is_causal)
        allowed = torch.tensor(
            [
                [
                    [_allowed(pattern, causal=causal, b=b, i=i, j=j, padding=padding) for j in range(T)]
                    for i in range(T)
                ]
                for b in range(B)
            ]
        )  # (B, T, T)
        expected = _reference(attention, x, allowed)
    real = padding.bool() & allowed.any(dim=-1)  # rows nobody reads (padding, nothing visible) may differ
    torch.testing.assert_close(out[real], expected[real], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("case", list(CASES))
def test_each_pattern_equals_the_dense_reference_through_sdpa(case, side):
    _run(case, "sdpa", side)


# flex_attention compiles once per pattern (seconds each on a small CPU): one pattern in the fast suite
FLEX_CASES = [
    pytest.param(case, marks=() if case == "sliding_window-causal" else pytest.mark.slow) for case in CASES
]


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("case", FLEX_CASES)
def test_each_pattern_equals_the_dense_reference_through_flex(case, side):
    _run(case, "flex", side)


# -- the kernel choice -----------------------------------------------------------------------------------


def _masks_at(q_len: int, pattern, **kwargs):
    return self_attention_masks(
        StackPatterns.of([pattern]), causal=True, attention_mask=None, q_len=q_len, device=torch.device("cpu"),
        **kwargs,
    )[0][0]  # fmt: skip


def test_auto_takes_flex_for_long_sparse_calls_only():
    long = flex.FLEX_MIN_QUERIES
    window = SlidingWindowPattern(window=16)
    assert isinstance(_masks_at(long, window), flex.BlockMask)  # building a block mask compiles nothing
    assert isinstance(_masks_at(long - 1, window), torch.Tensor)  # short: the dense mask
    assert _masks_at(long, CausalPattern()) is None  # causal and full keep SDPA's own fast path
    assert isinstance(_masks_at(long, window, dense_only=True), torch.Tensor)  # weights, bias or dropout
    assert isinstance(_masks_at(long, window, grad=True), torch.Tensor)  # torch has no CPU backward for flex
    with flex.attention_kernel("sdpa"):
        assert isinstance(_masks_at(long, window), torch.Tensor)
    with flex.attention_kernel("flex"):
        assert isinstance(_masks_at(8, CausalPattern()), flex.BlockMask)


def test_kernel_settings_are_checked(monkeypatch):
    with pytest.raises(ValueError, match="kernel 'fast' is not one of auto, flex, sdpa"):
        flex.attention_kernel("fast").__enter__()  # type: ignore[arg-type]
    monkeypatch.setenv("ZOO_ATTENTION_KERNEL", "sdpa")
    assert flex.current_kernel() == "sdpa"
    with flex.attention_kernel("flex"):
        assert flex.current_kernel() == "flex"  # the innermost setting wins
    monkeypatch.setenv("ZOO_ATTENTION_KERNEL", "dense")
    with pytest.raises(ValueError, match="ZOO_ATTENTION_KERNEL='dense': expected one of auto, flex, sdpa"):
        flex.current_kernel()


@pytest.mark.parametrize("tile", [128, 32])
@pytest.mark.parametrize("case", ["sliding_window-causal", "prefix_lm", "block_sparse"])
def test_block_tables_equal_torchs_create_block_mask(case, tile):
    """zoo builds the tables one query tile at a time; torch's create_block_mask from the dense mask."""
    from torch.nn.attention.flex_attention import create_block_mask

    pattern, causal = CASES[case]
    L = 150  # not a multiple of either tile
    padding = torch.ones(B, L, dtype=torch.long)
    padding[0, :40] = 0  # whole tiles of padding on the left of row 0, a partial one at row 1's end
    padding[1, 140:] = 0
    frame = masks.make_frame(padding, q_len=L, offset=0)
    prefix = masks.prefix_keys(torch.tensor(PREFIX), padding, length=L)
    rule = masks.pattern_rule(pattern, causal=causal, layer=0, length=L, prefix=prefix)
    ours = flex.block_mask(rule, frame, tile=tile)
    theirs = create_block_mask(ours.mask_mod, B, None, L, L, device="cpu", BLOCK_SIZE=tile)
    for mine, torchs in zip(ours.to_dense(), theirs.to_dense()):
        assert torch.equal(mine.expand_as(torchs), torchs)
    if tile == 32:  # 5 x 5 tiles per row: the pattern and the padding leave some out
        visible = ours.kv_num_blocks + ours.full_kv_num_blocks
        assert visible.sum() < B * 5 * 5


def test_one_mask_per_distinct_pattern():
    local, full = SlidingWindowPattern(window=2), FullPattern()
    patterns = StackPatterns.of([local, full, local, full])
    built = self_attention_masks(
        patterns, causal=False, attention_mask=None, q_len=6, device=torch.device("cpu")
    )
    assert built[0][0] is built[2][0] and built[1] == (None, False)
    seeded = StackPatterns.of([BLOCKS, BLOCKS])
    assert seeded.group_of == (0, 1)  # random blocks are seeded per layer: a mask each
    assert StackPatterns.of([BLOCKS.model_copy(update={"random_blocks": 0})] * 2).group_of == (0, 0)


# -- the rules -------------------------------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(length=st.integers(1, 40), window=st.integers(1, 12))
def test_a_causal_window_sees_window_keys_ending_at_itself(length, window):
    q, k = torch.arange(length)[:, None], torch.arange(length)[None, :]
    mask = masks.sliding_window_allows(q, k, window=window, causal=True)
    assert mask.sum(dim=1).tolist() == [min(window, i + 1) for i in range(length)]
    assert not mask.triu(diagonal=1).any() and mask.diagonal().all()
    both = masks.sliding_window_allows(q, k, window=window, causal=False)
    assert torch.equal(both, both.T) and torch.equal(both.tril(), mask)


@settings(max_examples=40, deadline=None)
@given(
    blocks=st.integers(1, 16),
    window=st.sampled_from([1, 3, 5]),
    globals_=st.integers(0, 2),
    randoms=st.integers(0, 3),
    layer=st.integers(0, 3),
)
def test_block_layout_has_window_global_and_random_blocks(blocks, window, globals_, randoms, layer):
    pattern = BlockSparsePattern(window_blocks=window, global_blocks=globals_, random_blocks=randoms)
    layout = masks.block_sparse_layout(pattern, num_blocks=blocks, layer=layer)
    n = torch.arange(blocks)
    assert layout[(n[:, None] - n[None, :]).abs() <= window // 2].all()  # the window around each block
    edge = (n < globals_) | (n >= blocks - globals_)
    assert layout[edge].all() and layout[:, edge].all()  # global blocks see and are seen by all
    fixed = ((n[:, None] - n[None, :]).abs() <= window // 2) | edge[:, None] | edge[None, :]  # before random
    unseen = blocks - fixed.sum(dim=1)
    assert torch.equal(
        layout.sum(dim=1), fixed.sum(dim=1) + unseen.clamp(max=randoms)
    )  # r more, if there are


def test_random_blocks_are_fixed_per_layer_and_differ_between_layers():
    pattern = BlockSparsePattern(window_blocks=1, global_blocks=0, random_blocks=2, seed=7)
    first = masks.block_sparse_layout(pattern, num_blocks=12, layer=0)
    masks._layout.cache_clear()  # drawn again, not remembered: the same blocks
    assert torch.equal(first, masks.block_sparse_layout(pattern, num_blocks=12, layer=0))
    assert not torch.equal(first, masks.block_sparse_layout(pattern, num_blocks=12, layer=1))


def test_prefix_keys_count_real_tokens_from_the_first_one():
    padding = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])
    table = masks.prefix_keys(torch.tensor([2, 3]), padding, length=6)
    assert table.int().tolist() == [[0, 0, 1, 1, 0, 0], [1, 1, 1, 0, 0, 0]]


# -- models ----------------------------------------------------------------------------------------------


def test_a_prefix_lm_decoder_reads_its_prefix_both_ways_and_the_rest_causally():
    spec = zoo.preset("llama-tiny").override(decoder={"pattern": {"kind": "prefix_lm"}}, dropout=0.0)
    model = zoo.build(spec).eval()
    ids = torch.randint(3, 500, (1, 8))
    changed = ids.clone()
    changed[0, 2] = (ids[0, 2] + 1) % 500  # a token inside the prefix of 4
    later = ids.clone()
    later[0, 6] = (ids[0, 6] + 1) % 500  # a token after it
    prefix = torch.tensor([4])
    with torch.no_grad():
        base = model(ids, prefix_lengths=prefix).logits
        assert not torch.allclose(base[0, 0], model(changed, prefix_lengths=prefix).logits[0, 0])  # seen back
        torch.testing.assert_close(base[0, :6], model(later, prefix_lengths=prefix).logits[0, :6])  # causal
        torch.testing.assert_close(model(ids).logits[0, 0], model(changed).logits[0, 0])  # no prefix: causal


def test_each_row_gets_its_own_prefix_in_a_batch_without_padding():
    spec = zoo.preset("llama-tiny").override(decoder={"pattern": {"kind": "prefix_lm"}}, dropout=0.0)
    model = zoo.build(spec).eval()
    ids = torch.randint(3, 500, (2, 7))
    with torch.no_grad():
        batch = model(ids, prefix_lengths=torch.tensor([2, 5])).logits
        for row, prefix in enumerate([2, 5]):
            alone = model(ids[row : row + 1], prefix_lengths=torch.tensor([prefix])).logits
            torch.testing.assert_close(batch[row], alone[0], atol=1e-5, rtol=1e-5)


def test_prefix_lengths_are_checked():
    model = zoo.build(zoo.preset("llama-tiny").override(decoder={"pattern": {"kind": "prefix_lm"}}))
    ids = torch.randint(3, 500, (2, 5))
    with pytest.raises(
        ValueError, match=r"prefix_lengths must be a \(2,\) tensor, one prefix length per row"
    ):
        model(ids, prefix_lengths=torch.tensor([1]))
    with pytest.raises(ValueError, match=r"prefix_lengths contains 6, outside \[0, 5\]"):
        model(ids, prefix_lengths=torch.tensor([1, 6]))
    with pytest.raises(ValueError, match="no layer of this model has that pattern"):
        zoo.build(zoo.preset("llama-tiny"))(ids, prefix_lengths=torch.tensor([1, 2]))


@pytest.mark.slow  # a flex compile of its own (rotary keys have other strides than the test above)
def test_a_decoder_with_a_window_matches_through_both_kernels():
    spec = zoo.preset("llama-tiny").override(decoder={"pattern": {"kind": "sliding_window", "window": 4}})
    model = zoo.build(spec).eval()
    ids, padding = torch.randint(3, 500, (B, T)), _padding("left")
    with torch.no_grad():
        with flex.attention_kernel("sdpa"):
            dense = model(ids, attention_mask=padding).logits
        with flex.attention_kernel("flex"):
            sparse = model(ids, attention_mask=padding).logits
    real = padding.bool()
    torch.testing.assert_close(sparse[real], dense[real], atol=1e-5, rtol=1e-5)


# -- the spec --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("family", "stack", "message"),
    [
        ("decoder", {"pattern": {"kind": "full"}}, "decoder.pattern: full attention lets a position see the tokens after it"),
        ("decoder", {"pattern": {"kind": "block_sparse"}}, "decoder.pattern: block_sparse attention lets a position see"),
        ("encoder", {"pattern": {"kind": "causal"}}, "encoder.pattern: causal is a pattern for decoder stacks"),
        ("encoder", {"layer_patterns": [{"kind": "full"}, {"kind": "prefix_lm"}]}, r"encoder.layer_patterns\[1\]: prefix_lm is a pattern for decoder stacks"),
        ("encoder", {"layer_patterns": [{"kind": "full"}, {"kind": "block_sparse", "window_blocks": 2}]}, r"encoder.layer_patterns\[1\].window_blocks \(2\) must be odd"),
        ("encoder", {"layer_patterns": [{"kind": "full"}]}, r"encoder.layer_patterns needs one pattern per layer, 2 \(num_layers\), got 1"),
        ("decoder", {"pattern": {"kind": "sliding_window", "window": 0}}, "decoder.pattern.sliding_window.window: Input should be greater than 0"),
        ("decoder", {"pattern": {"kind": "sliding_window"}}, "decoder.pattern.sliding_window.window: Field required"),
        ("decoder", {"pattern": {"kind": "dilated"}}, "decoder.pattern: Input tag 'dilated' found using 'kind' does not match"),
    ],
)  # fmt: skip
def test_patterns_that_do_not_fit_their_stack_are_refused(family, stack, message):
    with pytest.raises(zoo.SpecError, match=message):
        zoo.parse_spec({"family": family, "vocab_size": 10, "num_layers": 2, family: stack})


def test_prefix_lm_is_for_decoder_only_models():
    with pytest.raises(
        zoo.SpecError, match=r"decoder\.pattern: prefix_lm needs prefix lengths at forward time"
    ):
        zoo.parse_spec(
            {"family": "encoder-decoder", "vocab_size": 10, "decoder": {"pattern": {"kind": "prefix_lm"}}}
        )


def test_patterns_resolve_per_stack_and_per_layer():
    spec = zoo.preset("t5-tiny").override(encoder={"pattern": {"kind": "sliding_window", "window": 8}})
    stacks = spec.stacks()
    assert stacks["encoder"].pattern == SlidingWindowPattern(window=8)
    assert stacks["decoder"].pattern == CausalPattern() and stacks["decoder"].layer_patterns is None
    local, wide = {"kind": "sliding_window", "window": 4}, {"kind": "causal"}
    gemma = zoo.preset("llama-tiny").override(decoder={"layer_patterns": [local, wide]})
    resolved = gemma.stacks()["decoder"]
    assert [resolved.layer_pattern(i).kind for i in range(2)] == ["sliding_window", "causal"]
    assert zoo.parse_spec(gemma.model_dump()) == gemma  # round-trips through JSON-able data
    assert "BlockSparsePattern" in json.dumps(zoo.json_schema())


@pytest.mark.parametrize("where", ["fake", "meta"])
def test_patterned_stacks_read_no_values_on_the_host(where):
    """As every forward (tests/models/test_no_host_sync.py): patterns, prefixes and padding on FakeTensors
    and on the meta device, where a host read raises instead of syncing with a GPU."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    window, prefix = {"kind": "sliding_window", "window": 3}, {"kind": "prefix_lm"}
    specs = [
        zoo.preset("llama-tiny").override(decoder={"layer_patterns": [window, prefix]}),
        zoo.preset("bert-tiny").override(encoder={"pattern": {"kind": "block_sparse", "block_size": 2}}),
    ]
    for spec in specs:
        ids, padding = torch.randint(3, 500, (2, 9)), _padding("right")[:, :9]
        mode = FakeTensorMode() if where == "fake" else None
        with mode or torch.device("meta"):
            model = zoo.build(spec, device="meta" if mode is None else None)
            move = mode.from_tensor if mode is not None else (lambda t: t.to("meta"))
            kwargs = {"prefix_lengths": move(torch.tensor([2, 4]))} if spec.family == "decoder" else {}
            out = model.eval()(move(ids), attention_mask=move(padding), **kwargs)
        assert out.last_hidden_state.shape == (2, 9, spec.d_model)
