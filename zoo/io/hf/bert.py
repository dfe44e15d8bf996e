"""BERT, RoBERTa and XLM-RoBERTa (``model_type: bert | roberta | xlm-roberta``): the bare body, with or without pooler, the MLM head, and
the sequence- and token-classification heads.

transformers' ``models/bert/modeling_bert.py`` and ``models/roberta/modeling_roberta.py``: post-norm
LayerNorm, learned positions, token-type embeddings and an embedding LayerNorm; separate query/key/value
matrices that zoo fuses into ``qkv_proj`` (rows [q; k; v]). The two differ only in names and two details:

    positions   BERT counts from 0; RoBERTa from padding_idx + 1 (fairseq), which is zoo's
                ``LearnedPositions(offset=pad_token_id + 1)`` with positions counted over the attention mask
    MLM head    BERT: cls.predictions.{transform.dense, transform.LayerNorm, bias} with config.hidden_act;
                RoBERTa: lm_head.{dense, layer_norm, bias} with exact GELU whatever hidden_act says
    sequence    BERT: pooler -> dropout -> classifier (zoo's ``pooling: pooler``); RoBERTa: no pooler,
    classifier  classifier.{dense, out_proj} over <s> (``pooling: dense``)

XLM-RoBERTa is RoBERTa's layout and math under another ``model_type`` and class names (``XLMRoberta*``, body
still under ``roberta.``): one more `Flavour` row. A spec exports as ``roberta`` unless ``model_type=
"xlm-roberta"`` is asked for, as both express it exactly. XLM-RoBERTa-XL (``xlm-roberta-xl``) is the pre-norm
variant: each layer normalises before attention (``attention.self_attn_layer_norm``) and before the FFN (the
layer's ``LayerNorm``), the stack ends in ``encoder.LayerNorm``, and the embeddings have no norm. Its FFN
branch has no dropout before the residual sum, where zoo's layers have one (training only: the outputs of a
model in eval mode are the same).

A token classifier is ``classifier`` over every token in both; label names, problem_type and
classifier_dropout go through `zoo.io.hf.classifier`. Head classes (``BertForMaskedLM``,
``*ForSequenceClassification``, ``*ForTokenClassification``) prefix the body with ``bert.`` (``roberta.``);
``BertModel`` checkpoints do not. The MLM decoder matrix is tied to the word embeddings. Google's original BERT checkpoints also hold the
next-sentence head (``cls.seq_relationship``): zoo has no NSP head, and that pretraining-only head is dropped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
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
from zoo.spec.errors import short_repr
from zoo.spec.model import SequenceClassifierSpec


@dataclass(frozen=True)
class Flavour:
    """What tells RoBERTa from BERT: names, position offset, the MLM head's activation."""

    model_type: str
    prefix: str  # the body's attribute in head classes
    classes: tuple[str, str]  # (bare body, masked LM)
    mlm: str  # the MLM head module
    mlm_dense: str
    mlm_norm: str
    mlm_activation: str | None  # fixed activation of the head; None: config.hidden_act
    offset_from_pad: bool  # positions start at pad_token_id + 1
    vocab_size: int  # transformers' config defaults
    pad_token_id: int
    ignored: tuple[str, ...] = ()  # pretraining-only tensors dropped on import
    classifiers: tuple[str, str] | None = None  # (sequence, token classification); None: not mapped
    sequence_pooling: str = "pooler"  # what the sequence classifier reads: the pooler, or its own dense
    pre_norm: bool = False  # XLM-RoBERTa-XL: pre-norm layers, a final norm, no embedding norm
    layer_norm_eps: float = 1e-12  # transformers' config defaults
    type_vocab_size: int = 2


