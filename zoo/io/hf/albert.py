"""ALBERT (``model_type: albert``): ``AlbertModel`` (with its pooler), ``AlbertForMaskedLM``,
``AlbertForSequenceClassification`` and ``AlbertForTokenClassification``.

transformers' ``models/albert/modeling_albert.py``: BERT's post-norm layer, plus

    factorized embeddings   tables of width embedding_size (E), then embedding_hidden_mapping_in (E -> C),
                            which is zoo's ``embedding.factorized_dim`` and ``encoder.embed_proj``
    cross-layer sharing     num_hidden_groups groups of inner_group_num layers; layer i runs group
                            i // (num_layers / groups). zoo shares cyclically, so only 1 group
                            (``encoder.share_layers``) or one per layer converts; inner_group_num 1
    MLM head                predictions.{dense (C -> E), LayerNorm, decoder (tied), bias}, config.hidden_act
    classifiers             BERT's: pooler -> dropout -> classifier per sequence, classifier per token;
                            the dropout is classifier_dropout_prob (0.1 when absent), never null for a
                            sequence head, so zoo's null (the model's dropout) is written as
                            hidden_dropout_prob and read back as null

The head classes prefix the body with ``albert.``. The pretraining checkpoints' sentence-order head
(``sop_classifier``) has no zoo counterpart and is dropped.
"""

from __future__ import annotations

from typing import Any

from zoo.io.hf.classifier import classifier_from_hf, classifier_rules, classifier_task, classifier_to_hf
from zoo.io.hf.common import (
    ACTIVATIONS_TO_HF,
    FamilyMapping,
    HFError,
    Rule,
    StateDict,
    activation_from_hf,
    classic_layers,
    fused_linear,
    layernorm,
    linear,
    mlm_copies,
    reject,
    rename,
    require,
    rules_to_hf,
    rules_to_zoo,
    strip_prefix,
    token_id,
)
from zoo.spec import EncoderSpec, ModelSpec, parse_spec
from zoo.spec.model import SequenceClassifierSpec

PREFIX = "albert."
QKV = ("query", "key", "value")
HEADED = "AlbertForMaskedLM"
CLASSIFIERS = ("AlbertForSequenceClassification", "AlbertForTokenClassification")
DROPOUT_KEY = "classifier_dropout_prob"


def config_to_spec(config: dict[str, Any], names: set[str]) -> ModelSpec:
    reject(config, "inner_group_num", 1, why="zoo shares whole layers, not groups of several")
    num_layers, groups = config.get("num_hidden_layers", 12), config.get("num_hidden_groups", 1)
    if groups not in (1, num_layers):
        raise HFError(
            f"config.json num_hidden_groups={groups} is not supported: zoo shares one layer across all "
            f"{num_layers} layers (1 group) or none ({num_layers} groups)"
        )
    vocab = config.get("vocab_size", 30000)
    activation = activation_from_hf(config.get("hidden_act", "gelu_new"), field="hidden_act")
    body = {n.removeprefix(PREFIX) for n in names}
    has_mlm = any(n.startswith("predictions.") for n in names)
    dropout = config.get("hidden_dropout_prob", 0.0)
    task = classifier_task(config, body, classes=CLASSIFIERS, pooler="pooler.weight")
    classifier = (
        classifier_from_hf(
            config, task, pooling="pooler", dropout_key=DROPOUT_KEY, absent=0.1, model_dropout=dropout
        )
        if task
        else None
    )
    return parse_spec({
        "family": "encoder",
        "vocab_size": vocab,
        "d_model": config.get("hidden_size", 4096),
        "num_layers": num_layers,
        "max_positions": config.get("max_position_embeddings", 512),
        "encoder": {"share_layers": groups == 1 and num_layers > 1},
        "attention": {
            "num_heads": config.get("num_attention_heads", 64),
            "dropout": config.get("attention_probs_dropout_prob", 0.0),
        },
        "ffn": {"d_ff": config.get("intermediate_size", 16384), "activation": activation},
        "norm": {"kind": "layernorm", "eps": config.get("layer_norm_eps", 1e-12), "placement": "post"},
        "position": {"kind": "learned"},
        "embedding": {
            "segment_vocab_size": config.get("type_vocab_size", 2),
            "norm": True,
            "factorized_dim": config.get("embedding_size", 128),
        },
        "heads": {
            "pooler": "pooler.weight" in body,
            "mlm": {"activation": activation, "tied": config.get("tie_word_embeddings", True)}
            if has_mlm
            else None,
            "classifier": classifier,
        },
        "dropout": dropout,
        "init": {"std": config.get("initializer_range", 0.02)},
        "pad_token_id": token_id(config, "pad_token_id", vocab, 0),
        "bos_token_id": token_id(config, "bos_token_id", vocab, 2),
        "eos_token_id": token_id(config, "eos_token_id", vocab, 3),
    })  # fmt: skip


