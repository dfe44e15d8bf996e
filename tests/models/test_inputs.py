"""A model's forward (and encode/decode) checks its arguments as generate does: one ValueError naming the
argument and what was expected, before any compute; valid inputs give the same outputs as the unchecked
modules; meta, FakeTensor and torch.compile forwards still run."""

from __future__ import annotations

import pytest
import torch
from support import TINY_PRESETS

import zoo
from zoo.models.inputs import check_labels, check_tokens


def guarded(name: str) -> zoo.ZooModel:
    """A tiny model whose every block fails the test if it runs (so errors must come first)."""
    model = zoo.build(name).eval()

    def refuse(*_):
        raise AssertionError("the model computed before its arguments were checked")

    for module in model.children():
        module.register_forward_pre_hook(refuse)
    return model


def call(model: zoo.ZooModel, ids, mask=None, **kwargs):
    if (
        model.spec.family == "encoder-decoder"
        and "decoder_input_ids" not in kwargs
        and "labels" not in kwargs
    ):
        kwargs["decoder_input_ids"] = torch.tensor([[1, 5, 6], [1, 7, 8]])
    return model(ids, attention_mask=mask, **kwargs)


IDS = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 0]])
MASK = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]])


def bad_calls(model: zoo.ZooModel) -> list[tuple[dict, str]]:
    spec = model.spec
    vocab = getattr(model, "input_vocab_size", spec.vocab_size)
    P = spec.max_positions
    return [
        ({"ids": torch.tensor([[5, vocab]])}, rf"input_ids contains token id {vocab}, outside the vocabulary \[0, {vocab}\)"),
        ({"ids": torch.tensor([[-1, 5]])}, r"input_ids contains token id -1, outside the vocabulary"),
        ({"ids": torch.tensor([5, 6, 7])}, r"input_ids must be a \(batch, length\) tensor of token ids, got \(3,\); for one sequence pass input_ids\[None\]"),
        ({"ids": torch.zeros(1, 2, 3, dtype=torch.long)}, r"input_ids must be a \(batch, length\) tensor"),
        ({"ids": [[5, 6]]}, r"input_ids must be a \(batch, length\) tensor of token ids, got list"),
        ({"ids": torch.tensor([[5.0, 6.0]])}, r"input_ids must hold integer token ids, got dtype torch.float32"),
        ({"ids": torch.full((1, P + 1), 5)}, rf"input_ids has {P + 1} positions, more than the model's max_positions \({P}\)"),
        ({"mask": torch.ones(2, 3, dtype=torch.long)}, r"attention_mask must have shape \(batch, length\) = \(2, 4\), like input_ids; got \(2, 3\)"),
        ({"mask": torch.ones(4, dtype=torch.long)}, r"attention_mask must have shape .* got \(4,\)"),
        ({"mask": MASK.float()}, r"attention_mask must be bool or integer \(1 = token, 0 = padding\), got dtype torch.float32"),
        ({"mask": MASK * 2}, r"attention_mask must hold only 0 \(padding\) and 1 \(token\), got 2"),
        ({"mask": MASK - 1}, r"attention_mask must hold only 0 \(padding\) and 1 \(token\), got -1"),
    ]  # fmt: skip


CASES = [(name, index) for name in TINY_PRESETS for index in range(12)]


@pytest.mark.parametrize(("name", "index"), CASES)
def test_bad_inputs_raise_before_any_compute(name, index):
    model = guarded(name)
    changes, message = bad_calls(model)[index]
    ids, mask = changes.get("ids", IDS), changes.get("mask", MASK)
    if model.spec.family == "encoder-decoder" and isinstance(ids, torch.Tensor) and ids.dim() == 2:
        kwargs = {"decoder_input_ids": torch.full((ids.shape[0], 3), 5)}
    else:
        kwargs = {}
    with pytest.raises(ValueError, match=message):
        call(model, ids, mask, **kwargs)


