"""Hugging Face interop for the classification heads of BERT, RoBERTa and ALBERT, both ways.

Each reference model is a random tiny config with every parameter perturbed (so biases and norm weights
are not their defaults), saved with ``save_pretrained``; zoo must give the same logits and loss on a
padded batch, export a folder transformers loads with no missing or unexpected keys and the same logits,
and keep num_labels, the label names, problem_type and the classifier dropout through both directions.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from support import padded_batch

import zoo
from zoo.spec.model import SequenceClassifierSpec, TokenClassifierSpec

transformers = pytest.importorskip("transformers")

VOCAB = 128
LENGTHS = [7, 4, 2]  # a right-padded batch
BODY = dict(
    num_hidden_layers=2, hidden_size=32, intermediate_size=48, num_attention_heads=4, vocab_size=VOCAB,
)  # fmt: skip
NAMES = {0: "negative", 1: "neutral", 2: "positive"}

# (transformers class, config class, config kwargs, pad id, zoo pooling of a sequence head)
CASES = {
    "bert-sequence": ("BertForSequenceClassification", "BertConfig", {"max_position_embeddings": 32}, 0, "pooler"),
    "bert-token": ("BertForTokenClassification", "BertConfig", {"max_position_embeddings": 32}, 0, None),
    "roberta-sequence": (
        "RobertaForSequenceClassification", "RobertaConfig",
        {"max_position_embeddings": 34, "type_vocab_size": 1}, 1, "dense",
    ),
    "roberta-token": (
        "RobertaForTokenClassification", "RobertaConfig",
        {"max_position_embeddings": 34, "type_vocab_size": 1}, 1, None,
    ),
    "albert-sequence": (
        "AlbertForSequenceClassification", "AlbertConfig",
        {"max_position_embeddings": 32, "embedding_size": 16, "num_hidden_layers": 3}, 0, "pooler",
    ),
    "albert-token": (
        "AlbertForTokenClassification", "AlbertConfig",
        {"max_position_embeddings": 32, "embedding_size": 16, "num_hidden_groups": 2}, 0, None,
    ),
}  # fmt: skip


def randomized(model: torch.nn.Module) -> torch.nn.Module:
    """Perturb every parameter (biases off zero, norm weights off one) and switch to eval mode."""
    torch.manual_seed(1)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.05)
    return model.eval()


def reload_hf(cls: type, path: Path) -> torch.nn.Module:
    """transformers' from_pretrained on ``path``, asserting it found exactly the tensors it needed."""
    model, info = cls.from_pretrained(path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    return model.eval()


def inputs(pad_id: int, *, token_level: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ids, their mask, and labels: per token (-100 on padding) or one per row."""
    torch.manual_seed(2)
    ids, mask = padded_batch(VOCAB, LENGTHS)
    ids = ids.masked_fill(mask == 0, pad_id)
    if token_level:
        labels = torch.randint(0, 3, ids.shape).masked_fill(mask == 0, -100)
    else:
        labels = torch.tensor([2, 0, 1])
    return ids, mask, labels


@torch.no_grad()
def assert_same_outputs(model: zoo.ZooModel, hf: torch.nn.Module, pad_id: int) -> None:
    """Logits (at real positions for a token head) and the loss agree to 1e-4."""
    token_level = model.spec.heads.classifier.task == "token"
    ids, mask, labels = inputs(pad_id, token_level=token_level)
    ours = model(ids, attention_mask=mask, labels=labels)
    theirs = hf(input_ids=ids, attention_mask=mask, labels=labels)
    real = mask.bool() if token_level else slice(None)
    assert theirs.logits[real].abs().max() > 1e-2  # a real signal, not two zero tensors
    torch.testing.assert_close(ours.logits[real], theirs.logits[real], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(ours.loss, theirs.loss, atol=1e-4, rtol=1e-4)


def classifier_fields(path: Path) -> dict:
    config = json.loads((path / "config.json").read_text())
    dropout = "classifier_dropout_prob" if config["model_type"] == "albert" else "classifier_dropout"
    keys = ("architectures", "id2label", "label2id", "problem_type", dropout)
    return {key: config.get(key) for key in keys} | {"num_labels": len(config["id2label"])}


@pytest.mark.parametrize("case", list(CASES))
def test_classifier_matches_transformers_and_round_trips(case: str, tmp_path: Path) -> None:
    class_name, config_name, extra, pad_id, pooling = CASES[case]
    config = getattr(transformers, config_name)(
        **{**BODY, **extra},
        pad_token_id=pad_id,
        id2label=NAMES,
        label2id={v: k for k, v in NAMES.items()},
        problem_type="single_label_classification" if pooling else None,
        **(
            {"classifier_dropout_prob": 0.25}
            if config_name == "AlbertConfig"
            else {"classifier_dropout": 0.25}
        ),
    )
    cls = getattr(transformers, class_name)
    hf = randomized(cls(config))
    hf.save_pretrained(tmp_path / "hf", safe_serialization=True)

    model = zoo.from_hf(tmp_path / "hf")
    classifier = model.spec.heads.classifier
    assert classifier.labels == ("negative", "neutral", "positive") and classifier.dropout == 0.25
    if pooling is None:
        assert isinstance(classifier, TokenClassifierSpec) and not model.spec.heads.pooler
    else:
        assert isinstance(classifier, SequenceClassifierSpec) and classifier.pooling == pooling
        assert classifier.problem_type == "single_label_classification"
    assert model.num_parameters() == sum(p.numel() for p in hf.parameters())
    assert_same_outputs(model, hf, pad_id)

    zoo.to_hf(model, tmp_path / "out")
    assert classifier_fields(tmp_path / "out") == classifier_fields(tmp_path / "hf")
    assert_same_outputs(model, reload_hf(cls, tmp_path / "out"), pad_id)
    assert zoo.from_hf(tmp_path / "out").spec.heads == model.spec.heads


def test_unnamed_labels_and_null_dropout_round_trip_as_transformers_defaults(tmp_path: Path) -> None:
    """LABEL_0.. names read as ``labels: null``; ALBERT's classifier_dropout_prob equal to the hidden
    dropout reads as ``dropout: null`` and is written back as that value."""
    config = transformers.AlbertConfig(
        **BODY, max_position_embeddings=32, embedding_size=16, num_labels=4, hidden_dropout_prob=0.1
    )
    hf = randomized(transformers.AlbertForSequenceClassification(config))
    hf.save_pretrained(tmp_path / "hf", safe_serialization=True)
    model = zoo.from_hf(tmp_path / "hf")
    classifier = model.spec.heads.classifier
    assert (classifier.num_labels, classifier.labels, classifier.dropout) == (4, None, None)
    zoo.to_hf(model, tmp_path / "out")
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    assert written["id2label"] == {str(i): f"LABEL_{i}" for i in range(4)}
    assert written["classifier_dropout_prob"] == 0.1 and written["problem_type"] is None
    assert zoo.from_hf(tmp_path / "out").spec.heads == model.spec.heads


@pytest.mark.parametrize(
    ("problem_type", "num_labels", "labels"),
    [
        ("multi_label_classification", 3, torch.tensor([[1.0, 0.0, 1.0], [0.0, 0.0, 1.0], [1.0, 1.0, 0.0]])),
        ("regression", 1, torch.tensor([0.5, -1.0, 2.0])),
        (None, 3, torch.tensor([[0.2, 0.3, 0.5], [1.0, 0.0, 0.0], [0.0, 0.5, 0.5]])),  # floats: multi-label
        (None, 1, torch.tensor([0.5, -1.0, 2.0])),  # one label: regression
    ],
)
def test_sequence_losses_follow_the_problem_type_as_transformers(problem_type, num_labels, labels, tmp_path):
    config = transformers.BertConfig(
        **BODY, max_position_embeddings=32, num_labels=num_labels, problem_type=problem_type
    )
    hf = randomized(transformers.BertForSequenceClassification(config))
    hf.save_pretrained(tmp_path, safe_serialization=True)
    model = zoo.from_hf(tmp_path)
    assert model.spec.heads.classifier.problem_type == problem_type
    ids, mask, _ = inputs(0, token_level=False)
    with torch.no_grad():
        ours = model(ids, attention_mask=mask, labels=labels).loss
        hf.config.problem_type = problem_type  # transformers sets it on first use; start from the same
        theirs = hf(input_ids=ids, attention_mask=mask, labels=labels).loss
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)


def test_token_head_skips_positions_outside_logits_mask_like_the_full_head() -> None:
    spec = zoo.preset("bert-tiny").override(
        **{"heads.mlm": None, "heads.pooler": False, "heads.classifier": {"task": "token", "num_labels": 5}}
    )
    model = zoo.build(spec).eval()
    ids, mask, labels = inputs(0, token_level=True)
    scored = labels != -100
    with torch.no_grad():
        full = model(ids, attention_mask=mask, labels=labels)
        selected = model(ids, attention_mask=mask, labels=labels, logits_mask=scored)
    torch.testing.assert_close(selected.logits, full.logits[scored])
    torch.testing.assert_close(selected.loss, full.loss)


def test_heads_the_hf_class_cannot_hold_are_refused_naming_the_field() -> None:
    spec = zoo.preset("bert-tiny").override(
        **{"heads.mlm": None, "heads.classifier": {"num_labels": 2, "pooling": "dense"}}
    )
    with pytest.raises(ValueError, match=r"bert cannot express heads\.classifier\.pooling='dense'"):
        zoo.to_hf(zoo.build(spec), "unused", model_type="bert")


def test_classifier_labels_of_the_wrong_shape_or_dtype_are_refused() -> None:
    spec = zoo.preset("bert-tiny").override(**{"heads.mlm": None, "heads.num_labels": 3})
    model = zoo.build(spec)
    ids, mask, _ = inputs(0, token_level=False)
    with pytest.raises(ValueError, match=r"labels must have shape \(3,\), like one label per row"):
        model(ids, mask, labels=torch.zeros(3, 7, dtype=torch.long))
    multi = zoo.build(spec.override(**{"heads.classifier.problem_type": "multi_label_classification"}))
    with pytest.raises(
        ValueError, match=r"labels for multi_label_classification must be floats of shape \(3, 3\)"
    ):
        multi(ids, mask, labels=torch.zeros(3, dtype=torch.long))


@pytest.mark.parametrize(
    "classifier",
    [
        {"num_labels": 3},
        {"num_labels": 3, "pooling": "dense", "dropout": 0.2},
        {"num_labels": 1, "pooling": "first_token", "problem_type": "regression"},
        {"task": "token", "num_labels": 5, "labels": ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]},
    ],
)
def test_classifier_specs_size_exactly_and_survive_json(classifier: dict) -> None:
    spec = zoo.preset("bert-tiny").override(**{"heads.mlm": None, "heads.classifier": classifier})
    assert zoo.spec.parameter_count(spec) == zoo.build(spec, device="meta").num_parameters()
    assert zoo.parse_spec(json.loads(spec.to_json())) == spec


def test_specs_written_with_num_labels_still_load() -> None:
    """``heads.num_labels`` (the field before heads.classifier) reads as a sequence classifier over the
    pooler, or the first token without one; a null one (every older spec.json) as no classifier."""
    base = zoo.preset("bert-tiny").model_dump(mode="json")
    heads = {"pooler": True, "mlm": None, "num_labels": 4}
    spec = zoo.parse_spec({**base, "heads": heads})
    assert spec.heads.num_labels == 4 and spec.heads.classifier.pooling == "pooler"
    spec = zoo.parse_spec({**base, "heads": {**heads, "pooler": False}})
    assert spec.heads.classifier.pooling == "first_token"
    spec = zoo.parse_spec(
        {**base, "heads": {"pooler": True, "mlm": base["heads"]["mlm"], "num_labels": None}}
    )
    assert spec.heads.classifier is None and spec.heads.num_labels is None


@pytest.mark.parametrize(
    ("classifier", "message"),
    [
        (
            {"num_labels": 2, "labels": ["a"]},
            r"heads\.classifier\.labels has 1 name\(s\) but .*num_labels is 2",
        ),
        (
            {"num_labels": 2, "labels": ["a", "a"]},
            r"heads\.classifier\.labels must be distinct; repeated: 'a'",
        ),
        (
            {"num_labels": 2, "task": "span"},
            r"heads\.classifier: .*'span'.*expected tags: 'sequence', 'token'",
        ),
        ({"num_labels": 1, "problem_type": "single_label_classification"}, r"needs num_labels >= 2"),
    ],
)
def test_bad_classifier_specs_name_the_field(classifier: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        zoo.preset("bert-tiny").override(**{"heads.mlm": None, "heads.classifier": classifier})
    no_pooler = {"heads.mlm": None, "heads.pooler": False, "heads.classifier": {"num_labels": 2}}
    with pytest.raises(
        ValueError, match=r"heads\.classifier\.pooling is 'pooler' but heads\.pooler is false"
    ):
        zoo.preset("bert-tiny").override(**no_pooler)