def spec_to_config(spec: ModelSpec) -> dict[str, Any]:
    require("albert", [("family", spec.family, "encoder")])
    assert isinstance(spec, EncoderSpec)
    stack = spec.stacks()["encoder"]
    attention, ffn, norm = stack.attention, stack.ffn, stack.norm
    mlm = spec.heads.mlm
    if spec.embedding.factorized_dim is None:
        raise HFError(
            "albert cannot express embedding.factorized_dim=None: ALBERT always projects E -> d_model"
        )
    require("albert", [
        *classic_layers(stack, spec.d_model, placement="post", final=False, position_offset=0),
        ("embedding.scale", spec.embedding.scale, False),
        ("embedding.norm", spec.embedding.norm, True),
    ])  # fmt: skip
    if mlm is not None:
        require("albert", [
            ("heads.mlm.activation", mlm.activation, ffn.activation),
            ("heads.mlm.dense_bias", mlm.dense_bias, True),
            ("heads.mlm.bias", mlm.bias, True),
        ])  # fmt: skip
    classifier = spec.heads.classifier
    if isinstance(classifier, SequenceClassifierSpec):
        require("albert", [("heads.classifier.pooling", classifier.pooling, "pooler")])
    if spec.embedding.segment_vocab_size == 0:
        raise HFError(
            "albert cannot express embedding.segment_vocab_size=0: Hugging Face albert always has "
            "token-type embeddings (type_vocab_size >= 1)"
        )
    if classifier is not None:
        head_class = CLASSIFIERS[0 if classifier.task == "sequence" else 1]
    else:
        head_class = HEADED if mlm else "AlbertModel"
    extra = (
        classifier_to_hf(classifier, dropout_key=DROPOUT_KEY, model_dropout=spec.dropout)
        if classifier is not None
        else {}
    )
    return {
        "model_type": "albert",
        "architectures": [head_class],
        "vocab_size": spec.vocab_size,
        "embedding_size": spec.embedding.factorized_dim,
        "hidden_size": spec.d_model,
        "num_hidden_layers": stack.num_layers,
        "num_hidden_groups": 1 if stack.share_layers else stack.num_layers,
        "inner_group_num": 1,
        "num_attention_heads": attention.num_heads,
        "intermediate_size": ffn.d_ff,
        "hidden_act": ACTIVATIONS_TO_HF[ffn.activation],
        "hidden_dropout_prob": spec.dropout,
        "attention_probs_dropout_prob": attention.dropout,
        "max_position_embeddings": spec.max_positions,
        "type_vocab_size": spec.embedding.segment_vocab_size,
        "layer_norm_eps": norm.eps,
        "initializer_range": spec.init.std,
        "tie_word_embeddings": mlm.tied if mlm else True,
        "pad_token_id": spec.pad_token_id,
        "bos_token_id": spec.bos_token_id,
        "eos_token_id": spec.eos_token_id,
        **extra,
    }


