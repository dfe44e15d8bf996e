"""Hugging Face interop for XLM-RoBERTa (and XL), DistilBERT, ELECTRA and MPNet: parity with transformers
both ways, on random tiny configs with every parameter perturbed and non-default options.

Each case: transformers' model -> ``save_pretrained`` -> `zoo.from_hf` -> logits (and loss) equal to 1e-4 on
a right-padded batch -> `zoo.to_hf` -> transformers' ``from_pretrained`` with no missing or unexpected keys
-> the same logits again; and what a family cannot hold is refused, naming the field.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from support import padded_batch

import zoo
from zoo.io.hf import family_mappings

transformers = pytest.importorskip("transformers")

VOCAB = 128
LENGTHS = [7, 4, 2]  # a right-padded batch
NAMES = {0: "negative", 1: "neutral", 2: "positive"}
LABEL_FIELDS = {"name", "source"}  # where the spec came from: not the model
LABELS = {"id2label": NAMES, "label2id": {v: k for k, v in NAMES.items()}}


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


def batch(pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids (padding = ``pad_id``; real tokens never use it) and their mask."""
    torch.manual_seed(2)
    ids, mask = padded_batch(VOCAB, LENGTHS)
    return ids.masked_fill(mask == 0, pad_id), mask


def labels_for(model: zoo.ZooModel, mask: torch.Tensor) -> torch.Tensor | None:
    """Labels of the model's head: classes per row or per token, vocabulary ids, or 0/1 per token."""
    heads = model.spec.heads
    torch.manual_seed(3)
    if heads.classifier is not None and heads.classifier.task == "sequence":
        return torch.tensor([2, 0, 1])
    if heads.classifier is not None:
        return torch.randint(0, heads.classifier.num_labels, mask.shape).masked_fill(mask == 0, -100)
    if heads.mlm is not None:
        return torch.randint(0, VOCAB, mask.shape).masked_fill(mask == 0, -100)
    if heads.replaced_token is not None:
        return torch.randint(0, 2, mask.shape)
    return None


@torch.no_grad()
def assert_same(model: zoo.ZooModel, hf: torch.nn.Module, *, pad_id: int) -> None:
    """Logits at real positions (or hidden states and the pooled output) and the loss agree to 1e-4."""
    ids, mask = batch(pad_id)
    labels = labels_for(model, mask)
    ours = model(ids, attention_mask=mask, labels=labels)
    theirs = hf(input_ids=ids, attention_mask=mask, **({"labels": labels} if labels is not None else {}))
    real = mask.bool()
    if ours.logits is None:
        mine, reference = ours.last_hidden_state[real], theirs.last_hidden_state[real]
    elif ours.logits.dim() == 2 and ours.logits.shape == real.shape:  # one logit per token
        mine, reference = ours.logits[real], theirs.logits[real]
    elif ours.logits.dim() == 2:  # one row per sequence
        mine, reference = ours.logits, theirs.logits
    else:
        mine, reference = ours.logits[real], theirs.logits[real]
    assert reference.abs().max() > 1e-2  # a real signal, not two zero tensors
    torch.testing.assert_close(mine, reference, atol=1e-4, rtol=1e-4)
    if labels is not None:
        torch.testing.assert_close(ours.loss, theirs.loss, atol=1e-4, rtol=1e-4)
    if getattr(theirs, "pooler_output", None) is not None:
        torch.testing.assert_close(ours.pooler_output, theirs.pooler_output, atol=1e-4, rtol=1e-4)


def round_trip(hf: torch.nn.Module, tmp_path: Path, *, pad_id: int, unused: int = 0) -> zoo.ZooModel:
    """from_hf -> parity -> to_hf (as the original's model_type) -> transformers reload with no missing or
    unexpected keys -> parity; the export's class is the one that saved the original, and the export reads
    back to the same spec. ``unused``: parameters transformers holds and never reads (an untied head's
    second bias)."""
    hf.save_pretrained(tmp_path / "hf", safe_serialization=True)
    model = zoo.from_hf(tmp_path / "hf")
    assert model.num_parameters() == sum(p.numel() for p in hf.parameters()) - unused
    assert_same(model, hf, pad_id=pad_id)
    zoo.to_hf(model, tmp_path / "out", model_type=hf.config.model_type)
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["architectures"] == [type(hf).__name__]
    assert config["model_type"] == hf.config.model_type
    assert_same(model, reload_hf(type(hf), tmp_path / "out"), pad_id=pad_id)
    reread = zoo.from_hf(tmp_path / "out").spec
    assert reread.model_dump(exclude=LABEL_FIELDS) == model.spec.model_dump(exclude=LABEL_FIELDS)
    return model


