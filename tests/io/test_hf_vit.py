"""ViT import/export against transformers: ViTForImageClassification logits and ViTModel's hidden states
and pooler to 1e-4 (at the trained size and interpolated to another), exports that transformers reloads
with no missing or unexpected keys, and refusals by name."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import zoo
from zoo.io.hf import HFError, NoFamilyError

transformers = pytest.importorskip("transformers")

CONFIG = {
    "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 48,
    "image_size": 16, "patch_size": 4, "num_channels": 3, "layer_norm_eps": 1e-6,
}  # fmt: skip


def _hf(cls_name: str, tmp_path: Path, **changes: object):
    torch.manual_seed(0)
    config = transformers.ViTConfig(**CONFIG, **changes)
    model = getattr(transformers, cls_name)(config).eval()
    with torch.no_grad():  # non-trivial class token and norms (transformers zeroes some at init)
        for name, param in model.named_parameters():
            if "layernorm" in name or name.endswith("cls_token"):
                param.add_(torch.randn_like(param) * 0.1)
    model.save_pretrained(tmp_path / "hf")
    return model


def test_image_classification_logits_equal_transformers(tmp_path: Path) -> None:
    hf = _hf("ViTForImageClassification", tmp_path, num_labels=5, id2label={i: f"c{i}" for i in range(5)})
    model = zoo.from_hf(tmp_path / "hf").eval()
    assert model.spec.heads.classifier.task == "image"
    assert model.spec.heads.classifier.labels == ("c0", "c1", "c2", "c3", "c4")
    pixels = torch.randn(3, 3, 16, 16)
    with torch.no_grad():
        want, got = hf(pixel_values=pixels).logits, model(pixel_values=pixels).logits
    assert (got - want).abs().max().item() < 1e-4
    with torch.no_grad():  # another size: positions interpolated as transformers does
        big = torch.randn(2, 3, 24, 20)
        want = hf(pixel_values=big, interpolate_pos_encoding=True).logits
        got = model(pixel_values=big, interpolate_pos_encoding=True).logits
    assert (got - want).abs().max().item() < 1e-4


def test_vit_model_hidden_states_and_pooler_equal_transformers(tmp_path: Path) -> None:
    hf = _hf("ViTModel", tmp_path, qkv_bias=False, hidden_act="gelu_new")
    model = zoo.from_hf(tmp_path / "hf").eval()
    assert model.spec.heads.pooler and not model.spec.stacks()["encoder"].attention.bias
    pixels = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        want, got = hf(pixel_values=pixels), model(pixel_values=pixels)
    assert (got.last_hidden_state - want.last_hidden_state).abs().max().item() < 1e-4
    assert (got.pooler_output - want.pooler_output).abs().max().item() < 1e-4


@pytest.mark.parametrize("cls_name", ["ViTForImageClassification", "ViTModel"])
def test_export_reloads_in_transformers_with_no_missing_or_unexpected_keys(
    cls_name: str, tmp_path: Path
) -> None:
    hf = _hf(cls_name, tmp_path, num_labels=4)
    model = zoo.from_hf(tmp_path / "hf").eval()
    zoo.to_hf(model, tmp_path / "out")
    back, info = getattr(transformers, cls_name).from_pretrained(tmp_path / "out", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    pixels = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        want = hf(pixel_values=pixels)
        got = back.eval()(pixel_values=pixels)
    key = "logits" if cls_name.endswith("Classification") else "last_hidden_state"
    assert torch.equal(getattr(got, key), getattr(want, key))
    again = zoo.from_hf(tmp_path / "out")  # the Hub's tensor names, read back
    label = {"name", "source"}  # the folder it was read from
    assert again.spec.model_dump(exclude=label) == model.spec.model_dump(exclude=label)
    assert all(torch.equal(a, b) for a, b in zip(again.state_dict().values(), model.state_dict().values()))


def test_what_vit_cannot_express_is_refused_by_name(tmp_path: Path) -> None:
    base = {
        "family": "encoder", "d_model": 32, "num_layers": 1, "attention": {"num_heads": 4},
        "norm": {"placement": "pre"}, "position": {"kind": "none"},
        "embedding": {"kind": "patches", "image_size": 8, "patch_size": 4},
        "heads": {"classifier": {"task": "image", "num_labels": 2}},
    }  # fmt: skip
    with pytest.raises(HFError, match=r"vit cannot express norm\.placement='post'"):
        zoo.to_hf(zoo.build({**base, "norm": {"placement": "post"}}), tmp_path / "a", model_type="vit")
    with pytest.raises(HFError, match=r"vit cannot express heads\.pooler=False"):
        zoo.to_hf(zoo.build({**base, "heads": {}}), tmp_path / "b", model_type="vit")
    with pytest.raises(NoFamilyError, match=r"embedding\.kind='patches'"):
        zoo.to_hf(zoo.build({**base, "position": {"kind": "rotary"}}), tmp_path / "c")


def test_preset_counts_equal_transformers_built_from_the_config() -> None:
    config = transformers.ViTConfig(num_labels=1000)  # google/vit-base-patch16-224's: ViTConfig's defaults
    with torch.device("meta"):
        classifier = transformers.ViTForImageClassification(config)
        body = transformers.ViTModel(config)  # with its pooler
    preset = zoo.preset("vit-base-patch16-224")
    assert zoo.build(preset, device="meta").num_parameters() == classifier.num_parameters() == 86_567_656
    headless = preset.override(heads={"pooler": True, "classifier": None})
    assert zoo.build(headless, device="meta").num_parameters() == body.num_parameters()
    assert zoo.io.hf.hf_config(preset)["architectures"] == ["ViTForImageClassification"]