def _rules(spec: EncoderSpec, prefix: str) -> list[Rule]:
    """zoo <-> HF names; body names carry ``prefix`` (``albert.`` under the head classes)."""
    stack = spec.stacks()["encoder"]
    C = stack.attention.num_heads * stack.attention.resolved_head_dim(spec.d_model)
    emb, enc = f"{prefix}embeddings", f"{prefix}encoder"
    rules = [
        rename("embed.tokens.weight", f"{emb}.word_embeddings.weight"),
        rename("embed.segments.weight", f"{emb}.token_type_embeddings.weight"),
        rename("encoder.positions.weight", f"{emb}.position_embeddings.weight"),
        *layernorm("encoder.embed_norm", f"{emb}.LayerNorm"),
        *linear("encoder.embed_proj", f"{enc}.embedding_hidden_mapping_in"),
    ]
    for i in range(1 if stack.share_layers else stack.num_layers):  # group i holds layer i
        zoo, hf = f"encoder.layers.{i}", f"{enc}.albert_layer_groups.{i}.albert_layers.0"
        rules += [
            *fused_linear(f"{zoo}.self_attn.qkv_proj", [f"{hf}.attention.{n}" for n in QKV], (C, C, C)),
            *linear(f"{zoo}.self_attn.out_proj", f"{hf}.attention.dense"),
            *layernorm(f"{zoo}.self_attn_norm", f"{hf}.attention.LayerNorm"),
            *linear(f"{zoo}.ffn.up_proj", f"{hf}.ffn"),
            *linear(f"{zoo}.ffn.down_proj", f"{hf}.ffn_output"),
            *layernorm(f"{zoo}.ffn_norm", f"{hf}.full_layer_layer_norm"),
        ]  # fmt: skip
    if spec.heads.pooler:
        rules += linear("pooler.dense", f"{prefix}pooler")
    if spec.heads.mlm is not None:
        rules += [
            *linear("mlm_head.dense", "predictions.dense"),
            *layernorm("mlm_head.norm", "predictions.LayerNorm"),
        ]
        if spec.heads.mlm.tied:  # decoder.weight is the embedding, decoder.bias is tied to predictions.bias
            rules.append(rename("mlm_head.bias", "predictions.bias"))
        else:
            rules += linear("mlm_head", "predictions.decoder")
    rules += classifier_rules(spec.heads.classifier)
    return rules


def hf_to_zoo(tensors: StateDict, spec: ModelSpec) -> StateDict:
    assert isinstance(spec, EncoderSpec)
    mlm = spec.heads.mlm
    extra = (
        [r"predictions\.decoder\.(weight|bias)"]
        if mlm is None
        else []
        if mlm.tied
        else [r"predictions\.bias"]
    )
    ignore = [r"sop_classifier\.classifier\.(weight|bias)", *extra]
    tied = mlm_copies("predictions") if mlm is not None and mlm.tied else {}  # used only when equal
    return rules_to_zoo(_rules(spec, ""), strip_prefix(tensors, PREFIX), ignore=ignore, tied=tied)


def zoo_to_hf(tensors: StateDict, spec: ModelSpec) -> StateDict:
    assert isinstance(spec, EncoderSpec)
    mlm = spec.heads.mlm
    headed = mlm is not None or spec.heads.classifier is not None  # head classes prefix the body
    out = rules_to_hf(_rules(spec, PREFIX if headed else ""), tensors)
    if mlm is not None and not mlm.tied:  # transformers expects both biases even when untied
        out["predictions.bias"] = out["predictions.decoder.bias"].clone()
    return out


MAPPING = FamilyMapping(
    model_types=("albert",),
    config_to_spec=config_to_spec,
    spec_to_config=spec_to_config,
    hf_to_zoo=hf_to_zoo,
    zoo_to_hf=zoo_to_hf,
)
