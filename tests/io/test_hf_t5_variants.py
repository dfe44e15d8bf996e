"""Hugging Face interop for T5's relatives: mT5 (T5 v1.1's layout under ``model_type: mt5``) and umT5
(mT5 with a relative bias table in every layer, ``position.per_layer``).

Small random transformers models, every option off its default (d_kv apart from d_model / heads, more
decoder layers, bucket count and distance, eps, the FFN activation, a tied or an own head), are saved with
``save_pretrained`` and imported with `zoo.from_hf`: logits equal on right-padded source and decoder
batches, greedy ``generate`` token for token. zoo models go back out with `zoo.to_hf` and must load in
transformers with nothing missing or unexpected and the same logits. Nothing is downloaded.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

import zoo
from zoo.io.hf import t5
from zoo.io.hf.faithful import faithful_config

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

V = 96
SIZES = dict(
    vocab_size=V, d_model=32, d_kv=6, d_ff=40, num_layers=2, num_decoder_layers=3, num_heads=4,
    relative_attention_num_buckets=12, relative_attention_max_distance=24, layer_norm_epsilon=1e-5,
    pad_token_id=0, eos_token_id=1, decoder_start_token_id=0,
)  # fmt: skip
MAPPINGS = {m.model_types[0]: m for m in t5.MAPPINGS}


def _mt5(**extra: object) -> nn.Module:
    return transformers.MT5ForConditionalGeneration(transformers.MT5Config(**SIZES, **extra))


def _umt5(**extra: object) -> nn.Module:
    return transformers.UMT5ForConditionalGeneration(transformers.UMT5Config(**SIZES, **extra))


# name -> (transformers model, whether the head is its own tensor)
HF_MODELS: dict[str, tuple[Callable[[], nn.Module], bool]] = {
    "mt5": (lambda: _mt5(), False),
    "mt5-own-head": (lambda: _mt5(feed_forward_proj="gated-silu"), True),
    "mt5-relu": (lambda: _mt5(feed_forward_proj="relu"), True),
    "umt5": (lambda: _umt5(tie_word_embeddings=False), True),  # umt5-small's head: its own, not rescaled
    "umt5-tied": (lambda: _umt5(feed_forward_proj="gated-relu"), False),  # tied and rescaled, as T5 v1.0
}


@torch.no_grad()
def lively(model: nn.Module, *, own_head: bool) -> nn.Module:
    """Weights large enough that outputs depend on the context, norms off their 1s, the bias tables off 0,
    and (``own_head``) a head that is not the embedding table."""
    torch.manual_seed(0)
    for name, param in model.named_parameters():
        if param.dim() >= 2:
            param.normal_(0.0, 1.0 if "shared" in name or "relative" in name else 2.0 / math.sqrt(32))
        else:
            param.uniform_(0.5, 1.5)
    if own_head:
        model.lm_head.weight = nn.Parameter(torch.randn(V, 32))
    return model.eval()


def save(name: str, path: Path) -> nn.Module:
    build, own_head = HF_MODELS[name]
    model = lively(build(), own_head=own_head)
    model.save_pretrained(path)
    return model


def batches() -> tuple[torch.Tensor, ...]:
    """Right-padded sources (lengths 7, 4) and decoder inputs (5, 3), padded with the pad id."""
    g = torch.Generator().manual_seed(3)
    src_mask = torch.tensor([[1] * 7, [1] * 4 + [0] * 3])
    tgt_mask = torch.tensor([[1] * 5, [1] * 3 + [0] * 2])
    src = torch.randint(2, V, (2, 7), generator=g) * src_mask
    tgt = torch.randint(2, V, (2, 5), generator=g) * tgt_mask
    return src, src_mask, tgt, tgt_mask


@torch.no_grad()
def assert_same_logits(model: zoo.ZooModel, hf: nn.Module) -> None:
    src, src_mask, tgt, tgt_mask = batches()
    theirs = hf(
        input_ids=src, attention_mask=src_mask, decoder_input_ids=tgt, decoder_attention_mask=tgt_mask
    )
    ours = model(src, attention_mask=src_mask, decoder_input_ids=tgt, decoder_attention_mask=tgt_mask)
    for mine, reference, mask in (
        (ours.encoder_last_hidden_state, theirs.encoder_last_hidden_state, src_mask),
        (ours.logits, theirs.logits, tgt_mask),
    ):
        real = mask.bool()
        assert reference[real].abs().max() > 1e-2  # a real signal
        torch.testing.assert_close(mine[real], reference[real], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("name", list(HF_MODELS))
def test_imported_model_gives_transformers_logits_and_greedy_tokens(name: str, tmp_path: Path) -> None:
    hf = save(name, tmp_path)
    model = zoo.from_hf(tmp_path)
    assert_same_logits(model, hf)
    src, src_mask, _, _ = batches()
    config = transformers.GenerationConfig(
        do_sample=False, num_beams=1, max_new_tokens=8, min_new_tokens=0, eos_token_id=1, pad_token_id=0,
        decoder_start_token_id=0, forced_bos_token_id=None, forced_eos_token_id=None,
        use_cache=False,  # transformers sizes its cache by the encoder's depth: 2 layers, the decoder has 3
    )  # fmt: skip
    hf.generation_config = config  # no saved default can leak in
    with torch.no_grad():
        theirs = hf.generate(src, attention_mask=src_mask, generation_config=config)
    ours = model.generate(src, attention_mask=src_mask, max_new_tokens=8)
    assert len(set(ours[:, 1:].flatten().tolist())) > 3  # the context matters: not one token repeated
    assert torch.equal(ours, theirs)


def test_mt5_import_reads_t5_v1_1_wiring_and_never_rescales(tmp_path: Path) -> None:
    save("mt5", tmp_path / "tied")
    save("mt5-own-head", tmp_path / "own")
    tied, own = zoo.from_hf(tmp_path / "tied").spec, zoo.from_hf(tmp_path / "own").spec
    assert (tied.ffn.activation, tied.ffn.gated, tied.lm_head.tied, tied.lm_head.rescale_tied) == (
        "gelu_tanh", True, True, False,
    )  # fmt: skip
    assert (own.ffn.activation, own.lm_head.tied, own.lm_head.rescale_tied) == ("silu", False, False)
    assert (tied.attention.head_dim, tied.norm.eps, tied.stacks()["decoder"].num_layers) == (6, 1e-5, 3)


@pytest.mark.parametrize("name", list(HF_MODELS))
def test_to_hf_loads_in_transformers_with_nothing_missing_and_same_logits(name: str, tmp_path: Path) -> None:
    save(name, tmp_path / "source")
    spec = zoo.from_hf(tmp_path / "source").spec
    model = zoo.build(spec)
    with torch.no_grad():  # its own weights: norms off their 1s
        for param in model.parameters():
            param.add_(torch.randn_like(param) * (0.1 if param.dim() == 1 else 0.5))
    model_type = name.split("-")[0]
    zoo.to_hf(model.eval(), tmp_path / "export", model_type=model_type)
    config = json.loads((tmp_path / "export" / "config.json").read_text())
    assert (config["model_type"], config["architectures"]) == (
        model_type, [{v.model_type: v.architecture for v in (t5.T5, t5.MT5, t5.UMT5)}[model_type]],
    )  # fmt: skip
    hf, info = transformers.AutoModelForSeq2SeqLM.from_pretrained(
        tmp_path / "export", output_loading_info=True
    )
    assert [sorted(info[k]) for k in ("missing_keys", "unexpected_keys", "mismatched_keys")] == [[], [], []]
    assert type(hf).__name__ == config["architectures"][0]
    assert_same_logits(model, hf.eval())


def test_mt5_export_refuses_the_rescaled_tied_head() -> None:
    spec = zoo.preset("t5-small")  # T5 v1.0: tied and rescaled, which transformers' mT5 never does
    with pytest.raises(ValueError, match=r"mt5 cannot express lm_head\.rescale_tied=True"):
        faithful_config(MAPPINGS["mt5"], spec)
    assert MAPPINGS["t5"].spec_to_config(spec)["model_type"] == "t5"


@pytest.mark.parametrize("model_type", ["mt5", "umt5"])
def test_defaults_are_the_config_classs_defaults(model_type: str) -> None:
    spec = MAPPINGS[model_type].config_to_spec({"model_type": model_type}, set())
    reference = {"mt5": transformers.MT5Config, "umt5": transformers.UMT5Config}[model_type]()
    assert (spec.vocab_size, spec.num_layers, spec.attention.num_heads, spec.ffn.d_ff) == (
        reference.vocab_size, reference.num_layers, reference.num_heads, reference.d_ff,
    )  # fmt: skip
    assert (spec.ffn.activation, spec.ffn.gated) == ("gelu_tanh", True)


@pytest.mark.parametrize(
    ("preset", "config_class", "count"),
    [("mt5-small", "MT5Config", 300_176_768), ("umt5-small", "UMT5Config", 306_601_984)],
)
def test_preset_has_the_published_shape_and_parameter_count(
    preset: str, config_class: str, count: int
) -> None:
    """The published config.json (google/mt5-small, google/umt5-small): transformers' model built from it on the meta device
    has the same tensors (names and sizes) and parameter count. transformers 5.x ties the head in the model
    it builds and unties it when a checkpoint stores its own, so its tensors are counted, not its parameters."""
    spec = zoo.preset(preset)
    mapping = MAPPINGS[preset.split("-")[0]]
    config = getattr(transformers, config_class)(**mapping.spec_to_config(spec))
    with torch.device("meta"):
        hf = transformers.AutoModelForSeq2SeqLM.from_config(config)
    model = zoo.build(spec, device="meta")
    names = set(mapping.zoo_to_hf(zoo.build(spec, device="meta", init=False).state_dict(), spec))
    theirs = {n: t for n, t in hf.state_dict().items() if "embed_tokens" not in n}  # aliases of shared
    assert names == set(theirs)
    assert model.num_parameters() == sum(t.numel() for t in theirs.values()) == count
    back = mapping.config_to_spec(mapping.spec_to_config(spec), names)
    unsaid = {"source": True, "name": True, "attention": {"dropout"}, "ffn": {"dropout"}}
    assert back.model_dump(exclude=unsaid) == spec.model_dump(exclude=unsaid)


def test_umt5_import_reads_every_layers_bias_table(tmp_path: Path) -> None:
    hf = save("umt5", tmp_path)
    model = zoo.from_hf(tmp_path)
    assert model.spec.position.per_layer and not model.spec.lm_head.rescale_tied
    for side, stack in (("encoder", hf.encoder), ("decoder", hf.decoder)):
        theirs = torch.stack(
            [block.layer[0].SelfAttention.relative_attention_bias.weight for block in stack.block]
        )
        ours = getattr(model, side).positions.weight  # (L, buckets, H)
        assert ours.shape == (len(stack.block), 12, 4) and torch.equal(ours, theirs)
        assert not torch.equal(ours[0], ours[1])  # each layer its own


def test_umt5_tied_config_rescales_the_head(tmp_path: Path) -> None:
    save("umt5-tied", tmp_path)
    head = zoo.from_hf(tmp_path).spec.lm_head
    assert (head.tied, head.rescale_tied) == (True, True)


@pytest.mark.parametrize(
    ("model_type", "change", "field"),
    [
        ("t5", {"position": {"kind": "relative_bias", "per_layer": True}}, "position.per_layer"),
        ("umt5", {}, "position.per_layer"),
        (
            "umt5",
            {
                "position": {"kind": "relative_bias", "per_layer": True},
                "decoder": {"position": {"kind": "relative_bias"}},
            },
            "decoder.position.per_layer",
        ),
        ("mt5", {"position": {"kind": "relative_bias", "per_layer": True}}, "position.per_layer"),
    ],
)
def test_to_hf_names_the_bias_tables_a_variant_cannot_express(model_type, change, field) -> None:
    spec = zoo.preset("mt5-small").override(vocab_size=512, **change)
    with pytest.raises(ValueError, match=rf"{model_type} cannot express {re.escape(field)}="):
        faithful_config(MAPPINGS[model_type], spec)


def test_to_hf_without_model_type_writes_per_layer_tables_as_umt5(tmp_path: Path) -> None:
    spec = zoo.preset("t5-tiny").override(position={"kind": "relative_bias", "per_layer": True})
    zoo.to_hf(zoo.build(spec), tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "umt5"