BERT = Flavour(
    model_type="bert",
    prefix="bert.",
    classes=("BertModel", "BertForMaskedLM"),
    classifiers=("BertForSequenceClassification", "BertForTokenClassification"),
    sequence_pooling="pooler",
    mlm="cls.predictions",
    mlm_dense="transform.dense",
    mlm_norm="transform.LayerNorm",
    mlm_activation=None,
    offset_from_pad=False,
    vocab_size=30522,
    pad_token_id=0,
    ignored=(r"cls\.seq_relationship\.(weight|bias)",),
)
ROBERTA = Flavour(
    model_type="roberta",
    prefix="roberta.",
    classes=("RobertaModel", "RobertaForMaskedLM"),
    classifiers=("RobertaForSequenceClassification", "RobertaForTokenClassification"),
    sequence_pooling="dense",
    mlm="lm_head",
    mlm_dense="dense",
    mlm_norm="layer_norm",
    mlm_activation="gelu",
    offset_from_pad=True,
    vocab_size=50265,
    pad_token_id=1,
)
XLM_ROBERTA = replace(
    ROBERTA,
    model_type="xlm-roberta",
    classes=("XLMRobertaModel", "XLMRobertaForMaskedLM"),
    classifiers=("XLMRobertaForSequenceClassification", "XLMRobertaForTokenClassification"),
    vocab_size=30522,
)
XLM_ROBERTA_XL = replace(
    ROBERTA,
    model_type="xlm-roberta-xl",
    classes=("XLMRobertaXLModel", "XLMRobertaXLForMaskedLM"),
    classifiers=("XLMRobertaXLForSequenceClassification", "XLMRobertaXLForTokenClassification"),
    vocab_size=250880,
    pre_norm=True,
    layer_norm_eps=1e-5,
    type_vocab_size=1,
)
QKV = ("query", "key", "value")
_LEGACY_NORM = re.compile(r"(.*LayerNorm)\.(gamma|beta)")  # TF-era names transformers still accepts


def config_to_spec(flavour: Flavour, config: dict[str, Any], names: set[str]) -> ModelSpec:
    reject(config, "is_decoder", False, why="a causal BERT is not an encoder")
    reject(config, "add_cross_attention", False, why="an encoder has no cross-attention")
    reject(config, "position_embedding_type", "absolute", why="only absolute learned positions convert")
    body = {n.removeprefix(flavour.prefix) for n in names}
    pre = flavour.pre_norm
    vocab = config.get("vocab_size", flavour.vocab_size)
    pad = token_id(config, "pad_token_id", vocab, flavour.pad_token_id)
    offset = 0
    if flavour.offset_from_pad:
        if pad is None:  # transformers fails on null; a negative id would move every position's row
            raise HFError(
                f"config.json pad_token_id={short_repr(config.get('pad_token_id'))}: {flavour.model_type} "
                f"counts positions from pad_token_id + 1, so it must be a token id in [0, vocab_size={vocab})"
            )
        offset = pad + 1
    activation = activation_from_hf(config.get("hidden_act", "gelu"), field="hidden_act")
    has_mlm = any(n.startswith(f"{flavour.mlm}.") for n in names)
    task = (
        classifier_task(config, body, classes=flavour.classifiers, pooler="pooler.dense.weight")
        if flavour.classifiers
        else None
    )
    classifier = classifier_from_hf(config, task, pooling=flavour.sequence_pooling) if task else None
    mlm = {
        "activation": flavour.mlm_activation or activation,
        "tied": config.get("tie_word_embeddings", True),
    }
    return parse_spec({
        "family": "encoder",
        "vocab_size": vocab,
        "d_model": config.get("hidden_size", 768),
        "num_layers": config.get("num_hidden_layers", 12),
        "max_positions": config.get("max_position_embeddings", 512) - offset,
        "attention": {
            "num_heads": config.get("num_attention_heads", 12),
            "dropout": config.get("attention_probs_dropout_prob", 0.1),
        },
        "ffn": {"d_ff": config.get("intermediate_size", 3072), "activation": activation},
        "norm": {
            "kind": "layernorm",
            "eps": config.get("layer_norm_eps", flavour.layer_norm_eps),
            "placement": "pre" if pre else "post",
        },
        "position": {"kind": "learned", "offset": offset},
        "embedding": {"segment_vocab_size": config.get("type_vocab_size", flavour.type_vocab_size), "norm": not pre},
        "heads": {
            "pooler": "pooler.dense.weight" in body,
            "mlm": mlm if has_mlm else None,
            "classifier": classifier,
        },
        "dropout": config.get("hidden_dropout_prob", 0.1),
        "init": {"std": config.get("initializer_range", 0.02)},
        "pad_token_id": pad,
        "bos_token_id": token_id(config, "bos_token_id", vocab),
        "eos_token_id": token_id(config, "eos_token_id", vocab),
    })  # fmt: skip


