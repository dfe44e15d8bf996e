"""The Mixture-of-Experts FFN (`zoo.blocks.moe`): routing and dispatch against a per-token reference, the
load-balancing loss, and the block in every family: it builds, trains a step and its aux loss reaches the
router."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import zoo
from zoo.blocks import MoEFeedForward
from zoo.losses import load_balancing_loss
from zoo.spec import MoESpec

MOE = {"kind": "moe", "num_experts": 4, "top_k": 2, "d_ff": 24, "shared_d_ff": 16, "sparse_step": 2,
       "dense_d_ff": 40}  # fmt: skip


def reference(block: MoEFeedForward, x: torch.Tensor) -> torch.Tensor:
    """Token by token, expert by expert: what the vectorised dispatch must equal."""
    flat = x.reshape(-1, x.shape[-1])
    probs = torch.softmax(block.router(flat).float(), dim=-1)
    out = torch.zeros_like(flat)
    up, down = block.experts.up_proj.weight, block.experts.down_proj.weight
    up_bias, down_bias = block.experts.up_bias, block.experts.down_bias
    F, clamped = block.experts.d_ff, block.experts.clamped_glu
    for n in range(flat.shape[0]):
        weights, experts = probs[n].topk(block.top_k)
        if block.normalize_top_k:
            weights = weights / weights.sum()
        for w, e in zip(weights, experts.tolist()):
            h = up[e] @ flat[n] + (up_bias[e] if up_bias is not None else 0)
            gate, lin = h[:F], h[F:]
            if clamped is not None:  # gpt-oss, as transformers' GptOssExperts._apply_gate writes it
                gate, lin = gate.clamp(max=clamped.limit), lin.clamp(-clamped.limit, clamped.limit)
                glu = (lin + 1) * gate * torch.sigmoid(gate * clamped.alpha)
            else:
                glu = torch.nn.functional.silu(gate) * lin
            out[n] += w * (down[e] @ glu + (down_bias[e] if down_bias is not None else 0))
        if block.shared is not None:
            gate = torch.sigmoid(block.shared_gate(flat[n])) if block.shared_gate is not None else 1.0
            out[n] += gate * block.shared(flat[n][None, None])[0, 0]
    return out.view_as(x)


@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize("shared", [None, 16])
def test_dispatch_equals_the_per_token_reference(normalize: bool, shared: int | None) -> None:
    spec = MoESpec(num_experts=5, top_k=2, d_ff=12, normalize_top_k=normalize, shared_d_ff=shared)
    block = MoEFeedForward(spec, d_model=16)
    block.init_weights(std=0.3)
    x = torch.randn(3, 7, 16)
    out, router = block(x)
    torch.testing.assert_close(out, reference(block, x), atol=1e-5, rtol=1e-5)
    assert router.probs.shape == (21, 5) and router.experts.shape == (21, 2)


GPT_OSS = {"router_bias": True, "expert_bias": True, "clamped_glu": {"alpha": 1.3, "limit": 0.8}}


def _gpt_oss_block(**spec: Any) -> MoEFeedForward:
    block = MoEFeedForward(MoESpec.model_validate({**spec, **GPT_OSS}), d_model=16)
    block.init_weights(std=0.3)
    with torch.no_grad():
        for bias in (block.router.bias, block.experts.up_bias, block.experts.down_bias):
            bias.normal_(0.0, 0.5)
    return block


def test_gpt_oss_options_dispatch_equals_the_per_token_reference() -> None:
    """Biased router and experts, and the clamped SwiGLU with a limit the activations reach."""
    block = _gpt_oss_block(num_experts=5, top_k=2, d_ff=12)
    x = torch.randn(3, 7, 16)
    out, _ = block(x)
    torch.testing.assert_close(out, reference(block, x), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("gpt_oss", [False, True])
@pytest.mark.parametrize("d_ff", [8, 6])  # 6 float32s: rows of 24 bytes, the per-expert loop, not grouped_mm
def test_grouped_and_gathered_dispatch_agree(d_ff: int, gpt_oss: bool) -> None:
    """The grouped path (torch's grouped GEMM or the per-expert loop) equals the one torch.compile (few
    tokens) and torch.export take, values and gradients (with gpt-oss's expert biases too)."""
    from zoo.blocks.moe import _grouped_mm_fits

    if gpt_oss:
        block = _gpt_oss_block(num_experts=4, top_k=3, d_ff=d_ff)
    else:
        block = MoEFeedForward(MoESpec(num_experts=4, top_k=3, d_ff=d_ff), d_model=16)
        block.init_weights(std=0.3)
    up, down = block.experts.weights()
    assert _grouped_mm_fits(torch.zeros(1, 16), up, down) == (d_ff == 8 and hasattr(torch, "_grouped_mm"))
    x = torch.randn(20, 16, requires_grad=True)
    token, experts, weight = torch.randint(0, 20, (30,)), torch.randint(0, 4, (30,)), torch.rand(30)
    order = experts.argsort(stable=True)
    counts = torch.bincount(experts, minlength=4)
    grouped = block.experts.grouped(x, token[order], weight[order], counts, experts[order])
    gathered = block.experts.gathered(x, token, weight, experts)
    torch.testing.assert_close(grouped, gathered, atol=1e-5, rtol=1e-5)
    params = [x, block.experts.up_proj.weight, block.experts.down_proj.weight]
    params += [block.experts.up_bias, block.experts.down_bias] if gpt_oss else []
    grads = [torch.autograd.grad(out.square().sum(), params) for out in (grouped, gathered)]
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


def test_load_balancing_loss_is_one_times_top_k_when_routing_is_uniform_and_ignores_padding() -> None:
    N, E, k = 8, 4, 2
    probs = torch.full((N, E), 1 / E)
    experts = torch.tensor([[i % E, (i + 1) % E] for i in range(N)])
    loss = load_balancing_loss([(probs, experts)])
    assert loss is not None and float(loss) == pytest.approx(k)
    skewed = torch.zeros(N, E).index_fill_(1, torch.tensor([0]), 1.0)
    mask = torch.tensor([[1, 1, 1, 1, 0, 0, 0, 0]])
    padded = load_balancing_loss(
        [(probs.clone().index_copy_(0, torch.arange(4, 8), skewed[4:]), experts)], mask
    )
    assert padded is not None and float(padded) == pytest.approx(k)  # the skewed rows are padding
    assert load_balancing_loss([]) is None


def _spec(family: str) -> Any:
    base: dict[str, Any] = {"vocab_size": 100, "d_model": 32, "num_layers": 2, "attention": {"num_heads": 2},
                            "max_positions": 32, "dropout": 0.0, "ffn": MOE}  # fmt: skip
    if family == "encoder":
        return zoo.spec.parse_spec({**base, "family": "encoder", "heads": {"mlm": {}}})
    if family == "encoder-decoder":
        return zoo.spec.parse_spec({**base, "family": "encoder-decoder"})
    return zoo.spec.parse_spec({**base, "family": "decoder"})


@pytest.mark.parametrize("family", ["decoder", "encoder", "encoder-decoder"])
def test_moe_block_builds_trains_a_step_and_its_aux_loss_reaches_the_router(family: str) -> None:
    model = zoo.build(_spec(family))
    sparse = [m for m in model.modules() if isinstance(m, MoEFeedForward)]
    assert len(sparse) == (2 if family == "encoder-decoder" else 1)  # layer 1 of each stack (sparse_step 2)
    ids = torch.randint(3, 100, (2, 9))
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    kwargs = {"decoder_input_ids": ids} if family == "encoder-decoder" else {}
    out = model(ids, attention_mask=mask, labels=ids, **kwargs)
    assert out.aux_loss is not None and out.aux_loss.ndim == 0
    out.aux_loss.backward(retain_graph=True)
    assert all(block.router.weight.grad.abs().sum() > 0 for block in sparse)  # the aux loss alone
    model.zero_grad()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    before = [p.detach().clone() for p in sparse[0].experts.parameters()]
    (out.loss + 0.01 * out.aux_loss).backward()
    optimizer.step()
    assert all(not torch.equal(a, b) for a, b in zip(before, sparse[0].experts.parameters()))


def test_a_dense_model_has_no_aux_loss() -> None:
    out = zoo.build("llama-tiny")(torch.randint(3, 100, (1, 5)))
    assert out.aux_loss is None


def test_override_switches_the_ffn_kind_whole() -> None:
    spec = zoo.preset("llama-tiny").override(ffn={"kind": "moe", "num_experts": 2, "top_k": 1, "d_ff": 8})
    assert isinstance(spec.ffn, MoESpec) and spec.ffn.num_experts == 2
    assert spec.override(**{"ffn.top_k": 2}).ffn.top_k == 2  # same kind: merged


def test_dense_specs_without_kind_keep_their_json(tmp_path: Path) -> None:
    """Saved spec.json files (and resume's comparison) see the same dense FFN as before the union."""
    spec = zoo.preset("llama-tiny")
    assert "kind" not in spec.model_dump()["ffn"]
    moe = zoo.preset("moe-tiny")
    assert moe.model_dump()["ffn"]["kind"] == "moe"
    assert zoo.spec.parse_spec(moe.model_dump()) == moe


def test_a_saved_moe_model_loads_with_the_same_outputs(tmp_path: Path) -> None:
    model = zoo.build(_spec("decoder")).eval()
    zoo.save(model, tmp_path / "moe")
    loaded = zoo.load(tmp_path / "moe").eval()
    assert loaded.spec == model.spec
    ids = torch.randint(3, 100, (2, 7))
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, model(ids).logits, atol=0, rtol=0)


def test_the_clamped_glu_takes_silu_as_the_activation_it_replaces() -> None:
    with pytest.raises(
        ValueError, match=r"clamped_glu replaces the experts' activation: activation must be 'silu'"
    ):
        MoESpec.model_validate({"activation": "gelu", **GPT_OSS})
