"""CLIP and SigLIP: parity with transformers' CLIPModel / SiglipModel both ways, on small random configs.

Hugging Face's input names (input_ids, pixel_values, attention_mask); every parameter perturbed before
saving, so biases, norms, the logit scale and the MAP probe are not their defaults. Exports are reloaded by
transformers with no missing or unexpected keys.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

import zoo

transformers = pytest.importorskip("transformers")

TEXT = dict(vocab_size=99, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
            max_position_embeddings=16)  # fmt: skip
VISION = dict(hidden_size=48, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4, image_size=30,
              patch_size=6, num_channels=3)  # fmt: skip


def clip_config(**text: object) -> transformers.CLIPConfig:
    return transformers.CLIPConfig(
        text_config={**TEXT, "eos_token_id": 98, "bos_token_id": 97, "pad_token_id": 0, **text},
        vision_config=VISION,
        projection_dim=24,
        logit_scale_init_value=2.0,
    )


def siglip_config() -> transformers.SiglipConfig:
    return transformers.SiglipConfig(
        text_config={**TEXT, "pad_token_id": 0, "projection_size": 48}, vision_config=VISION
    )


def randomized(model: torch.nn.Module) -> torch.nn.Module:
    torch.manual_seed(1)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.05)
    return model.eval()


def reload_hf(cls: type, path: Path) -> torch.nn.Module:
    model, info = cls.from_pretrained(path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    return model.eval()


def inputs(eos: int | None) -> dict[str, torch.Tensor]:
    """Three right-padded texts (an eos closing each real part where there is one) and two images."""
    torch.manual_seed(2)
    ids = torch.randint(1, 90, (3, 9))
    mask = torch.ones_like(ids)
    for row, length in enumerate((9, 6, 4)):
        if eos is not None:
            ids[row, length - 1] = eos
        ids[row, length:] = 0
        mask[row, length:] = 0
    return {"input_ids": ids, "attention_mask": mask, "pixel_values": torch.randn(2, 3, 30, 30)}


@torch.no_grad()
def assert_parity(
    model: zoo.ZooModel, hf: torch.nn.Module, batch: dict[str, torch.Tensor]
) -> dict[str, float]:
    ours, theirs = model(**batch), hf(**batch)
    diffs = {}
    for name in ("logits_per_image", "logits_per_text", "text_embeds", "image_embeds"):
        mine, reference = getattr(ours, name), getattr(theirs, name)
        assert reference.abs().max() > 1e-2
        torch.testing.assert_close(mine, reference, atol=1e-4, rtol=1e-4)
        diffs[name] = (mine - reference).abs().max().item()
    return diffs


@pytest.mark.parametrize("eos", [98, 2])  # 2: transformers' legacy reading, the largest id ends the text
def test_clip_matches_transformers_both_ways(tmp_path: Path, eos: int) -> None:
    hf = randomized(transformers.CLIPModel(clip_config(eos_token_id=eos)))
    hf.save_pretrained(tmp_path / "hf")
    model = zoo.from_hf(tmp_path / "hf")
    assert model.spec.heads.text_pooling.kind == ("max_token_id" if eos == 2 else "eos_token")
    batch = inputs(eos if eos != 2 else 95)  # the legacy rule needs the end token to be the row's largest id
    if eos == 2:
        batch["input_ids"] = batch["input_ids"].clamp(max=90)
        batch["input_ids"][torch.arange(3), torch.tensor([8, 5, 3])] = 95
    assert_parity(model, hf, batch)
    zoo.to_hf(model, tmp_path / "out")
    assert_parity(model, reload_hf(transformers.CLIPModel, tmp_path / "out"), batch)


def test_siglip_matches_transformers_both_ways(tmp_path: Path) -> None:
    hf = randomized(transformers.SiglipModel(siglip_config()))
    hf.save_pretrained(tmp_path / "hf")
    model = zoo.from_hf(tmp_path / "hf")
    masked = inputs(None)
    unmasked = {
        k: v for k, v in masked.items() if k != "attention_mask"
    }  # as SigLIP was trained: padding seen
    assert_parity(model, hf, unmasked)
    assert_parity(model, hf, masked)
    zoo.to_hf(model, tmp_path / "out")
    assert_parity(model, reload_hf(transformers.SiglipModel, tmp_path / "out"), unmasked)


@torch.no_grad()
@pytest.mark.parametrize("family", ["clip", "siglip"])
def test_losses_and_features_match_transformers(tmp_path: Path, family: str) -> None:
    cls = transformers.CLIPModel if family == "clip" else transformers.SiglipModel
    hf = randomized(cls(clip_config() if family == "clip" else siglip_config()))
    hf.save_pretrained(tmp_path)
    model = zoo.from_hf(tmp_path)
    batch = inputs(98 if family == "clip" else None)
    batch["pixel_values"] = torch.randn(3, 3, 30, 30)  # three pairs
    if family == "siglip":
        batch.pop("attention_mask")
    ours, theirs = model(**batch, return_loss=True), hf(**batch, return_loss=True)
    torch.testing.assert_close(ours.loss, theirs.loss, atol=1e-4, rtol=1e-4)
    text = {k: v for k, v in batch.items() if k != "pixel_values"}
    features = hf.get_text_features(**text)
    features = getattr(features, "pooler_output", features)  # transformers 5 returns an output object
    torch.testing.assert_close(model.get_text_features(**text), features, atol=1e-4, rtol=1e-4)
    features = hf.get_image_features(pixel_values=batch["pixel_values"])
    features = getattr(features, "pooler_output", features)
    torch.testing.assert_close(
        model.get_image_features(batch["pixel_values"]), features, atol=1e-4, rtol=1e-4
    )


@pytest.mark.parametrize(
    ("preset", "config"),
    [
        (
            "clip-vit-base-patch32",
            lambda: transformers.CLIPConfig(  # openai/clip-vit-base-patch32's config.json values
                text_config=dict(bos_token_id=0, eos_token_id=2, pad_token_id=1),
                vision_config=dict(patch_size=32),
                projection_dim=512,
            ),
        ),
        ("siglip-base-patch16-224", lambda: transformers.SiglipConfig()),  # google/siglip-base-patch16-224
    ],
)
def test_preset_counts_equal_transformers(preset: str, config: object) -> None:
    cls = transformers.CLIPModel if preset.startswith("clip") else transformers.SiglipModel
    with torch.device("meta"):
        hf = cls(config())
    expected = sum(p.numel() for p in hf.parameters())
    assert zoo.parameter_count(preset) == expected
    # and the preset is what its Hugging Face config reads back as
    spec = zoo.preset(preset)
    assert zoo.io.hf.hf_config(spec)["model_type"] == preset.split("-")[0]


def test_siglip_reads_back_its_fixed_logit_start() -> None:
    spec = zoo.preset("siglip-base-patch16-224")
    assert spec.heads.logit_scale_init == pytest.approx(math.log(10))


@torch.no_grad()
@pytest.mark.parametrize("family", ["clip", "siglip"])
def test_other_image_sizes_interpolate_positions_as_transformers(tmp_path: Path, family: str) -> None:
    cls = transformers.CLIPModel if family == "clip" else transformers.SiglipModel
    hf = randomized(cls(clip_config() if family == "clip" else siglip_config()))
    hf.save_pretrained(tmp_path)
    model = zoo.from_hf(tmp_path)
    batch = inputs(98 if family == "clip" else None)
    batch["pixel_values"] = torch.randn(2, 3, 36, 42)  # a 6 x 7 patch grid, trained on 5 x 5
    ours = model(**batch, interpolate_pos_encoding=True)
    theirs = hf(**batch, interpolate_pos_encoding=True)
    torch.testing.assert_close(ours.logits_per_image, theirs.logits_per_image, atol=1e-4, rtol=1e-4)
