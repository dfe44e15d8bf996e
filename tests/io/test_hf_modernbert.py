"""Hugging Face interop for ModernBERT: global and local (sliding-window) layers with their own rotary bases,
GeGLU, the first layer without an attention norm, the final norm, the MLM head and the sequence (cls and
mean pooling) and token classifiers.

Each case is a small random transformers model with lively weights and every option away from its default
(biases on, norm eps 0.25, a local window of 3 on each side, another head activation), saved with
``save_pretrained``. Batches are right-padded; the longest row passes every local window.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

import zoo
from zoo.io.hf import HFError
from zoo.spec import EncoderSpec

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

V = 128
SIZES = dict(
    vocab_size=V, hidden_size=64, intermediate_size=48, num_hidden_layers=4, num_attention_heads=4,
    max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2,
    local_attention=6, global_attn_every_n_layers=2, norm_eps=0.25, norm_bias=True, attention_bias=True,
    mlp_bias=True, classifier_bias=True, hidden_activation="gelu_pytorch_tanh", classifier_activation="silu",
    rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 5000.0},
                     "sliding_attention": {"rope_type": "default", "rope_theta": 300.0}},
)  # fmt: skip
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "mlm": ("ModernBertForMaskedLM", {}),
    "mlm-untied-no-decoder-bias": ("ModernBertForMaskedLM", dict(tie_word_embeddings=False, decoder_bias=False,
                                                                classifier_bias=False, norm_bias=False)),
    "sequence-cls": ("ModernBertForSequenceClassification",
                     dict(num_labels=3, classifier_dropout=0.25, id2label={0: "neg", 1: "mid", 2: "pos"},
                          label2id={"neg": 0, "mid": 1, "pos": 2})),
    "sequence-mean": ("ModernBertForSequenceClassification", dict(num_labels=2, classifier_pooling="mean")),
    "token": ("ModernBertForTokenClassification", dict(num_labels=5)),
    "body": ("ModernBertModel", {}),
}  # fmt: skip
AUTO = {
    "ModernBertForMaskedLM": "AutoModelForMaskedLM",
    "ModernBertForSequenceClassification": "AutoModelForSequenceClassification",
    "ModernBertForTokenClassification": "AutoModelForTokenClassification",
    "ModernBertModel": "AutoModel",
}
LENGTHS = [20, 14, 5]


@torch.no_grad()
def liven(model: torch.nn.Module) -> torch.nn.Module:
    torch.manual_seed(0)
    for name, param in model.named_parameters():
        if param.dim() >= 2:
            param.normal_(0.0, 0.3 if "embed" in name else 2.0 / math.sqrt(model.config.hidden_size))
        else:
            param.add_(torch.randn_like(param) * 0.1)
    return model.eval()


def right_padded() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    T = max(LENGTHS)
    mask = torch.tensor([[1] * n + [0] * (T - n) for n in LENGTHS])
    return torch.randint(3, V, (len(LENGTHS), T), generator=g).masked_fill(mask == 0, 0), mask


def labels_for(model: zoo.ZooModel, mask: torch.Tensor) -> torch.Tensor | None:
    """Labels the head takes: per token (-100 on padding) for MLM and token heads, one per row otherwise."""
    spec = model.spec
    assert isinstance(spec, EncoderSpec)
    classifier, g = spec.heads.classifier, torch.Generator().manual_seed(5)
    if spec.heads.mlm is None and classifier is None:
        return None
    classes = spec.vocab_size if classifier is None else classifier.num_labels
    if classifier is not None and classifier.task == "sequence":
        return torch.randint(0, classes, (mask.shape[0],), generator=g)
    return torch.randint(0, classes, mask.shape, generator=g).masked_fill(mask == 0, -100)


@torch.no_grad()
def assert_outputs_match(model: zoo.ZooModel, hf: torch.nn.Module) -> None:
    """Logits (or the last hidden state, headless) and the loss equal transformers'."""
    ids, mask = right_padded()
    labels = labels_for(model, mask)
    ours = model(ids, attention_mask=mask, labels=labels)
    theirs = hf(input_ids=ids, attention_mask=mask, **({"labels": labels} if labels is not None else {}))
    if labels is not None:
        torch.testing.assert_close(ours.loss, theirs.loss, atol=1e-4, rtol=1e-4)
    mine, other = (
        (ours.logits, theirs.logits) if ours.logits is not None else (ours.last_hidden_state, theirs[0])
    )
    if mine.dim() == 3:  # per token: the real positions
        mine, other = mine[mask.bool()], other[mask.bool()]
    assert other.abs().max() > 0.5  # a real signal
    torch.testing.assert_close(mine, other, atol=1e-4, rtol=1e-4)


