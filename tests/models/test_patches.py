"""The image front-end (embedding.kind: patches): spec rules, pixel_values checks, the patch embedding and
its interpolated positions against transformers' ViTEmbeddings, and the image-classification head."""

from __future__ import annotations

import pytest
import torch

import zoo
from zoo.spec import SpecValidationError, parse_spec

TINY = {
    "family": "encoder",
    "d_model": 32,
    "num_layers": 2,
    "attention": {"num_heads": 4},
    "ffn": {"d_ff": 64, "activation": "gelu"},
    "position": {"kind": "none"},
    "dropout": 0.0,
    "embedding": {"kind": "patches", "image_size": 8, "patch_size": 2, "channels": 3},
    "heads": {"classifier": {"task": "image", "num_labels": 5}},
}


def _spec(**changes: object) -> dict:
    spec = {**TINY, **changes}
    return spec


def test_a_token_spec_dumps_without_kind_and_reads_back_the_same() -> None:
    spec = (
        zoo.preset("bert-tiny") if "bert-tiny" in zoo.spec.list_presets() else parse_spec({"vocab_size": 10})
    )
    assert "kind" not in spec.model_dump()["embedding"]
    assert parse_spec(spec.model_dump()) == spec


def test_an_image_spec_needs_no_vocabulary_and_round_trips() -> None:
    spec = parse_spec(TINY)
    assert (spec.vocab_size, spec.pad_token_id) == (1, None)
    assert spec.embedding.num_tokens == 17
    assert parse_spec(spec.model_dump(mode="json")) == spec


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"vocab_size": 100}, "has no vocabulary"),
        ({"heads": {"mlm": {}}}, "heads.mlm scores tokens"),
        (
            {"heads": {"classifier": {"task": "sequence", "num_labels": 2, "pooling": "first_token"}}},
            "use task: image",
        ),
        ({"embedding": {"kind": "patches", "image_size": 10, "patch_size": 4}}, "multiple of patch_size"),
        (
            {"embedding": {"kind": "patches", "image_size": 8, "patch_size": 2, "class_token": False}},
            "class_token",
        ),
        ({"embedding": {"kind": "pixels"}}, "kind must be 'tokens' or 'patches'"),
    ],
)
def test_spec_refuses_what_an_image_front_end_cannot_do(changes: dict, message: str) -> None:
    with pytest.raises(SpecValidationError, match=message):
        parse_spec(_spec(**changes))


def test_only_an_encoder_takes_an_image_front_end() -> None:
    with pytest.raises(SpecValidationError, match=r"'patches' .* is for encoder models"):
        parse_spec({"family": "decoder", "vocab_size": 10, "embedding": TINY["embedding"]})


def test_an_image_classifier_needs_an_image_front_end() -> None:
    with pytest.raises(SpecValidationError, match="needs an image front-end"):
        parse_spec(
            {
                "family": "encoder",
                "vocab_size": 10,
                "heads": {"classifier": {"task": "image", "num_labels": 2}},
            }
        )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"pixel_values": torch.randn(1, 8, 8)}, r"for one image pass pixel_values\[None\]"),
        ({"pixel_values": torch.randn(1, 1, 8, 8)}, "has 1 channels .* takes 3 .embedding.channels"),
        ({"pixel_values": torch.zeros(1, 3, 8, 8, dtype=torch.uint8)}, "must be floats"),
        ({"pixel_values": torch.randn(1, 3, 16, 16)}, "are 16x16 images, the model takes 8x8"),
        (
            {"pixel_values": torch.randn(1, 3, 9, 8), "interpolate_pos_encoding": True},
            "multiples of patch_size",
        ),
        ({"input_ids": torch.zeros(1, 4, dtype=torch.long)}, "input_ids is for token inputs"),
        ({}, "pixel_values .* is required"),
        ({"pixel_values": torch.randn(2, 3, 8, 8), "labels": torch.tensor([0, 7])}, "labels contains 7"),
    ],
)
def test_bad_image_inputs_are_one_line_errors(kwargs: dict, message: str) -> None:
    model = zoo.build(TINY)
    with pytest.raises(ValueError, match=message):
        model(**kwargs)