# -- XLM-RoBERTa ---------------------------------------------------------------------------------------------

XLMR = dict(
    vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
    max_position_embeddings=34, type_vocab_size=1, layer_norm_eps=1e-6, hidden_act="gelu_new",
)  # fmt: skip


@pytest.mark.parametrize(
    "class_name",
    ["XLMRobertaForMaskedLM", "XLMRobertaModel", "XLMRobertaForSequenceClassification",
     "XLMRobertaForTokenClassification"],
)  # fmt: skip
def test_xlm_roberta_matches_transformers_and_round_trips(class_name: str, tmp_path: Path) -> None:
    config = transformers.XLMRobertaConfig(**XLMR, **LABELS, classifier_dropout=0.25)
    model = round_trip(randomized(getattr(transformers, class_name)(config)), tmp_path, pad_id=1)
    assert model.spec.position.offset == 2 and model.spec.max_positions == 32
    assert model.spec.heads.pooler == (class_name == "XLMRobertaModel")  # a sentence-transformers folder


def test_xlm_roberta_spec_exports_as_roberta_unless_asked(tmp_path: Path) -> None:
    hf = randomized(transformers.XLMRobertaForMaskedLM(transformers.XLMRobertaConfig(**XLMR)))
    hf.save_pretrained(tmp_path / "hf", safe_serialization=True)
    zoo.to_hf(zoo.from_hf(tmp_path / "hf"), tmp_path / "out")
    assert json.loads((tmp_path / "out" / "config.json").read_text())["model_type"] == "roberta"


@pytest.mark.parametrize(
    "class_name",
    ["XLMRobertaXLForMaskedLM", "XLMRobertaXLModel", "XLMRobertaXLForSequenceClassification",
     "XLMRobertaXLForTokenClassification"],
)  # fmt: skip
def test_xlm_roberta_xl_pre_norm_matches_transformers_and_round_trips(
    class_name: str, tmp_path: Path
) -> None:
    config = transformers.XLMRobertaXLConfig(**XLMR, **LABELS)
    model = round_trip(randomized(getattr(transformers, class_name)(config)), tmp_path, pad_id=1)
    spec = model.spec
    assert spec.norm.placement == "pre" and spec.norm.has_final and not spec.embedding.norm


def test_xlm_roberta_xl_refuses_a_post_norm_spec(tmp_path: Path) -> None:
    hf = transformers.XLMRobertaForMaskedLM(transformers.XLMRobertaConfig(**XLMR))
    hf.save_pretrained(tmp_path / "hf", safe_serialization=True)
    with pytest.raises(ValueError, match=r"xlm-roberta-xl cannot express norm\.placement='post'"):
        zoo.to_hf(zoo.from_hf(tmp_path / "hf"), tmp_path / "out", model_type="xlm-roberta-xl")


# -- DistilBERT ----------------------------------------------------------------------------------------------

DISTILBERT = dict(
    vocab_size=VOCAB, dim=32, n_layers=2, n_heads=4, hidden_dim=48, max_position_embeddings=32,
    activation="relu", dropout=0.15, seq_classif_dropout=0.25, pad_token_id=0,
)  # fmt: skip


@pytest.mark.parametrize(
    "class_name",
    ["DistilBertForMaskedLM", "DistilBertModel", "DistilBertForSequenceClassification",
     "DistilBertForTokenClassification"],
)  # fmt: skip
def test_distilbert_matches_transformers_and_round_trips(class_name: str, tmp_path: Path) -> None:
    config = transformers.DistilBertConfig(**DISTILBERT, **LABELS)
    model = round_trip(randomized(getattr(transformers, class_name)(config)), tmp_path, pad_id=0)
    spec = model.spec
    assert spec.embedding.segment_vocab_size == 0 and spec.norm.eps == 1e-12 and not spec.heads.pooler
    classifier = spec.heads.classifier
    if class_name.endswith("SequenceClassification"):
        assert (classifier.pooling, classifier.activation, classifier.dropout) == (
            "pre_classifier",
            "relu",
            0.25,
        )
    if class_name.endswith("TokenClassification"):
        assert classifier.dropout is None and classifier.labels == ("negative", "neutral", "positive")