def spec_to_config(flavour: Flavour, spec: ModelSpec) -> dict[str, Any]:
    family = flavour.model_type
    require(family, [("family", spec.family, "encoder")])
    assert isinstance(spec, EncoderSpec)
    stack = spec.stacks()["encoder"]
    attention, ffn, norm = stack.attention, stack.ffn, stack.norm
    offset = (spec.pad_token_id or 0) + 1 if flavour.offset_from_pad else 0
    mlm = spec.heads.mlm
    require(family, [
        *classic_layers(
            stack, spec.d_model, placement="pre" if flavour.pre_norm else "post", final=flavour.pre_norm,
            position_offset=offset,
        ),
        ("embedding.scale", spec.embedding.scale, False),
        ("embedding.norm", spec.embedding.norm, not flavour.pre_norm),
        ("embedding.factorized_dim", spec.embedding.factorized_dim, None),
        ("encoder.share_layers", stack.share_layers, False),
    ])  # fmt: skip
    if mlm is not None:
        require(family, [
            ("heads.mlm.activation", mlm.activation, flavour.mlm_activation or ffn.activation),
            ("heads.mlm.dense_bias", mlm.dense_bias, True),
            ("heads.mlm.bias", mlm.bias, True),
        ])  # fmt: skip
    classifier = spec.heads.classifier
    if classifier is not None and not flavour.classifiers:
        raise HFError(f"{family} cannot express heads.classifier: zoo maps no {family} classification head")
    if isinstance(classifier, SequenceClassifierSpec):
        require(family, [("heads.classifier.pooling", classifier.pooling, flavour.sequence_pooling)])
    if spec.embedding.segment_vocab_size == 0:
        raise HFError(
            f"{family} cannot express embedding.segment_vocab_size=0: Hugging Face {family} always has "
            "token-type embeddings (type_vocab_size >= 1)"
        )
    if classifier is not None and flavour.classifiers:
        head_class = flavour.classifiers[0 if classifier.task == "sequence" else 1]
    else:
        head_class = flavour.classes[1] if mlm else flavour.classes[0]
    return {
        "model_type": family,
        "architectures": [head_class],
        "vocab_size": spec.vocab_size,
        "hidden_size": spec.d_model,
        "num_hidden_layers": stack.num_layers,
        "num_attention_heads": attention.num_heads,
        "intermediate_size": ffn.d_ff,
        "hidden_act": ACTIVATIONS_TO_HF[ffn.activation],
        "hidden_dropout_prob": spec.dropout,
        "attention_probs_dropout_prob": attention.dropout,
        "max_position_embeddings": spec.max_positions + offset,
        "type_vocab_size": spec.embedding.segment_vocab_size,
        "layer_norm_eps": norm.eps,
        "initializer_range": spec.init.std,
        "position_embedding_type": "absolute",
        "tie_word_embeddings": mlm.tied if mlm else True,
        "pad_token_id": spec.pad_token_id,
        "bos_token_id": spec.bos_token_id,
        "eos_token_id": spec.eos_token_id,
        **(classifier_to_hf(classifier) if classifier is not None else {}),
    }