@pytest.mark.parametrize("name", TINY_PRESETS)
def test_bad_labels_raise_before_any_compute(name):
    model = guarded(name)
    V = model.spec.vocab_size
    if model.spec.family == "encoder" and model.spec.heads.mlm is None:
        pytest.skip("no head reads labels")
    target = IDS if model.spec.family != "encoder-decoder" else torch.full((2, 3), 5)
    kwargs = {"decoder_input_ids": target} if model.spec.family == "encoder-decoder" else {}
    bad = target.clone()
    bad[0, 1] = V
    with pytest.raises(ValueError, match=rf"labels contains {V}, outside \[0, {V}\) and not -100"):
        call(model, IDS, MASK, labels=bad, **kwargs)
    with pytest.raises(ValueError, match=r"labels must have shape \(2, \d\)"):
        call(model, IDS, MASK, labels=target[:, :2], **kwargs)
    with pytest.raises(ValueError, match="labels must hold integer class ids"):
        call(model, IDS, MASK, labels=target.float(), **kwargs)


@pytest.mark.parametrize("name", [n for n in TINY_PRESETS if zoo.preset(n).family == "encoder-decoder"])
def test_encoder_decoder_checks_the_target_side_too(name):
    model = guarded(name)
    V, P = model.spec.vocab_size, model.spec.max_positions
    target = torch.full((2, 3), 5)
    cases = [
        (dict(decoder_input_ids=torch.tensor([[1, V, 5], [1, 5, 5]])), rf"decoder_input_ids contains token id {V}"),
        (dict(decoder_input_ids=torch.full((2, P + 1), 5)), rf"decoder_input_ids has {P + 1} positions"),
        (dict(decoder_input_ids=torch.full((3, 3), 5)), r"decoder_input_ids has 3 rows and input_ids 2"),
        (dict(decoder_input_ids=torch.tensor([5, 6])), r"decoder_input_ids must be a \(batch, length\) tensor"),
        (dict(decoder_input_ids=target, decoder_attention_mask=torch.ones(2, 4, dtype=torch.long)),
         r"decoder_attention_mask must have shape \(batch, length\) = \(2, 3\), like decoder_input_ids"),
        (dict(decoder_input_ids=target, decoder_attention_mask=torch.full((2, 3), 3)),
         r"decoder_attention_mask must hold only 0 \(padding\) and 1 \(token\), got 3"),
        (dict(labels=torch.tensor([5, 6])), r"labels must have shape \(2, length\), like input_ids; got \(2,\)"),
    ]  # fmt: skip
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=message):
            model(IDS, attention_mask=MASK, **kwargs)
    with pytest.raises(ValueError, match=r"EncoderDecoderModel.encode: input_ids contains token id"):
        model.encode(torch.tensor([[5, model.input_vocab_size]]))
    memory = torch.zeros(2, 4, model.spec.d_model)
    with pytest.raises(ValueError, match=r"EncoderDecoderModel.decode: memory must be the encoder output"):
        model.decode(target, memory=memory[:1])
    with pytest.raises(
        ValueError, match=r"memory_mask must have shape \(batch, length\) = \(2, 4\), like memory"
    ):
        model.decode(target, memory=memory, memory_mask=MASK[:, :3])


def test_encoder_checks_segment_ids_and_classification_labels():
    model = guarded("bert-tiny")
    with pytest.raises(ValueError, match=r"token_type_ids contains segment id 2, outside \[0, 2\)"):
        model(IDS, MASK, token_type_ids=torch.full_like(IDS, 2))
    with pytest.raises(
        ValueError, match=r"token_type_ids must have shape \(2, 4\), like input_ids; got \(2, 3\)"
    ):
        model(IDS, MASK, token_type_ids=torch.zeros(2, 3, dtype=torch.long))
    classifier = zoo.build(zoo.preset("bert-tiny").override(heads={"num_labels": 3, "mlm": None}))
    with pytest.raises(ValueError, match=r"labels contains 3, outside \[0, 3\)"):
        classifier(IDS, MASK, labels=torch.tensor([0, 3]))
    with pytest.raises(
        ValueError, match=r"labels must have shape \(2,\), like one label per row; got \(2, 4\)"
    ):
        classifier(IDS, MASK, labels=IDS)


def test_a_cached_decoder_step_counts_the_cache_in_the_mask_and_positions():
    from zoo.generation.cache import KVCache

    model = guarded("gpt2-tiny")
    P = model.spec.max_positions
    cache = KVCache.for_stack(model.decoder, batch_size=2, max_length=P)
    cache.length = 2  # as if a 2-token prompt were cached
    with pytest.raises(
        ValueError, match=r"attention_mask must have shape \(batch, cached \+ length\) = \(2, 5\)"
    ):
        model(IDS[:, :3], attention_mask=MASK[:, :3], cache=cache)
    cache.length = P - 2
    with pytest.raises(ValueError, match=rf"input_ids has {P - 2} cached \+ 3 new positions, more than"):
        model(IDS[:, :3], cache=cache)


