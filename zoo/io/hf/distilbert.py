"""DistilBERT (``model_type: distilbert``): ``DistilBertModel``, ``DistilBertForMaskedLM``,
``DistilBertForSequenceClassification`` and ``DistilBertForTokenClassification``.

transformers' ``models/distilbert/modeling_distilbert.py``: BERT's post-norm layer under other names and
config keys (``dim``, ``n_layers``, ``n_heads``, ``hidden_dim``, ``activation``, ``dropout``), and

    no token types      zoo's ``embedding.segment_vocab_size: 0``
    positions           learned, from 0; ``sinusoidal_pos_embds`` only fills the stored table at init, so
                        such checkpoints import as learned positions (the table they hold) and export with
                        ``sinusoidal_pos_embds: false``
    LayerNorm eps       1e-12, hard-coded everywhere (no config key): other values are refused on export
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

from typing import Any

from zoo.io.hf.classifier import classifier_from_hf, classifier_task, classifier_to_hf
from zoo.io.hf.common import (
    ACTIVATIONS_TO_HF,
    FamilyMapping,
    Rule,
    StateDict,
    activation_from_hf,
    classic_layers,
    fused_linear,
    layernorm,
    linear,
    rename,
    require,
    rules_to_hf,
    rules_to_zoo,
    strip_prefix,
    token_id,
)
from zoo.spec import EncoderSpec, ModelSpec, parse_spec
from zoo.spec.model import SequenceClassifierSpec

PREFIX = "distilbert."
QKV = ("q_lin", "k_lin", "v_lin")
BARE, HEADED = "DistilBertModel", "DistilBertForMaskedLM"
CLASSIFIERS = ("DistilBertForSequenceClassification", "DistilBertForTokenClassification")
DROPOUT_KEY = "seq_classif_dropout"
EPS = 1e-12  # every DistilBERT LayerNorm


def config_to_spec(config: dict[str, Any], names: set[str]) -> ModelSpec:
    vocab = config.get("vocab_size", 30522)
    activation = activation_from_hf(config.get("activation", "gelu"), field="activation")
    body = {n.removeprefix(PREFIX) for n in names}
    dropout = config.get("dropout", 0.1)
    task = classifier_task(config, body, classes=CLASSIFIERS, pooler="pre_classifier.weight")
    classifier = None
    if task == "sequence":
        classifier = classifier_from_hf(
            config, task, pooling="pre_classifier", dropout_key=DROPOUT_KEY, absent=0.2, model_dropout=dropout
        ) | {"activation": "relu"}
    elif task == "token":  # its dropout is the model's
        classifier = classifier_from_hf(config, task, pooling="", dropout_key=DROPOUT_KEY) | {"dropout": None}
    has_mlm = any(n.startswith("vocab_") for n in names)
    return parse_spec({
        "family": "encoder",
        "vocab_size": vocab,
        "d_model": config.get("dim", 768),
        "num_layers": config.get("n_layers", 6),
        "max_positions": config.get("max_position_embeddings", 512),
        "attention": {"num_heads": config.get("n_heads", 12), "dropout": config.get("attention_dropout", 0.1)},
        "ffn": {"d_ff": config.get("hidden_dim", 3072), "activation": activation},
        "norm": {"kind": "layernorm", "eps": EPS, "placement": "post"},
        "position": {"kind": "learned"},
        "embedding": {"segment_vocab_size": 0, "norm": True},
        "heads": {
            "mlm": {"activation": activation, "tied": config.get("tie_word_embeddings", True)} if has_mlm else None,
            "classifier": classifier,
        },
        "dropout": dropout,
        "init": {"std": config.get("initializer_range", 0.02)},
        "pad_token_id": token_id(config, "pad_token_id", vocab, 0),
        "bos_token_id": token_id(config, "bos_token_id", vocab),
        "eos_token_id": token_id(config, "eos_token_id", vocab),
    })  # fmt: skip


def spec_to_config(spec: ModelSpec) -> dict[str, Any]:
    require("distilbert", [("family", spec.family, "encoder")])
    assert isinstance(spec, EncoderSpec)
    stack = spec.stacks()["encoder"]
    attention, ffn = stack.attention, stack.ffn
    mlm, classifier = spec.heads.mlm, spec.heads.classifier
    checks = [
        *classic_layers(stack, spec.d_model, placement="post", final=False, position_offset=0),
        (f"{stack.sources['norm']}.eps", stack.norm.eps, EPS),
        ("embedding.scale", spec.embedding.scale, False),
        ("embedding.norm", spec.embedding.norm, True),
        ("embedding.segment_vocab_size", spec.embedding.segment_vocab_size, 0),
        ("embedding.factorized_dim", spec.embedding.factorized_dim, None),
        ("encoder.share_layers", stack.share_layers, False),
        ("heads.pooler", spec.heads.pooler, False),
    ]
    if mlm is not None:
        checks.append(("heads.mlm.activation", mlm.activation, ffn.activation))
    if isinstance(classifier, SequenceClassifierSpec):
        checks += [
            ("heads.classifier.pooling", classifier.pooling, "pre_classifier"),
            ("heads.classifier.activation", classifier.activation, "relu"),
        ]
    elif classifier is not None:  # a token head drops out at the model's rate
        checks.append(("heads.classifier.dropout", classifier.dropout, (None, spec.dropout)))
    require("distilbert", checks)
    if classifier is not None:
        head_class = CLASSIFIERS[0 if classifier.task == "sequence" else 1]
    else:
        head_class = HEADED if mlm else BARE
    extra = (
        classifier_to_hf(classifier, dropout_key=DROPOUT_KEY, model_dropout=spec.dropout)
        if isinstance(classifier, SequenceClassifierSpec)
        else classifier_to_hf(classifier, dropout_key=DROPOUT_KEY, model_dropout=0.2)
        if classifier is not None
        else {}
    )
    return {
        "model_type": "distilbert",
        "architectures": [head_class],
        "vocab_size": spec.vocab_size,
        "dim": spec.d_model,
        "n_layers": stack.num_layers,
        "n_heads": attention.num_heads,
        "hidden_dim": ffn.d_ff,
        "activation": ACTIVATIONS_TO_HF[ffn.activation],
        "dropout": spec.dropout,
        "attention_dropout": attention.dropout,
        "max_position_embeddings": spec.max_positions,
        "sinusoidal_pos_embds": False,
        "initializer_range": spec.init.std,
        "tie_word_embeddings": mlm.tied if mlm else True,
        "pad_token_id": spec.pad_token_id,
        "bos_token_id": spec.bos_token_id,
        "eos_token_id": spec.eos_token_id,
        **extra,
    }


def _rules(spec: EncoderSpec, prefix: str) -> list[Rule]:
    """zoo <-> HF names; body names carry ``prefix`` (``distilbert.`` under the head classes)."""
    stack = spec.stacks()["encoder"]
    C = stack.attention.num_heads * stack.attention.resolved_head_dim(spec.d_model)
    emb = f"{prefix}embeddings"
    rules = [
        rename("embed.tokens.weight", f"{emb}.word_embeddings.weight"),
        rename("encoder.positions.weight", f"{emb}.position_embeddings.weight"),
        *layernorm("encoder.embed_norm", f"{emb}.LayerNorm"),
    ]
    for i in range(stack.num_layers):
        zoo, hf = f"encoder.layers.{i}", f"{prefix}transformer.layer.{i}"
        rules += [
            *fused_linear(f"{zoo}.self_attn.qkv_proj", [f"{hf}.attention.{n}" for n in QKV], (C, C, C)),
            *linear(f"{zoo}.self_attn.out_proj", f"{hf}.attention.out_lin"),
            *layernorm(f"{zoo}.self_attn_norm", f"{hf}.sa_layer_norm"),
            *linear(f"{zoo}.ffn.up_proj", f"{hf}.ffn.lin1"),
            *linear(f"{zoo}.ffn.down_proj", f"{hf}.ffn.lin2"),
            *layernorm(f"{zoo}.ffn_norm", f"{hf}.output_layer_norm"),
        ]  # fmt: skip
    mlm, classifier = spec.heads.mlm, spec.heads.classifier
    if mlm is not None:
        rules += [
            *linear("mlm_head.dense", "vocab_transform"),
            *layernorm("mlm_head.norm", "vocab_layer_norm"),
            rename("mlm_head.bias", "vocab_projector.bias"),
        ]
        if not mlm.tied:
            rules.append(rename("mlm_head.weight", "vocab_projector.weight"))
    if isinstance(classifier, SequenceClassifierSpec):
        rules += linear("classifier.dense", "pre_classifier")
    if classifier is not None:
        rules += linear("classifier.out_proj", "classifier")
    return rules


def hf_to_zoo(tensors: StateDict, spec: ModelSpec) -> StateDict:
    assert isinstance(spec, EncoderSpec)
    mlm = spec.heads.mlm
    ignore = [r"vocab_projector\.weight"] if mlm is None else []  # a headless body's unused projection
    tied = (
        {"vocab_projector.weight": "embed.tokens.weight"} if mlm is not None and mlm.tied else {}
    )  # used if equal
    return rules_to_zoo(_rules(spec, ""), strip_prefix(tensors, PREFIX), ignore=ignore, tied=tied)


def zoo_to_hf(tensors: StateDict, spec: ModelSpec) -> StateDict:
    assert isinstance(spec, EncoderSpec)
    headed = spec.heads.mlm is not None or spec.heads.classifier is not None  # head classes prefix the body
    return rules_to_hf(_rules(spec, PREFIX if headed else ""), tensors)


MAPPING = FamilyMapping(
    model_types=("distilbert",),
    config_to_spec=config_to_spec,
    spec_to_config=spec_to_config,
    hf_to_zoo=hf_to_zoo,
    zoo_to_hf=zoo_to_hf,
)
