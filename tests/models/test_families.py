"""Family invariants: padding invariance, causality, loss on real tokens only, and a tiny model of each
family overfits a fixed batch."""

from __future__ import annotations

import pytest
import torch
from support import TINY_PRESETS, padded_batch

import zoo

ENCODER_DECODERS = [name for name in TINY_PRESETS if zoo.preset(name).family == "encoder-decoder"]
DECODERS = [name for name in TINY_PRESETS if zoo.preset(name).family == "decoder"]


def _outputs(model, ids, mask, dec=None, dec_mask=None):
    if model.spec.family == "encoder-decoder":
        out = model(ids, attention_mask=mask, decoder_input_ids=dec, decoder_attention_mask=dec_mask)
    else:
        out = model(ids, attention_mask=mask)
    return out.logits if out.logits is not None else out.last_hidden_state


@pytest.mark.parametrize("name", TINY_PRESETS)
def test_padding_does_not_change_real_positions(name):
    model = zoo.build(name).eval()
    V = model.spec.vocab_size
    ids, mask = padded_batch(V, [9, 5])
    dec, dec_mask = padded_batch(V, [7, 4])
    batched = _outputs(model, ids, mask, dec, dec_mask)
    alone = _outputs(model, ids[1:, :5], mask[1:, :5], dec[1:, :4], dec_mask[1:, :4])
    real = 4 if model.spec.family == "encoder-decoder" else 5
    torch.testing.assert_close(batched[1, :real], alone[0, :real], atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", DECODERS)
def test_left_padding_does_not_change_a_decoder_prompt(name):
    model = zoo.build(name).eval()
    ids, _ = padded_batch(model.spec.vocab_size, [6])
    left = torch.cat([torch.zeros(1, 3, dtype=torch.long), ids], dim=1)
    left_mask = torch.tensor([[0, 0, 0] + [1] * 6])
    torch.testing.assert_close(
        _outputs(model, left, left_mask)[0, 3:], _outputs(model, ids, None)[0], atol=1e-5, rtol=0
    )


@pytest.mark.parametrize("name", DECODERS + ENCODER_DECODERS)
def test_future_decoder_tokens_never_change_earlier_outputs(name):
    model = zoo.build(name).eval()
    V = model.spec.vocab_size
    src, src_mask = padded_batch(V, [6])
    target = torch.randint(3, V, (1, 8))
    changed = target.clone()
    changed[0, 5:] = torch.randint(3, V, (3,))
    if model.spec.family == "encoder-decoder":
        before, after = (_outputs(model, src, src_mask, t, None) for t in (target, changed))
    else:
        before, after = (_outputs(model, t, None) for t in (target, changed))
    torch.testing.assert_close(before[0, :5], after[0, :5], atol=1e-6, rtol=0)
    assert not torch.allclose(before[0, 5:], after[0, 5:])


def test_encoder_sees_the_future():
    model = zoo.build("bert-tiny").eval()
    ids = torch.randint(5, 500, (1, 8))
    changed = ids.clone()
    changed[0, -1] = 4
    assert not torch.allclose(_outputs(model, ids, None)[0, 0], _outputs(model, changed, None)[0, 0])


def test_loss_averages_over_real_tokens_only():
    """Dividing the masked loss by every position, padding included, is a common slip; zoo must not."""
    model = zoo.build("gpt2-tiny").eval()
    ids, mask = padded_batch(model.spec.vocab_size, [8, 4])
    labels = ids.masked_fill(mask == 0, -100)
    out = model(ids, attention_mask=mask, labels=labels)
    logits, targets = out.logits[:, :-1], labels[:, 1:]
    real = targets != -100
    per_token = torch.nn.functional.cross_entropy(logits[real], targets[real], reduction="sum")
    torch.testing.assert_close(out.loss, per_token / real.sum())
    # Changing the logits the padding sees must not move the loss.
    more_padding = torch.cat([ids, torch.zeros(2, 3, dtype=torch.long)], dim=1)
    padded_labels = torch.cat([labels, torch.full((2, 3), -100)], dim=1)
    padded_mask = torch.cat([mask, torch.zeros(2, 3, dtype=torch.long)], dim=1)
    torch.testing.assert_close(
        model(more_padding, attention_mask=padded_mask, labels=padded_labels).loss, out.loss
    )


def test_position_tables_are_sized_by_max_positions_not_vocab():
    """Sizing the positional table by the vocabulary is a common slip; zoo sizes it by the longest sequence."""
    model = zoo.build("transformer-tiny")
    spec = model.spec
    assert model.encoder.positions.table.shape == (spec.max_positions, spec.d_model)
    assert spec.max_positions != spec.vocab_size


def test_positions_are_added_not_concatenated():
    model = zoo.build("transformer-tiny").eval()
    ids = torch.randint(3, 9000, (1, 5))
    stack = model.encoder
    x = model.embed(ids)
    expected = x + stack.positions(torch.arange(5)[None])
    captured = {}
    hook = stack.layers[0].register_forward_pre_hook(lambda module, args: captured.update(x=args[0]))
    model.encode(ids)
    hook.remove()
    assert captured["x"].shape == (1, 5, spec_width := model.spec.d_model) and spec_width == x.shape[-1]
    torch.testing.assert_close(captured["x"], expected)


def test_tied_output_reuses_the_embedding_matrix():
    model = zoo.build("transformer-tiny")
    assert "lm_head.weight" not in model.state_dict()
    assert model.lm_head.output_weight is model.embed.tokens.weight
    untied = zoo.build("llama-tiny")
    assert "lm_head.weight" in untied.state_dict()


def test_albert_shares_one_layer():
    spec = zoo.preset("albert-base").override(d_model=64, num_layers=3, vocab_size=100, max_positions=32,
                                              **{"attention.num_heads": 4, "ffn.d_ff": 32, "embedding.factorized_dim": 16})  # fmt: skip
    model = zoo.build(spec)
    assert len(model.encoder.layers) == 1 and model.encoder.num_layers == 3
    assert model.embed.tokens.weight.shape == (100, 16) and model.encoder.embed_proj.weight.shape == (64, 16)
    out = model(torch.randint(0, 100, (2, 7)))
    assert out.logits.shape == (2, 7, 100)


def _loss(model, batch):
    if model.spec.family == "encoder-decoder":
        return model(batch["ids"], attention_mask=batch["mask"], labels=batch["labels"]).loss
    return model(batch["ids"], attention_mask=batch["mask"], labels=batch["labels"]).loss


@pytest.mark.parametrize("name", ["bert-tiny", "gpt2-tiny", "t5-tiny"])
def test_tiny_model_overfits_a_fixed_batch(name):
    spec = zoo.preset(name).override(dropout=0.0)
    model = zoo.build(spec)
    V = spec.vocab_size
    ids, mask = padded_batch(V, [12, 9, 7, 12])
    labels = ids.masked_fill(mask == 0, -100)
    if spec.family == "encoder-decoder":
        labels, _ = padded_batch(V, [10, 6, 8, 10])
        labels = labels.masked_fill(labels == 0, -100)
    batch = {"ids": ids, "mask": mask, "labels": labels}
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    start = _loss(model, batch).item()
    for _ in range(200):
        optimizer.zero_grad()
        loss = _loss(model, batch)
        loss.backward()
        optimizer.step()
        if loss.item() < 0.1 * start:
            break
    assert loss.item() < 0.1 * start, f"{name}: loss {loss.item():.3f} from {start:.3f}"
