"""ALBERT (``model_type: albert``): ``AlbertModel`` (with its pooler), ``AlbertForMaskedLM``,
``AlbertForSequenceClassification`` and ``AlbertForTokenClassification``: BERT (`zoo.io.hf.bert`) plus

    factorized embeddings   tables of width embedding_size (E), then embedding_hidden_mapping_in (E -> C),
                            which is zoo's ``embedding.factorized_dim`` and ``encoder.embed_proj``
    cross-layer sharing     num_hidden_groups groups of inner_group_num layers; layer i runs group
                            i // (num_layers / groups). zoo shares cyclically, so only 1 group
                            (``encoder.share_layers``) or one per layer converts; inner_group_num 1
    layer names             encoder.albert_layer_groups.{i}.albert_layers.0: attention.{query, key, value,
                            dense, LayerNorm}, ffn, ffn_output, full_layer_layer_norm; the pooler a bare Linear
    MLM head                predictions.{dense (C -> E), LayerNorm, decoder (tied), bias}, config.hidden_act
    classifiers             BERT's: pooler -> dropout -> classifier per sequence, classifier per token;
                            the dropout is classifier_dropout_prob (0.1 when absent), never null for a
                            sequence head, so zoo's null (the model's dropout) is written as
                            hidden_dropout_prob and read back as null

The head classes prefix the body with ``albert.``. The pretraining checkpoints' sentence-order head
(``sop_classifier``) has no zoo counterpart and is dropped.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from zoo.io.hf.bert import BERT_DEFAULTS, Classifier, Layer, MLMHead, Variant, classes, mapping
from zoo.io.hf.classifier import Task, classifier_from_hf, classifier_to_hf
from zoo.io.hf.common import HFError, reject
from zoo.spec import EncoderSpec

DROPOUT_KEY = "classifier_dropout_prob"


def _read(config: Mapping[str, Any], names: set[str]) -> dict[str, Any]:
    reject(config, "inner_group_num", 1, why="zoo shares whole layers, not groups of several")
    num_layers, groups = config.get("num_hidden_layers", 12), config.get("num_hidden_groups", 1)
    if groups not in (1, num_layers):
        raise HFError(
            f"config.json num_hidden_groups={groups} is not supported: zoo shares one layer across all "
            f"{num_layers} layers (1 group) or none ({num_layers} groups)"
        )
    return {"encoder.share_layers": groups == 1 and num_layers > 1}


def _write(spec: EncoderSpec) -> dict[str, Any]:
    if spec.embedding.factorized_dim is None:
        raise HFError(
            "albert cannot express embedding.factorized_dim=None: ALBERT always projects E -> d_model"
        )
    stack = spec.stacks()["encoder"]
    return {"num_hidden_groups": 1 if stack.share_layers else stack.num_layers, "inner_group_num": 1}


def _classifier_in(config: Mapping[str, Any], task: Task, dropout: float) -> dict[str, Any]:
    return classifier_from_hf(
        config, task, pooling="pooler", dropout_key=DROPOUT_KEY, absent=0.1, model_dropout=dropout
    )


def _classifier_out(classifier: Classifier, spec: EncoderSpec) -> dict[str, Any]:
    return classifier_to_hf(classifier, dropout_key=DROPOUT_KEY, model_dropout=spec.dropout)


ALBERT = Variant(
    "albert",
    "albert.",
    classes("Albert"),
    BERT_DEFAULTS | {
        "vocab_size": 30000, "hidden_size": 4096, "num_attention_heads": 64, "intermediate_size": 16384,
        "hidden_act": "gelu_new", "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0,
        "embedding_size": 128, "bos_token_id": 2, "eos_token_id": 3,
    },
    MLMHead("predictions.", "predictions.dense", "predictions.LayerNorm", "predictions.bias", "predictions.decoder"),
    Layer(
        "encoder.albert_layer_groups.{}.albert_layers.0",
        ("attention.query", "attention.key", "attention.value"),
        "attention.dense", "attention.LayerNorm", "ffn", "ffn_output", "full_layer_layer_norm",
    ),
    pooler="pooler",
    sequence_tensor="pooler.weight",
    factorized="always",
    projection="encoder.embedding_hidden_mapping_in",
    bert_checks=False,
    ignored=(r"sop_classifier\.classifier\.(weight|bias)",),
    read=_read,
    write=_write,
    classifier_in=_classifier_in,
    classifier_out=_classifier_out,
)  # fmt: skip
MAPPING = mapping(ALBERT)