def tensor_rules(flavour: Flavour, spec: EncoderSpec, prefix: str) -> list[Rule]:
    """zoo <-> HF names; body names carry ``prefix`` (``bert.`` under the MLM head class)."""
    stack = spec.stacks()["encoder"]
    C = stack.attention.num_heads * stack.attention.resolved_head_dim(spec.d_model)
    emb = f"{prefix}embeddings"
    rules = [
        rename("embed.tokens.weight", f"{emb}.word_embeddings.weight"),
        rename("encoder.positions.weight", f"{emb}.position_embeddings.weight"),
    ]
    # post-norm: the norm after each branch; pre-norm (XL): the norm before it, and one after the stack
    attn_norm, ffn_norm = (
        ("attention.self_attn_layer_norm", "LayerNorm")
        if flavour.pre_norm
        else ("attention.output.LayerNorm", "output.LayerNorm")
    )
    if flavour.pre_norm:
        rules += layernorm("encoder.final_norm", f"{prefix}encoder.LayerNorm")
    else:
        rules += layernorm("encoder.embed_norm", f"{emb}.LayerNorm")
    if spec.embedding.segment_vocab_size:
        rules.append(rename("embed.segments.weight", f"{emb}.token_type_embeddings.weight"))
    for i in range(stack.num_layers):
        zoo, hf = f"encoder.layers.{i}", f"{prefix}encoder.layer.{i}"
        rules += [
            *fused_linear(f"{zoo}.self_attn.qkv_proj", [f"{hf}.attention.self.{n}" for n in QKV], (C, C, C)),
            *linear(f"{zoo}.self_attn.out_proj", f"{hf}.attention.output.dense"),
            *layernorm(f"{zoo}.self_attn_norm", f"{hf}.{attn_norm}"),
            *linear(f"{zoo}.ffn.up_proj", f"{hf}.intermediate.dense"),
            *linear(f"{zoo}.ffn.down_proj", f"{hf}.output.dense"),
            *layernorm(f"{zoo}.ffn_norm", f"{hf}.{ffn_norm}"),
        ]  # fmt: skip
    if spec.heads.pooler:
        rules += linear("pooler.dense", f"{prefix}pooler.dense")
    if spec.heads.mlm is not None:
        head = flavour.mlm
        rules += [
            *linear("mlm_head.dense", f"{head}.{flavour.mlm_dense}"),
            *layernorm("mlm_head.norm", f"{head}.{flavour.mlm_norm}"),
        ]
        if spec.heads.mlm.tied:  # decoder.weight is the embedding, decoder.bias is tied to {head}.bias
            rules.append(rename("mlm_head.bias", f"{head}.bias"))
        else:  # untied, the decoder's own bias is the one the forward adds
            rules += linear("mlm_head", f"{head}.decoder")
    rules += classifier_rules(spec.heads.classifier)
    return rules


def _hf_to_zoo(flavour: Flavour, tensors: StateDict, spec: ModelSpec) -> StateDict:
    assert isinstance(spec, EncoderSpec)
    tensors = {
        _LEGACY_NORM.sub(lambda m: f"{m[1]}.{'weight' if m[2] == 'gamma' else 'bias'}", n): t
        for n, t in tensors.items()
    }
    head = re.escape(flavour.mlm)
    mlm = spec.heads.mlm
    # A tied head may still store its decoder (copies of the embedding and bias: used only when equal); an
    # untied one keeps an unused {head}.bias beside the decoder's own.
    extra = [rf"{head}\.decoder\.(weight|bias)"] if mlm is None else [] if mlm.tied else [rf"{head}\.bias"]
    return rules_to_zoo(
        tensor_rules(flavour, spec, ""),
        strip_prefix(tensors, flavour.prefix),
        ignore=[*flavour.ignored, *extra],
        tied=mlm_copies(flavour.mlm) if mlm is not None and mlm.tied else {},
    )


def _zoo_to_hf(flavour: Flavour, tensors: StateDict, spec: ModelSpec) -> StateDict:
    assert isinstance(spec, EncoderSpec)
    mlm = spec.heads.mlm
    headed = mlm is not None or spec.heads.classifier is not None  # head classes prefix the body
    out = rules_to_hf(tensor_rules(flavour, spec, flavour.prefix if headed else ""), tensors)
    if mlm is not None and not mlm.tied:  # transformers expects both biases even when untied
        out[f"{flavour.mlm}.bias"] = out[f"{flavour.mlm}.decoder.bias"].clone()
    return out


def _mapping(flavour: Flavour) -> FamilyMapping:
    return FamilyMapping(
        model_types=(flavour.model_type,),
        config_to_spec=lambda config, names: config_to_spec(flavour, config, names),
        spec_to_config=lambda spec: spec_to_config(flavour, spec),
        hf_to_zoo=lambda tensors, spec: _hf_to_zoo(flavour, tensors, spec),
        zoo_to_hf=lambda tensors, spec: _zoo_to_hf(flavour, tensors, spec),
    )


MAPPINGS = [_mapping(BERT), _mapping(ROBERTA), _mapping(XLM_ROBERTA), _mapping(XLM_ROBERTA_XL)]
