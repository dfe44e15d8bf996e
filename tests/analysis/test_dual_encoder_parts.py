"""`zoo.summary` / `zoo show` of a dual encoder (CLIP, SigLIP): both towers and the heads, counted apart, against
transformers' own modules; and no KV cache for a model that does not generate."""

from __future__ import annotations

import json

import pytest
import torch
import transformers

import zoo
from zoo.cli import main
from zoo.io.hf import hf_config

HF_MODELS = {
    "clip-vit-base-patch32": transformers.CLIPModel,
    "siglip-base-patch16-224": transformers.SiglipModel,
}


def hf_counts(name: str) -> tuple[int, int, int]:
    """(total, vision_model, text_model) parameters of transformers' model for the preset, built on meta."""
    config = hf_config(zoo.preset(name))
    model_class = HF_MODELS[name]
    with torch.device("meta"):
        model = model_class(model_class.config_class.from_dict(config))

    def count(module: torch.nn.Module) -> int:
        return sum(p.numel() for p in module.parameters())

    return count(model), count(model.vision_model), count(model.text_model)


@pytest.mark.parametrize(
    ("name", "total"), [("clip-vit-base-patch32", 151_277_313), ("siglip-base-patch16-224", 203_155_970)]
)
def test_the_towers_and_heads_sum_to_transformers_total(name: str, total: int) -> None:
    s = zoo.summary(name)
    parts = {part.name: part.params for part in s.parts}
    assert list(parts) == ["vision tower", "text tower", "heads"]
    hf_total, hf_vision, hf_text = hf_counts(name)
    assert s.parameters.total == sum(parts.values()) == hf_total == total
    heads = zoo.build(name, device="meta", init=False)
    if name.startswith("clip"):  # CLIP's towers are transformers' vision_model and text_model exactly
        assert (parts["vision tower"], parts["text tower"]) == (hf_vision, hf_text)
        projections = sum(
            p.numel() for m in (heads.visual_projection, heads.text_projection) for p in m.parameters()
        )
        assert parts["heads"] == projections + 1  # + logit_scale
    else:  # transformers files SigLIP's MAP head under vision_model.head, its text head under text_model.head
        pool = sum(p.numel() for p in heads.image_pool.parameters())
        text_head = sum(p.numel() for p in heads.text_head.parameters())
        assert parts["vision tower"] + pool == hf_vision
        assert parts["text tower"] + text_head == hf_text
        assert parts["heads"] == pool + text_head + 2  # + logit_scale, logit_bias


def test_a_dual_encoder_keeps_no_kv_cache_though_clips_text_tower_is_causal() -> None:
    s = zoo.summary("clip-vit-base-patch32")
    assert zoo.preset("clip-vit-base-patch32").stacks()["text"].causal
    assert s.kv_cache_per_token == s.cross_kv_cache_per_source_token == 0
    assert not any("KV cache:" in line for line in s.assumptions)
    assert any(note.startswith("a dual encoder generates nothing") for note in s.notes)


def test_the_parts_describe_each_tower_and_the_heads() -> None:
    clip = {part.name: part.detail for part in zoo.summary("clip-vit-base-patch32").parts}
    assert "12 layers, bidirectional, width 768" in clip["vision tower"]
    assert "224px images in 7×7 patches of 32px + class token = 50 tokens" in clip["vision tower"]
    assert "12 layers, causal, width 512, 8 heads × 64" in clip["text tower"]
    assert "vocab 49,408, up to 77 tokens" in clip["text tower"]
    assert (
        "image pooling: class token" in clip["heads"]
        and "projections 768 → 512 and 512 → 512" in clip["heads"]
    )
    assert "logit scale" in clip["heads"] and "logit bias" not in clip["heads"]
    siglip = {part.name: part.detail for part in zoo.summary("siglip-base-patch16-224").parts}
    assert "attention pooling" in siglip["heads"] and "text pooling: last token" in siglip["heads"]
    assert "no projections" in siglip["heads"] and "logit bias -10" in siglip["heads"]


@pytest.mark.parametrize("name", ["gpt2-tiny", "bert-tiny", "t5-tiny"])
def test_a_single_model_has_no_parts(name: str) -> None:
    assert zoo.summary(name).parts == ()


def test_show_json_lists_the_parts(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["show", "clip-tiny", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [part["name"] for part in data["parts"]] == ["vision tower", "text tower", "heads"]
    assert sum(part["params"] for part in data["parts"]) == data["parameters"]["total"]
    assert data["memory_bytes"]["kv_cache_per_token"] == 0