def unchecked(model: zoo.ZooModel, ids, mask, dec=None, dec_mask=None) -> torch.Tensor:
    """The last hidden state computed by the model's blocks directly, past every check."""
    if model.spec.family == "encoder-decoder":
        memory = model.encoder(model.embed(ids), attention_mask=mask).hidden
        return model.decoder(
            model.embed(dec), attention_mask=dec_mask, memory=memory, memory_mask=mask
        ).hidden
    stack = model.encoder if model.spec.family == "encoder" else model.decoder
    return stack(model.embed(ids), attention_mask=mask).hidden


@pytest.mark.parametrize("name", TINY_PRESETS)
def test_valid_inputs_give_the_same_outputs_as_the_unchecked_blocks(name):
    model = zoo.build(name).eval()
    V = model.spec.vocab_size
    ids, mask = torch.randint(3, V, (2, 6)), torch.tensor([[1] * 6, [1] * 4 + [0] * 2])
    dec, dec_mask = torch.randint(3, V, (2, 5)), torch.tensor([[1] * 5, [1] * 3 + [0] * 2])
    for m in (mask, mask.bool(), None):
        with torch.no_grad():
            if model.spec.family == "encoder-decoder":
                out = model(ids, attention_mask=m, decoder_input_ids=dec, decoder_attention_mask=dec_mask)
                expected = unchecked(model, ids, m, dec, dec_mask)
            else:
                out = model(ids, attention_mask=m)
                expected = unchecked(model, ids, m)
        assert torch.equal(out.last_hidden_state, expected)


@pytest.mark.parametrize("name", TINY_PRESETS)
def test_meta_and_fake_tensor_forwards_skip_the_value_checks(name):
    from torch._subclasses.fake_tensor import FakeTensorMode

    dec = {"decoder_input_ids": None}
    meta = zoo.build(name, device="meta")
    ids = torch.zeros(2, 7, dtype=torch.long, device="meta")
    if meta.spec.family == "encoder-decoder":
        dec["decoder_input_ids"] = ids[:, :5]
    kwargs = {k: v for k, v in dec.items() if v is not None}
    assert meta(ids, **kwargs).last_hidden_state.device.type == "meta"
    model = zoo.build(name).eval()
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fake = mode.from_tensor(torch.randint(3, 100, (2, 7)))
        kwargs = {"decoder_input_ids": fake[:, :5]} if model.spec.family == "encoder-decoder" else {}
        out = model(fake, **kwargs)
    assert out.last_hidden_state.shape[:2] == (2, 5 if kwargs else 7)


@pytest.mark.parametrize("name", ["gpt2-tiny", "t5-tiny"])
def test_a_compiled_forward_gives_the_eager_outputs_and_still_checks_shapes(name):
    model = zoo.build(name).eval()
    compiled = torch.compile(model, backend="aot_eager", dynamic=False)
    ids, mask = torch.randint(3, 100, (2, 6)), torch.tensor([[1] * 6, [1] * 4 + [0] * 2])
    kwargs = {"decoder_input_ids": ids[:, :4]} if model.spec.family == "encoder-decoder" else {}
    with torch.no_grad():
        expected = model(ids, attention_mask=mask, **kwargs).last_hidden_state
        assert torch.equal(compiled(ids, attention_mask=mask, **kwargs).last_hidden_state, expected)
        with pytest.raises(ValueError, match="attention_mask must have shape"):
            compiled(ids, attention_mask=mask[:, :5], **kwargs)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_checks_of_valid_cuda_inputs_never_sync_with_the_host():
    ids = torch.randint(0, 100, (4, 16), device="cuda")
    mask = torch.ones(4, 16, dtype=torch.long, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        check_tokens(ids, mask, where="test", vocab_size=100, max_positions=64)
        check_labels(ids, where="test", shape=(4, 16), num_classes=100, like="input_ids")
    finally:
        torch.cuda.set_sync_debug_mode("default")