def test_untied_distilbert_mlm_head_round_trips(tmp_path: Path) -> None:
    config = transformers.DistilBertConfig(**DISTILBERT, tie_word_embeddings=False)
    model = round_trip(randomized(transformers.DistilBertForMaskedLM(config)), tmp_path, pad_id=0)
    assert not model.spec.heads.mlm.tied


def test_distilbert_with_sinusoidal_positions_imports_its_table_as_learned_positions(tmp_path: Path) -> None:
    config = transformers.DistilBertConfig(**DISTILBERT, sinusoidal_pos_embds=True)
    hf = transformers.DistilBertForMaskedLM(config).eval()  # the sinusoid table unperturbed, as trained
    model = round_trip(hf, tmp_path, pad_id=0)
    torch.testing.assert_close(
        model.encoder.positions.weight, hf.distilbert.embeddings.position_embeddings.weight, atol=0, rtol=0
    )
    assert json.loads((tmp_path / "out" / "config.json").read_text())["sinusoidal_pos_embds"] is False


def test_distilbert_refuses_token_types_and_a_tanh_head() -> None:
    bert = zoo.preset("bert-tiny").override(**{"heads.mlm": None, "heads.pooler": False, "norm.eps": 1e-12})
    with pytest.raises(ValueError, match=r"distilbert cannot express embedding\.segment_vocab_size=2"):
        zoo.to_hf(zoo.build(bert), "unused", model_type="distilbert")
    dense = bert.override(
        **{"embedding.segment_vocab_size": 0, "heads.classifier": {"num_labels": 2, "pooling": "dense"}}
    )
    with pytest.raises(ValueError, match=r"distilbert cannot express heads\.classifier\.pooling='dense'"):
        zoo.to_hf(zoo.build(dense), "unused", model_type="distilbert")


# -- ELECTRA -------------------------------------------------------------------------------------------------

ELECTRA = dict(
    vocab_size=VOCAB, embedding_size=16, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
    intermediate_size=48, max_position_embeddings=32, type_vocab_size=3, hidden_act="gelu_new",
    layer_norm_eps=1e-6, classifier_dropout=0.25,
)  # fmt: skip


@pytest.mark.parametrize(
    "class_name",
    ["ElectraForPreTraining", "ElectraForMaskedLM", "ElectraModel", "ElectraForSequenceClassification",
     "ElectraForTokenClassification"],
)  # fmt: skip
def test_electra_matches_transformers_and_round_trips(class_name: str, tmp_path: Path) -> None:
    config = transformers.ElectraConfig(**ELECTRA, **LABELS)
    model = round_trip(randomized(getattr(transformers, class_name)(config)), tmp_path, pad_id=0)
    heads = model.spec.heads
    assert model.spec.embedding.factorized_dim == 16 and model.encoder.embed_proj is not None
    assert (heads.replaced_token is not None) == (class_name == "ElectraForPreTraining")
    if class_name == "ElectraForPreTraining":
        assert heads.replaced_token.activation == "gelu_tanh"
    if class_name == "ElectraForMaskedLM":
        assert heads.mlm.activation == "gelu" and heads.mlm.tied  # GELU whatever hidden_act says
    if class_name == "ElectraForSequenceClassification":
        assert (heads.classifier.pooling, heads.classifier.activation) == ("dense", "gelu")


def test_electra_without_projection_and_an_untied_generator_round_trip(tmp_path: Path) -> None:
    config = transformers.ElectraConfig(**dict(ELECTRA, embedding_size=32), tie_word_embeddings=False)
    model = round_trip(randomized(transformers.ElectraForMaskedLM(config)), tmp_path, pad_id=0)
    assert model.spec.embedding.factorized_dim is None and model.encoder.embed_proj is None
    assert not model.spec.heads.mlm.tied