def test_a_token_model_refuses_pixel_values() -> None:
    model = zoo.build(
        {"family": "encoder", "vocab_size": 10, "d_model": 16, "num_layers": 1, "attention": {"num_heads": 2}}
    )
    with pytest.raises(ValueError, match="pixel_values is for an image front-end"):
        model(torch.zeros(1, 3, dtype=torch.long), pixel_values=torch.randn(1, 3, 8, 8))
    with pytest.raises(ValueError, match="interpolate_pos_encoding is for an image front-end"):
        model(torch.zeros(1, 3, dtype=torch.long), interpolate_pos_encoding=True)


def _hf_embeddings(model):
    from transformers import ViTConfig
    from transformers.models.vit.modeling_vit import ViTEmbeddings

    config = ViTConfig(hidden_size=32, image_size=8, patch_size=2, num_channels=3, hidden_dropout_prob=0.0)
    hf = ViTEmbeddings(config).eval()
    with torch.no_grad():
        hf.cls_token.copy_(model.embed.cls_token)
        hf.position_embeddings.copy_(model.embed.positions)
        hf.patch_embeddings.projection.weight.copy_(model.embed.proj.weight)
        hf.patch_embeddings.projection.bias.copy_(model.embed.proj.bias)
    return hf


@pytest.mark.parametrize("size", [(8, 8), (12, 12), (6, 10)])
def test_patch_embedding_and_interpolated_positions_equal_transformers(size: tuple[int, int]) -> None:
    pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = zoo.build(TINY).eval()
    hf = _hf_embeddings(model)
    pixels = torch.randn(2, 3, *size)
    with torch.no_grad():
        want = hf(pixels, interpolate_pos_encoding=size != (8, 8))
        got = model.embed(pixels, interpolate_pos_encoding=size != (8, 8))
    assert got.shape == want.shape == (2, 1 + size[0] * size[1] // 4, 32)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)


def test_mean_pooling_leaves_the_class_token_out() -> None:
    model = zoo.build(
        _spec(heads={"classifier": {"task": "image", "num_labels": 5, "pooling": "mean"}})
    ).eval()
    hidden = torch.randn(2, 17, 32)
    hidden_other_cls = hidden.clone()
    hidden_other_cls[:, 0] += 5.0
    head = model.classifier
    torch.testing.assert_close(head(hidden), head(hidden_other_cls))
    torch.testing.assert_close(head(hidden), head.out_proj(hidden[:, 1:].mean(dim=1)))


def test_an_image_classifier_trains() -> None:
    torch.manual_seed(0)
    model = zoo.build(TINY)
    pixels, labels = torch.randn(8, 3, 8, 8), torch.arange(8) % 5
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    first = None
    for _ in range(40):
        loss = model(pixel_values=pixels, labels=labels).loss
        first = first if first is not None else loss.item()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert loss.item() < first / 3


def test_save_and_load_keep_an_image_model(tmp_path) -> None:
    torch.manual_seed(0)
    model = zoo.build("vit-tiny").eval()
    zoo.save(model, tmp_path / "vit")
    loaded = zoo.load(tmp_path / "vit").eval()
    assert loaded.spec == model.spec
    pixels = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        assert torch.equal(loaded(pixel_values=pixels).logits, model(pixel_values=pixels).logits)


def test_zoo_show_counts_the_vit_preset(capsys) -> None:
    import json

    from zoo.cli import main

    assert main(["show", "vit-base-patch16-224", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["settings"]["seq_len"] == 197  # one 224x224 image: 196 patches and the class token
    counts = data["parameters"]
    assert counts["total"] == 86_567_656
    assert counts["embedding"] == 197 * 768 + 768  # the position table and the class token
    assert counts["head"] == 768 * 1000 + 1000  # the classifier alone


def test_lora_adapts_an_image_model_like_any_encoder() -> None:
    import zoo.lora

    torch.manual_seed(0)
    model = zoo.build("vit-tiny")
    zoo.lora.apply(model, r=4)
    loss = model(pixel_values=torch.randn(2, 3, 8, 8), labels=torch.tensor([1, 2])).loss
    loss.backward()
    trained = {name for name, p in model.named_parameters() if p.grad is not None}
    assert trained and all("lora" in name for name in trained)
