"""MPNet (``model_type: mpnet``): ``MPNetModel`` (with its pooler; what sentence-transformers saves, e.g.
all-mpnet-base-v2), ``MPNetForMaskedLM``, ``MPNetForSequenceClassification`` and
``MPNetForTokenClassification``.

transformers' ``models/mpnet/modeling_mpnet.py``: BERT's post-norm layer (`zoo.io.hf.bert`) without token
types, and two position signals at once, which zoo writes as one position spec:

    position: {kind: learned, offset: 2, relative_bias: {num_buckets: 32, max_distance: 128}}

    learned table     RoBERTa's: positions counted over the real tokens from padding_idx + 1 = 2 (MPNet
                      hard-codes padding_idx 1, whatever pad_token_id says, so only pad_token_id 1 exports)
    relative bias     T5's bidirectional buckets (the same bucket function as zoo's `RelativeBias`), one
                      table ``encoder.relative_attention_bias`` (buckets x heads) computed once per forward
                      and added to every layer's logits. transformers always buckets with 32 buckets and
                      max_distance 128 (``compute_position_bias``'s defaults), whatever
                      relative_attention_num_buckets says, so only 32 converts.

Names: ``encoder.layer.N.attention.attn.{q, k, v, o}``, ``attention.LayerNorm``, ``intermediate.dense``,
``output.{dense, LayerNorm}``. Heads: the MLM head is RoBERTa's (``lm_head.{dense, layer_norm, decoder,
bias}``, exact GELU); the sequence head RoBERTa's ``classifier.{dense, out_proj}`` with tanh; the token head
``classifier``. Both classifiers drop out at hidden_dropout_prob (MPNet has no classifier_dropout), so
their zoo ``dropout`` is null. Head classes keep the body under ``mpnet.``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from zoo.io.hf.bert import BERT_DEFAULTS, ROBERTA_MLM, Classifier, Layer, Variant, classes, mapping
from zoo.io.hf.classifier import Task, classifier_from_hf, classifier_to_hf
from zoo.io.hf.common import HFError, require
from zoo.spec import EncoderSpec, RelativeBiasSpec

OFFSET = 2  # padding_idx (always 1) + 1
BIAS = RelativeBiasSpec(num_buckets=32, max_distance=128)  # what MPNetEncoder.compute_position_bias uses


def _read(config: Mapping[str, Any], names: set[str]) -> dict[str, Any]:
    buckets = config.get("relative_attention_num_buckets", 32)
    if buckets != BIAS.num_buckets:
        raise HFError(
            f"config.json relative_attention_num_buckets={buckets} is not supported: transformers' MPNet "
            f"buckets relative positions into {BIAS.num_buckets} whatever the table holds; zoo needs "
            f"{BIAS.num_buckets}"
        )
    return {}


def _write(spec: EncoderSpec) -> dict[str, Any]:
    # positions are counted past token id 1, hard-coded: another pad id reads back the same, computes otherwise
    require("mpnet", [("pad_token_id", spec.pad_token_id, 1)])
    return {}


def _classifier_in(config: Mapping[str, Any], task: Task, dropout: float) -> dict[str, Any]:
    # both heads drop out at hidden_dropout_prob: the model's dropout
    return classifier_from_hf(config, task, pooling="dense", dropout_key="") | {"dropout": None}


def _classifier_out(classifier: Classifier, spec: EncoderSpec) -> dict[str, Any]:
    config = classifier_to_hf(classifier)
    config.pop("classifier_dropout", None)  # MPNet has none: its heads use hidden_dropout_prob
    return config


MPNET = Variant(
    "mpnet",
    "mpnet.",
    classes("MPNet"),
    BERT_DEFAULTS | {"vocab_size": 30527, "pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2},
    ROBERTA_MLM,
    Layer(
        "encoder.layer.{}", ("attention.attn.q", "attention.attn.k", "attention.attn.v"), "attention.attn.o",
        "attention.LayerNorm", "intermediate.dense", "output.dense", "output.LayerNorm",
    ),
    mlm_activation="gelu",
    sequence_pooling="dense",
    sequence_tensor="",
    position_offset=OFFSET,
    padding_idx=False,  # its embedding's padding_idx is 1 whatever pad_token_id says
    relative_bias=("encoder.relative_attention_bias", BIAS),
    token_types=False,
    bert_checks=False,
    written={"relative_attention_num_buckets": BIAS.num_buckets},
    read=_read,
    write=_write,
    classifier_in=_classifier_in,
    classifier_out=_classifier_out,
)  # fmt: skip
MAPPING = mapping(MPNET)