def reload_hf(path: Path, head_class: str) -> torch.nn.Module:
    model, info = getattr(transformers, AUTO[head_class]).from_pretrained(path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    assert type(model).__name__ == head_class
    return model.eval()


@pytest.fixture(scope="module", params=list(CASES))
def case(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    head_class, options = CASES[request.param]
    config = transformers.ModernBertConfig(**{**SIZES, **options})
    hf = liven(getattr(transformers, head_class)(config))
    path = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(path, safe_serialization=True)
    return request.param, hf, path, zoo.from_hf(path)


def test_from_hf_outputs_match_on_a_right_padded_batch(case) -> None:
    _, hf, _, model = case
    assert_outputs_match(model, hf)


_LOCAL = {"kind": "sliding_window", "window": 4}  # |i - j| <= local_attention // 2 = 3
IMPORTED = {
    "mlm": {"norm.first_attention_norm": False, "norm.bias": True, "norm.eps": 0.25, "attention.bias": True,
            "ffn.gated": True, "ffn.activation": "gelu_tanh", "ffn.bias": True, "position.theta": 5000.0,
            "position.local_theta": 300.0, "encoder.layer_patterns": [{"kind": "full"}, _LOCAL] * 2,
            "heads.mlm": {"activation": "silu", "tied": True, "dense_bias": True, "bias": True}},
    "mlm-untied-no-decoder-bias": {"norm.bias": False, "heads.mlm": {"activation": "silu", "tied": False,
                                                                     "dense_bias": False, "bias": False}},
    "sequence-cls": {"heads.classifier": {"task": "sequence", "num_labels": 3, "labels": ("neg", "mid", "pos"),
                                          "dropout": 0.25, "transform": {"activation": "silu", "bias": True},
                                          "pooling": "first_token", "activation": "tanh", "problem_type": None}},
    "sequence-mean": {"heads.classifier.pooling": "mean"},
    "token": {"heads.classifier.task": "token", "heads.classifier.transform": {"activation": "silu", "bias": True}},
    "body": {"heads.mlm": None, "heads.classifier": None},
}  # fmt: skip


def test_import_reads_each_case_into_its_spec_fields(case) -> None:
    name, _, _, model = case
    spec = model.spec.model_dump()
    for dotted, expected in IMPORTED[name].items():
        value = spec
        for part in dotted.split("."):
            value = value[part]
        assert value == expected, dotted


def test_to_hf_loads_in_transformers_with_no_missing_keys_and_same_outputs(case, tmp_path) -> None:
    name, _, _, model = case
    zoo.to_hf(model, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == "modernbert" and config["local_attention"] == 6
    reloaded = reload_hf(tmp_path, CASES[name][0])
    assert_outputs_match(model, reloaded)
    assert zoo.from_hf(tmp_path).spec.override(name=None, source=None) == model.spec.override(
        name=None, source=None
    )


def test_mean_pooling_ignores_the_padding() -> None:
    """Row 2 alone and inside the padded batch classify the same: the mean counts real tokens only."""
    spec = zoo.preset("modernbert-tiny").override(**{
        "heads.mlm": None, "heads.classifier": {"num_labels": 3, "pooling": "mean", "transform": {}}})  # fmt: skip
    torch.manual_seed(0)
    model = zoo.build(spec).eval()
    ids, mask = right_padded()
    with torch.no_grad():
        batched = model(ids, attention_mask=mask).logits[2]
        alone = model(ids[2:, : LENGTHS[2]]).logits[0]
    torch.testing.assert_close(batched, alone, atol=1e-5, rtol=1e-5)


# -- the published shape -----------------------------------------------------------------------------------

PUBLISHED = dict(
    model_type="modernbert", architectures=["ModernBertForMaskedLM"], vocab_size=50368, hidden_size=768,
    intermediate_size=1152, num_hidden_layers=22, num_attention_heads=12, hidden_activation="gelu",
    max_position_embeddings=8192, norm_eps=1e-5, norm_bias=False, global_rope_theta=160000.0,
    local_rope_theta=10000.0, global_attn_every_n_layers=3, local_attention=128, attention_bias=False,
    mlp_bias=False, decoder_bias=True, classifier_bias=False, classifier_activation="gelu",
    classifier_pooling="mean", tie_word_embeddings=True, pad_token_id=50283, bos_token_id=50281,
    eos_token_id=50282, cls_token_id=50281, sep_token_id=50282,
)  # fmt: skip


def test_preset_is_the_spec_the_published_config_imports_as() -> None:
    from zoo.io.hf import family_mappings

    mapping = next(m for m in family_mappings() if "modernbert" in m.model_types)
    imported = mapping.config_to_spec(PUBLISHED, set())
    preset = zoo.preset("modernbert-base")
    assert preset.override(name=None, source=None, init=imported.init) == imported
    exported = mapping.spec_to_config(preset)
    keys = [k for k in PUBLISHED if k in exported and k != "classifier_pooling"]  # no classifier: not read
    assert {k: exported[k] for k in keys} == {k: PUBLISHED[k] for k in keys}


# -- refusals ----------------------------------------------------------------------------------------------


def test_a_scaled_local_rotary_is_refused_naming_the_key(tmp_path) -> None:
    transformers.ModernBertModel(transformers.ModernBertConfig(**SIZES)).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["rope_parameters"]["sliding_attention"] = {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(HFError, match=r"rope_parameters\.sliding_attention=.*plain rotary"):
        zoo.from_hf(tmp_path)


def test_exports_that_would_drop_an_option_are_refused_naming_the_field(tmp_path) -> None:
    tiny = zoo.preset("modernbert-tiny")
    with pytest.raises(HFError, match=r"modernbert cannot express norm\.first_attention_norm=True"):
        zoo.to_hf(
            zoo.build(tiny.override(**{"norm.first_attention_norm": True})), tmp_path, model_type="modernbert"
        )
    with pytest.raises(HFError, match=r"modernbert cannot express heads\.classifier\.transform=None"):
        classified = tiny.override(
            **{"heads.mlm": None, "heads.classifier": {"num_labels": 2, "pooling": "mean"}}
        )
        zoo.to_hf(zoo.build(classified), tmp_path, model_type="modernbert")
    windows = [
        {"kind": "full"},
        {"kind": "sliding_window", "window": 9},
        {"kind": "sliding_window", "window": 5},
    ]
    with pytest.raises(
        HFError, match=r"modernbert cannot express encoder\.layer_patterns with windows \[5, 9\]"
    ):
        zoo.to_hf(
            zoo.build(tiny.override(encoder={"layer_patterns": windows})), tmp_path, model_type="modernbert"
        )
    bert = zoo.preset("bert-tiny").override(**{"heads.mlm.dense_bias": False})
    with pytest.raises(HFError, match=r"bert cannot express heads\.mlm\.dense_bias=False"):
        zoo.to_hf(zoo.build(bert), tmp_path, model_type="bert")
    assert not any(tmp_path.iterdir())  # refused before a file is written