@torch.no_grad()
def test_replaced_token_loss_skips_padding_and_ignored_labels_and_logits_mask_selects_rows(tmp_path) -> None:
    hf = randomized(transformers.ElectraForPreTraining(transformers.ElectraConfig(**ELECTRA)))
    hf.save_pretrained(tmp_path, safe_serialization=True)
    model = zoo.from_hf(tmp_path)
    ids, mask = batch(0)
    labels = torch.randint(0, 2, ids.shape)
    full = model(ids, attention_mask=mask, labels=labels)
    keep = mask.bool() & (torch.arange(ids.shape[1]) % 2 == 0)
    selected = model(ids, attention_mask=mask, labels=labels.masked_fill(~keep, -100), logits_mask=keep)
    torch.testing.assert_close(selected.logits, full.logits[keep])
    expected = torch.nn.functional.binary_cross_entropy_with_logits(full.logits[keep], labels[keep].float())
    torch.testing.assert_close(selected.loss, expected)
    with pytest.raises(ValueError, match=r"labels contains 2, outside \[0, 2\)"):
        model(ids, attention_mask=mask, labels=labels + 1)


def test_replaced_token_head_sizes_exactly_and_excludes_other_heads() -> None:
    spec = zoo.preset("bert-tiny").override(
        **{"heads.mlm": None, "heads.replaced_token": {"activation": "relu"}}
    )
    assert zoo.spec.parameter_count(spec) == zoo.build(spec, device="meta").num_parameters()
    with pytest.raises(ValueError, match=r"heads\.mlm and heads\.replaced_token exclude each other"):
        zoo.preset("bert-tiny").override(**{"heads.replaced_token": {}})
    with pytest.raises(ValueError, match=r"bert cannot express heads\.replaced_token="):
        zoo.to_hf(zoo.build(spec), "unused", model_type="bert")


def test_electra_refuses_a_projection_as_wide_as_the_model_and_a_tanh_classifier() -> None:
    spec = zoo.preset("bert-tiny").override(**{"heads.mlm": None, "heads.pooler": False})
    wide = spec.override(**{"embedding.factorized_dim": spec.d_model})
    with pytest.raises(
        ValueError, match=r"electra cannot express embedding\.factorized_dim=\d+ \(= d_model\)"
    ):
        zoo.to_hf(zoo.build(wide), "unused", model_type="electra")
    tanh = spec.override(**{"heads.classifier": {"num_labels": 2, "pooling": "dense"}})
    with pytest.raises(ValueError, match=r"electra cannot express heads\.classifier\.activation='tanh'"):
        zoo.to_hf(zoo.build(tanh), "unused", model_type="electra")


# -- MPNet ---------------------------------------------------------------------------------------------------

MPNET = dict(
    vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
    max_position_embeddings=66, layer_norm_eps=1e-6, hidden_act="gelu_new", hidden_dropout_prob=0.15,
)  # fmt: skip


@pytest.mark.parametrize(
    "class_name",
    ["MPNetModel", "MPNetForMaskedLM", "MPNetForSequenceClassification", "MPNetForTokenClassification"],
)
def test_mpnet_matches_transformers_and_round_trips(class_name: str, tmp_path: Path) -> None:
    config = transformers.MPNetConfig(**MPNET, **LABELS)
    model = round_trip(randomized(getattr(transformers, class_name)(config)), tmp_path, pad_id=1)
    spec = model.spec
    assert spec.position.offset == 2 and spec.position.relative_bias == zoo.spec.RelativeBiasSpec()
    assert spec.max_positions == 64 and spec.embedding.segment_vocab_size == 0
    assert spec.heads.pooler == (class_name == "MPNetModel")  # sentence-transformers' folders keep it
    if spec.heads.classifier is not None:
        assert spec.heads.classifier.dropout is None


def test_mpnet_relative_bias_reaches_past_the_exact_buckets(tmp_path: Path) -> None:
    """A 40-token row spans the log-spaced buckets (distance >= 8) on both sides: still equal."""
    hf = randomized(transformers.MPNetModel(transformers.MPNetConfig(**MPNET)))
    hf.save_pretrained(tmp_path, safe_serialization=True)
    model = zoo.from_hf(tmp_path)
    torch.manual_seed(4)
    ids = torch.randint(3, VOCAB, (2, 40))
    mask = torch.ones_like(ids)
    mask[1, 25:] = 0
    ids = ids.masked_fill(mask == 0, 1)
    with torch.no_grad():
        ours, theirs = model(ids, attention_mask=mask), hf(input_ids=ids, attention_mask=mask)
    real = mask.bool()
    torch.testing.assert_close(
        ours.last_hidden_state[real], theirs.last_hidden_state[real], atol=1e-4, rtol=1e-4
    )


