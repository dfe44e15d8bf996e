"""Layer wiring: the decoder layer gives the causal mask to self-attention and the encoder's padding mask to
cross-attention (a common slip swaps them); pre- vs post-norm residuals."""

from __future__ import annotations

import torch

import zoo
from zoo.blocks import masks


def test_decoder_layer_routes_causal_mask_to_self_and_padding_to_cross():
    model = zoo.build("transformer-tiny").eval()
    seen: dict[str, dict] = {}

    def spy(name):
        def hook(module, args, kwargs):
            seen[name] = kwargs

        return hook

    layer = model.decoder.layers[0]
    hooks = [
        layer.self_attn.register_forward_pre_hook(spy("self"), with_kwargs=True),
        layer.cross_attn.register_forward_pre_hook(spy("cross"), with_kwargs=True),
    ]
    src_mask = torch.tensor([[1, 1, 1, 0, 0]])
    tgt_mask = torch.tensor([[1, 1, 1, 1]])
    model(torch.randint(3, 9000, (1, 5)), attention_mask=src_mask, decoder_input_ids=torch.randint(3, 9000, (1, 4)),
          decoder_attention_mask=tgt_mask)  # fmt: skip
    for hook in hooks:
        hook.remove()
    # self-attention: causal (no padding in the target, so SDPA's is_causal does it)
    assert seen["self"]["is_causal"] is True and seen["self"]["mask"] is None
    # cross-attention: the source's key padding, never causal
    assert torch.equal(seen["cross"]["mask"], masks.padding_mask(src_mask))
    assert "is_causal" not in seen["cross"] or seen["cross"]["is_causal"] is False


def test_post_norm_normalises_the_residual_sum_and_pre_norm_does_not():
    post = zoo.build("transformer-tiny").eval()
    pre = zoo.build(zoo.preset("transformer-tiny").override(**{"norm.placement": "pre"})).eval()
    ids = torch.randint(3, 9000, (1, 6))
    captured: dict[str, torch.Tensor] = {}
    for model, normalised in ((post, True), (pre, False)):
        hook = model.encoder.layers[0].register_forward_hook(lambda m, a, out: captured.update(h=out.hidden))
        model.encode(ids)
        hook.remove()
        std = captured["h"].std(dim=-1, unbiased=False)
        assert torch.allclose(std, torch.ones_like(std), atol=1e-3) == normalised
    assert pre.encoder.final_norm is not None and post.encoder.final_norm is None
