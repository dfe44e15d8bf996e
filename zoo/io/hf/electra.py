"""ELECTRA (``model_type: electra``): ``ElectraModel``, the discriminator ``ElectraForPreTraining``, the
generator ``ElectraForMaskedLM``, ``ElectraForSequenceClassification`` and ``ElectraForTokenClassification``.

transformers' ``models/electra/modeling_electra.py``: BERT (`zoo.io.hf.bert`: its post-norm layer and names,
under ``electra.``) plus

    factorised embeddings   tables and their LayerNorm at embedding_size (E); when E differs from
                            hidden_size (C), ``embeddings_project`` (E -> C, biased) follows: zoo's
                            ``embedding.factorized_dim`` and ``encoder.embed_proj``, as ALBERT's (when E == C
                            there is no projection, and factorized_dim is null)
    discriminator head      discriminator_predictions: dense (C -> C) -> hidden_act -> dense_prediction
                            (C -> 1), one logit per token: zoo's ``heads.replaced_token``; its loss is binary
                            cross-entropy over the real tokens of the mask
    generator head          generator_predictions: dense (C -> E) -> exact GELU (whatever hidden_act says) ->
                            LayerNorm; generator_lm_head (E -> V, tied to the word embeddings, biased): zoo's
                            MLM head with ``activation: gelu``
    sequence head           classifier.{dense, out_proj} over the first token, GELU where RoBERTa has tanh:
                            ``pooling: dense``, ``activation: gelu``
    token head              BERT's: dropout -> classifier

No pooler: ``ElectraModel`` has none. ``classifier_dropout`` (null: hidden_dropout_prob) is the classifiers'
dropout, as in BERT.
"""

from __future__ import annotations

from typing import Any

from zoo.io.hf.bert import BERT_DEFAULTS, BERT_LAYER, MLMHead, Variant, classes, mapping
from zoo.io.hf.common import HFError
from zoo.spec import EncoderSpec


def _write(spec: EncoderSpec) -> dict[str, Any]:
    if spec.embedding.factorized_dim == spec.d_model:
        raise HFError(
            f"electra cannot express embedding.factorized_dim={spec.d_model} (= d_model): ELECTRA projects the "
            "embeddings only when embedding_size differs from hidden_size; use factorized_dim: null"
        )
    return {}


ELECTRA = Variant(
    "electra",
    "electra.",
    classes("Electra") | {"replaced_token": "ElectraForPreTraining"},
    BERT_DEFAULTS | {
        "hidden_size": 256, "num_attention_heads": 4, "intermediate_size": 1024, "embedding_size": 128,
    },
    MLMHead(
        "generator_predictions.", "generator_predictions.dense", "generator_predictions.LayerNorm",
        "generator_lm_head.bias", "generator_lm_head",
    ),
    BERT_LAYER,
    mlm_activation="gelu",
    sequence_pooling="dense",
    sequence_activation="gelu",
    sequence_tensor="",
    pooler=None,
    factorized="unless_equal",
    projection="embeddings_project",
    discriminator="discriminator_predictions",
    name="ELECTRA",
    write=_write,
)  # fmt: skip
MAPPING = mapping(ELECTRA)