def test_untied_mpnet_mlm_head_round_trips(tmp_path: Path) -> None:
    config = transformers.MPNetConfig(**MPNET, tie_word_embeddings=False)
    model = round_trip(randomized(transformers.MPNetForMaskedLM(config)), tmp_path, pad_id=1, unused=VOCAB)
    assert not model.spec.heads.mlm.tied


def test_mpnet_refuses_other_bucket_counts_and_specs_without_the_relative_bias(tmp_path: Path) -> None:
    transformers.MPNetModel(
        transformers.MPNetConfig(**MPNET, relative_attention_num_buckets=16)
    ).save_pretrained(tmp_path, safe_serialization=True)
    with pytest.raises(ValueError, match=r"relative_attention_num_buckets=16 is not supported"):
        zoo.from_hf(tmp_path)
    roberta = zoo.preset("bert-tiny").override(
        **{"heads.mlm": None, "embedding.segment_vocab_size": 0, "pad_token_id": 1, "position.offset": 2}
    )
    with pytest.raises(ValueError, match=r"mpnet cannot express position\.relative_bias=None"):
        zoo.to_hf(zoo.build(roberta), "unused", model_type="mpnet")


def test_relative_bias_beside_learned_positions_sizes_exactly_and_is_refused_by_bert() -> None:
    spec = zoo.preset("bert-tiny").override(**{"position.relative_bias": {"num_buckets": 16}})
    model = zoo.build(spec, device="meta")
    assert zoo.spec.parameter_count(spec) == model.num_parameters()
    assert model.encoder.position_bias.weight.shape == (16, spec.attention.num_heads)
    with pytest.raises(ValueError, match=r"bert cannot express position\.relative_bias="):
        zoo.to_hf(zoo.build(spec), "unused", model_type="bert")
    with pytest.raises(ValueError, match=r"position\.relative_bias\.num_buckets \(1,000,000,000\) is over"):
        spec.override(**{"position.relative_bias.num_buckets": 10**9})


@pytest.mark.parametrize(
    ("model_class", "config_class", "config", "named"),
    [
        ("MPNetModel", "MPNetConfig", MPNET, "MPNetForMaskedLM"),
        ("ElectraModel", "ElectraConfig", ELECTRA, "ElectraForPreTraining"),
        ("XLMRobertaModel", "XLMRobertaConfig", XLMR, "XLMRobertaForMaskedLM"),
        ("DistilBertModel", "DistilBertConfig", DISTILBERT, "DistilBertForMaskedLM"),
    ],
)
def test_a_sentence_transformers_body_whose_config_names_a_head_class_loads_as_the_body(
    model_class: str, config_class: str, config: dict, named: str, tmp_path: Path
) -> None:
    """sentence-transformers saves the bare body (with its pooler, where it has one) beside a config.json
    that may still name the pretraining head class: the tensors decide which heads there are."""
    hf = randomized(getattr(transformers, model_class)(getattr(transformers, config_class)(**config)))
    hf.save_pretrained(tmp_path, safe_serialization=True)
    written = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**written, "architectures": [named]}))
    model = zoo.from_hf(tmp_path)
    heads = model.spec.heads
    assert heads.mlm is None and heads.classifier is None and heads.replaced_token is None
    assert heads.pooler == (getattr(hf, "pooler", None) is not None)  # MPNet's and XLM-R's bodies have one
    assert_same(model, hf, pad_id=hf.config.pad_token_id)


# -- presets -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("preset", "model_type"),
    [
        ("xlm-roberta-base", "xlm-roberta"),
        ("distilbert-base-uncased", "distilbert"),
        ("electra-base-discriminator", "electra"),
        ("electra-small-generator", "electra"),
        ("mpnet-base", "mpnet"),
        ("all-mpnet-base-v2", "mpnet"),
    ],
)
def test_published_presets_export_to_the_transformers_model_of_the_same_size(
    preset: str, model_type: str
) -> None:
    """The preset's config.json builds, in transformers on the meta device, a model with zoo's exact
    parameter count (the counts in tests/spec/test_presets.py are the published models')."""
    spec = zoo.preset(preset)
    mapping = next(m for m in family_mappings() if model_type in m.model_types)
    config = mapping.spec_to_config(spec)
    hf_config = transformers.AutoConfig.for_model(**config)
    with torch.device("meta"):
        hf = getattr(transformers, config["architectures"][0])(hf_config)
    assert sum(p.numel() for p in hf.parameters()) == zoo.build(spec, device="meta").num_parameters()
