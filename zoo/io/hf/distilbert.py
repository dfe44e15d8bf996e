"""DistilBERT (``model_type: distilbert``): ``DistilBertModel``, ``DistilBertForMaskedLM``,
``DistilBertForSequenceClassification`` and ``DistilBertForTokenClassification``.

transformers' ``models/distilbert/modeling_distilbert.py``: BERT's post-norm layer (`zoo.io.hf.bert`) under
other names and config keys (``dim``, ``n_layers``, ``n_heads``, ``hidden_dim``, ``activation``,
``dropout``), and

    no token types      zoo's ``embedding.segment_vocab_size: 0``
    positions           learned, from 0; ``sinusoidal_pos_embds`` only fills the stored table at init, so
                        such checkpoints import as learned positions (the table they hold) and export with
                        ``sinusoidal_pos_embds: false``
    LayerNorm eps       1e-12, hard-coded everywhere (no config key): another reads back as it
    layer names         transformer.layer.{i}: attention.{q_lin, k_lin, v_lin, out_lin}, sa_layer_norm,
                        ffn.{lin1, lin2}, output_layer_norm
    MLM head            vocab_transform -> activation -> vocab_layer_norm -> vocab_projector (tied), zoo's
                        MLM head with ``activation`` = the model's
    sequence head       hidden[:, 0] -> pre_classifier -> ReLU -> dropout (seq_classif_dropout) ->
                        classifier: zoo's ``pooling: pre_classifier`` with ``activation: relu``; a
                        seq_classif_dropout equal to ``dropout`` reads as null (the model's)
    token head          dropout (the model's ``dropout``; DistilBERT has no key for it) -> classifier

Head classes keep the body under ``distilbert.``; ``DistilBertModel`` (as sentence-transformers saves it)
has no prefix and no pooler.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from zoo.io.hf.bert import BERT_DEFAULTS, Classifier, Layer, MLMHead, Variant, classes, mapping
from zoo.io.hf.classifier import Task, classifier_from_hf, classifier_to_hf
from zoo.spec import EncoderSpec
from zoo.spec.model import SequenceClassifierSpec

DROPOUT_KEY = "seq_classif_dropout"
_ABSENT = 0.2  # DistilBertConfig's seq_classif_dropout


def _classifier_in(config: Mapping[str, Any], task: Task, dropout: float) -> dict[str, Any]:
    if task == "token":  # its dropout is the model's
        return classifier_from_hf(config, task, pooling="", dropout_key=DROPOUT_KEY) | {"dropout": None}
    return classifier_from_hf(
        config, task, pooling="pre_classifier", dropout_key=DROPOUT_KEY, absent=_ABSENT, model_dropout=dropout
    )


def _classifier_out(classifier: Classifier, spec: EncoderSpec) -> dict[str, Any]:
    sequence = isinstance(classifier, SequenceClassifierSpec)
    return classifier_to_hf(
        classifier, dropout_key=DROPOUT_KEY, model_dropout=spec.dropout if sequence else _ABSENT
    )


DISTILBERT = Variant(
    "distilbert",
    "distilbert.",
    classes("DistilBert"),
    BERT_DEFAULTS | {"num_hidden_layers": 6},
    MLMHead("vocab_", "vocab_transform", "vocab_layer_norm", "vocab_projector.bias", "vocab_projector"),
    Layer(
        "transformer.layer.{}", ("attention.q_lin", "attention.k_lin", "attention.v_lin"), "attention.out_lin",
        "sa_layer_norm", "ffn.lin1", "ffn.lin2", "output_layer_norm",
    ),
    sequence_pooling="pre_classifier",
    sequence_activation="relu",
    sequence_tensor="pre_classifier.weight",
    keys={
        "hidden_size": "dim", "num_hidden_layers": "n_layers", "num_attention_heads": "n_heads",
        "intermediate_size": "hidden_dim", "hidden_act": "activation", "hidden_dropout_prob": "dropout",
        "attention_probs_dropout_prob": "attention_dropout",
    },
    token_types=False,
    eps=1e-12,
    pooler=None,
    bert_checks=False,
    written={"sinusoidal_pos_embds": False},
    classifier_in=_classifier_in,
    classifier_out=_classifier_out,
)  # fmt: skip
MAPPING = mapping(DISTILBERT)
