"""The BERT family: ``bert``, ``roberta``, ``xlm-roberta`` and ``xlm-roberta-xl`` here, and every encoder written
as BERT plus what differs: ``albert``, ``electra``, ``distilbert``, ``mpnet``, ``big_bird`` (a `Variant` row in
its own module). The bare body (with or without pooler), the MLM head, ELECTRA's discriminator, and the
sequence- and token-classification heads.

transformers' ``models/bert/modeling_bert.py``: post-norm LayerNorm, learned positions, token-type embeddings
and an embedding LayerNorm; separate query/key/value matrices that zoo fuses into ``qkv_proj`` (rows
[q; k; v]). What a variant changes is data in its row, and a function only where data cannot say it:

    model_type      positions       token types  norms                  config keys         MLM head (activation)
    bert            from 0          yes          post, embedding norm   BERT's              cls.predictions (hidden_act)
    roberta         pad + 1         yes          post, embedding norm   BERT's              lm_head (gelu)
    xlm-roberta     pad + 1         yes          post, embedding norm   BERT's              lm_head (gelu)
    xlm-roberta-xl  pad + 1         yes          pre, a final norm      BERT's              lm_head (gelu)
    albert          from 0          yes          post, embedding norm   + embedding_size    predictions (hidden_act)
    electra         from 0          yes          post, embedding norm   + embedding_size    generator_* (gelu)
    distilbert      from 0          no           post, eps 1e-12        dim, n_layers, ...  vocab_* (activation)
    mpnet           2 (pad 1)       no           post, embedding norm   BERT's              lm_head (gelu)
    big_bird        from 0          yes          post, embedding norm   + attention_type    cls.predictions (hidden_act)

RoBERTa counts positions from padding_idx + 1 (fairseq): zoo's ``LearnedPositions(offset=pad_token_id + 1)``
with positions counted over the attention mask; a config without a pad_token_id in the vocabulary is refused
(transformers fails on it). Each row also names the layer's tensors (`Layer`), the pooler, the head classes
and their module prefix (``bert.``, ``roberta.``, ...: a bare ``*Model`` checkpoint has none), the
pretraining-only tensors dropped on import (BERT's next-sentence head ``cls.seq_relationship``), and the
sequence classifier: BERT's ``pooler -> dropout -> classifier`` (``pooling: pooler``), RoBERTa's
``classifier.{dense, out_proj}`` over <s> (``pooling: dense``). A token classifier is ``classifier`` over
every token; label names, problem_type and the classifier dropout go through `zoo.io.hf.classifier`. A tied
MLM decoder is the word embeddings. XLM-RoBERTa is RoBERTa's layout and math under other class names (body
still under ``roberta.``); a spec exports as ``roberta`` unless ``model_type="xlm-roberta"`` is asked for.
XLM-RoBERTa-XL normalises before attention (``attention.self_attn_layer_norm``) and before the FFN (the
layer's ``LayerNorm``), ends in ``encoder.LayerNorm`` and has no embedding norm; its FFN branch has no
dropout before the residual sum, where zoo's layers have one (training only).

A spec is written as the variant holds it; what it cannot hold reads back otherwise, and the export guard
names it (`zoo.io.hf.faithful`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from zoo.io.hf.classifier import Task, classifier_from_hf, classifier_rules, classifier_task, classifier_to_hf
from zoo.io.hf.common import (
    ACTIVATIONS_TO_HF,
    FamilyMapping,
    HFError,
    Rule,
    StateDict,
    activation_from_hf,
    fused_linear,
    layernorm,
    linear,
    reject,
    rename,
    require,
    rules_to_hf,
    rules_to_zoo,
    strip_prefix,
    token_id,
)
from zoo.spec import EncoderSpec, ModelSpec, RelativeBiasSpec, parse_spec
from zoo.spec.errors import short_repr
from zoo.spec.model import ImageClassifierSpec, SequenceClassifierSpec, TokenClassifierSpec

Classifier = (
    SequenceClassifierSpec | TokenClassifierSpec | ImageClassifierSpec
)  # image: refused by embedding_kinds


@dataclass(frozen=True)
class Layer:
    """A layer's tensor names: ``path`` (``{}``: the layer's index) and the modules under it."""

    path: str
    qkv: tuple[str, str, str]
    out: str
    attn_norm: str  # post-norm: after attention; pre-norm: before it
    up: str
    down: str
    ffn_norm: str


@dataclass(frozen=True)
class MLMHead:
    """A masked-LM head's tensor names (outside the body's prefix). ``marker`` starts each of them (a
    checkpoint holding one has the head); ``bias`` is what a tied head adds, ``decoder`` the vocabulary
    projection an untied head has (weight and bias: transformers expects both biases then)."""

    marker: str
    dense: str
    norm: str
    bias: str
    decoder: str


@dataclass(frozen=True)
class Variant:
    """What one ``model_type`` of the family says, and how: a row of the module docstring's table.

    classes: the class of each head (``body``, ``mlm``, ``sequence``, ``token``, ``replaced_token``);
    without ``sequence`` no classifier is mapped. defaults: the config class's defaults by BERT's key,
    for keys a config.json leaves out (their types are what `common.TypedConfig` checks); keys: BERT's key
    -> this variant's (DistilBERT's ``dim``...). position_offset: the learned table's first row (None:
    pad_token_id + 1). eps: a fixed LayerNorm eps (no config key). factorized: embeddings narrower than the
    model, ``embedding_size`` (``always``: ALBERT; ``unless_equal``: ELECTRA, which has no projection when
    embedding_size is hidden_size); projection: the module that maps them up. written: fixed config fields.
    read / write: what the variant reads or writes beyond this table (spec overrides from the config;
    config fields from the spec, or HFError for what it cannot write at all). classifier_in /
    classifier_out: its classifier's config fields, where they are not BERT's.
    """

    model_type: str
    prefix: str  # the body's attribute in head classes
    classes: dict[str, str]
    defaults: dict[str, Any]
    mlm: MLMHead
    layer: Layer
    mlm_activation: str | None = None  # fixed activation of the MLM head; None: the model's
    sequence_pooling: str = "pooler"  # what the sequence classifier reads: the pooler, or its own dense
    sequence_activation: str | None = None  # fixed activation of the sequence head's dense
    # a tensor (body prefix stripped) that tells a sequence head from a token one where architectures does not
    sequence_tensor: str = "pooler.dense.weight"
    keys: dict[str, str] = field(default_factory=dict)
    position_offset: int | None = 0
    padding_idx: bool = True  # the embedding takes pad_token_id as its padding_idx (`common.token_id`)
    relative_bias: tuple[str, RelativeBiasSpec] | None = None  # MPNet's table (its name) beside positions
    token_types: bool = True
    pre_norm: bool = False
    eps: float | None = None
    pooler: str | None = "pooler.dense"
    factorized: Literal["never", "always", "unless_equal"] = "never"
    projection: str | None = None
    discriminator: str | None = None  # ELECTRA's replaced-token head
    bert_checks: bool = True  # refuse BERT's causal and relative-position keys on import
    name: str = "BERT"  # in those refusals
    legacy_norms: bool = False  # accept TF-era LayerNorm.gamma / beta names
    ignored: tuple[str, ...] = ()  # pretraining-only tensors dropped on import
    written: dict[str, Any] = field(default_factory=dict)
    read: Callable[[Mapping[str, Any], set[str]], dict[str, Any]] | None = None
    write: Callable[[EncoderSpec], dict[str, Any]] | None = None
    classifier_in: Callable[[Mapping[str, Any], Task, float], dict[str, Any]] | None = None
    classifier_out: Callable[[Classifier, EncoderSpec], dict[str, Any]] | None = None

    def key(self, bert_key: str) -> str:
        return self.keys.get(bert_key, bert_key)


BERT_LAYER = Layer(
    "encoder.layer.{}",
    ("attention.self.query", "attention.self.key", "attention.self.value"),
    "attention.output.dense",
    "attention.output.LayerNorm",
    "intermediate.dense",
    "output.dense",
    "output.LayerNorm",
)
BERT_MLM = MLMHead(
    "cls.predictions.",
    "cls.predictions.transform.dense",
    "cls.predictions.transform.LayerNorm",
    "cls.predictions.bias",
    "cls.predictions.decoder",
)
ROBERTA_MLM = MLMHead("lm_head.", "lm_head.dense", "lm_head.layer_norm", "lm_head.bias", "lm_head.decoder")
# BertConfig's defaults, by key
BERT_DEFAULTS: dict[str, Any] = {
    "vocab_size": 30522, "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
    "intermediate_size": 3072, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
    "attention_probs_dropout_prob": 0.1, "max_position_embeddings": 512, "type_vocab_size": 2,
    "layer_norm_eps": 1e-12, "pad_token_id": 0, "bos_token_id": None, "eos_token_id": None,
}  # fmt: skip
NSP = r"cls\.seq_relationship\.(weight|bias)"  # the next-sentence head: no zoo counterpart
ABSOLUTE = {"position_embedding_type": "absolute"}


def classes(name: str, *, classifiers: bool = True) -> dict[str, str]:
    """The head classes named ``{name}Model``, ``{name}ForMaskedLM`` and (``classifiers``) the classifiers."""
    heads = {"body": "Model", "mlm": "ForMaskedLM"}
    if classifiers:
        heads |= {"sequence": "ForSequenceClassification", "token": "ForTokenClassification"}
    return {head: f"{name}{suffix}" for head, suffix in heads.items()}


BERT = Variant(
    "bert", "bert.", classes("Bert"), BERT_DEFAULTS, BERT_MLM, BERT_LAYER, legacy_norms=True, ignored=(NSP,),
    written=ABSOLUTE,
)  # fmt: skip
ROBERTA = Variant(
    "roberta", "roberta.", classes("Roberta"), BERT_DEFAULTS | {"vocab_size": 50265, "pad_token_id": 1},
    ROBERTA_MLM, BERT_LAYER, mlm_activation="gelu", sequence_pooling="dense", position_offset=None,
    legacy_norms=True, written=ABSOLUTE,
)  # fmt: skip
XLM_ROBERTA = replace(ROBERTA, model_type="xlm-roberta", classes=classes("XLMRoberta"), defaults=BERT_DEFAULTS | {
    "pad_token_id": 1,
})  # fmt: skip
XLM_ROBERTA_XL = replace(
    ROBERTA, model_type="xlm-roberta-xl", classes=classes("XLMRobertaXL"), pre_norm=True,
    defaults=ROBERTA.defaults | {"vocab_size": 250880, "layer_norm_eps": 1e-5, "type_vocab_size": 1},
    layer=replace(BERT_LAYER, attn_norm="attention.self_attn_layer_norm", ffn_norm="LayerNorm"),
)  # fmt: skip
_LEGACY_NORM = re.compile(r"(.*LayerNorm)\.(gamma|beta)")  # TF-era names transformers still accepts


# -- config -> spec ----------------------------------------------------------------------------------------


def config_to_spec(variant: Variant, config: dict[str, Any], names: set[str]) -> ModelSpec:
    changes = variant.read(config, names) if variant.read else {}  # first: its own checks
    if variant.bert_checks:
        reject(config, "is_decoder", False, why=f"a causal {variant.name} is not an encoder")
        reject(config, "add_cross_attention", False, why="an encoder has no cross-attention")
        reject(config, "position_embedding_type", "absolute", why="only absolute learned positions convert")

    def get(key: str) -> Any:  # BERT's key, read under the variant's name with its default
        return config.get(variant.key(key), variant.defaults[key])

    body = {n.removeprefix(variant.prefix) for n in names}
    pre = variant.pre_norm
    vocab = get("vocab_size")
    pad = token_id(
        config, "pad_token_id", vocab, variant.defaults["pad_token_id"], padding_idx=variant.padding_idx
    )
    offset = variant.position_offset
    if offset is None:  # RoBERTa's positions count from pad_token_id + 1
        if pad is None:  # transformers fails on null; a negative id would move every position's row
            raise HFError(
                f"config.json pad_token_id={short_repr(config.get('pad_token_id'))}: {variant.model_type} "
                f"counts positions from pad_token_id + 1, so it must be a token id in [0, vocab_size={vocab})"
            )
        offset = pad + 1
    activation = activation_from_hf(get("hidden_act"), field=variant.key("hidden_act"))
    d_model, dropout = get("hidden_size"), get("hidden_dropout_prob")
    has_mlm = any(n.startswith(variant.mlm.marker) for n in names)
    discriminator = variant.discriminator
    task = (
        classifier_task(config, body, classes=_classifier_classes(variant), pooler=variant.sequence_tensor)
        if "sequence" in variant.classes
        else None
    )
    mlm = {
        "activation": variant.mlm_activation or activation,
        "tied": config.get("tie_word_embeddings", True),
    }
    factorized = get("embedding_size") if variant.factorized != "never" else None
    position: dict[str, Any] = {"kind": "learned", "offset": offset}
    if variant.relative_bias is not None:
        position["relative_bias"] = variant.relative_bias[1].model_dump()
    spec = parse_spec({
        "family": "encoder",
        "vocab_size": vocab,
        "d_model": d_model,
        "num_layers": get("num_hidden_layers"),
        "max_positions": get("max_position_embeddings") - offset,
        "attention": {
            "num_heads": get("num_attention_heads"),
            "dropout": get("attention_probs_dropout_prob"),
        },
        "ffn": {"d_ff": get("intermediate_size"), "activation": activation},
        "norm": {
            "kind": "layernorm",
            "eps": variant.eps if variant.eps is not None else get("layer_norm_eps"),
            "placement": "pre" if pre else "post",
        },
        "position": position,
        "embedding": {
            "segment_vocab_size": get("type_vocab_size") if variant.token_types else 0,
            "norm": not pre,
            "factorized_dim": factorized if variant.factorized == "always" or factorized != d_model else None,
        },
        "heads": {
            "pooler": variant.pooler is not None and f"{variant.pooler}.weight" in body,
            "mlm": mlm if has_mlm else None,
            "classifier": _classifier_in(variant, config, task, dropout) if task else None,
            # from the tensors, not architectures: a body saved alone may keep the head class's name
            "replaced_token": {"activation": activation}
            if discriminator and any(n.startswith(f"{discriminator}.") for n in names)
            else None,
        },
        "dropout": dropout,
        "init": {"std": config.get("initializer_range", 0.02)},
        "pad_token_id": pad,
        "bos_token_id": token_id(config, "bos_token_id", vocab, variant.defaults["bos_token_id"]),
        "eos_token_id": token_id(config, "eos_token_id", vocab, variant.defaults["eos_token_id"]),
    })  # fmt: skip
    return spec.override(**changes) if changes else spec


def _classifier_classes(variant: Variant) -> tuple[str, str]:
    return variant.classes["sequence"], variant.classes["token"]


def _classifier_in(variant: Variant, config: Mapping[str, Any], task: Task, dropout: float) -> dict[str, Any]:
    if variant.classifier_in is not None:
        classifier = variant.classifier_in(config, task, dropout)
    else:
        classifier = classifier_from_hf(config, task, pooling=variant.sequence_pooling)
    if task == "sequence" and variant.sequence_activation is not None:
        classifier["activation"] = variant.sequence_activation
    return classifier


# -- spec -> config ----------------------------------------------------------------------------------------


def spec_to_config(variant: Variant, spec: ModelSpec) -> dict[str, Any]:
    family = variant.model_type
    require(family, [("family", spec.family, "encoder")])
    assert isinstance(spec, EncoderSpec)
    stack = spec.stacks()["encoder"]
    attention, ffn, heads = stack.attention, stack.ffn, spec.heads
    mlm, classifier = heads.mlm, heads.classifier
    if classifier is not None and "sequence" not in variant.classes:
        raise HFError(f"{family} cannot express heads.classifier: zoo maps no {family} classification head")
    if variant.token_types and spec.embedding.segment_vocab_size == 0:
        raise HFError(
            f"{family} cannot express embedding.segment_vocab_size=0: Hugging Face {family} always has "
            "token-type embeddings (type_vocab_size >= 1)"
        )
    extra = variant.write(spec) if variant.write else {}
    offset = (spec.pad_token_id or 0) + 1 if variant.position_offset is None else variant.position_offset
    config = {
        "model_type": family,
        "architectures": [_head_class(variant, spec)],
        "vocab_size": spec.vocab_size,
        **({"embedding_size": spec.embedding_dim} if variant.factorized != "never" else {}),
        "hidden_size": spec.d_model,
        "num_hidden_layers": stack.num_layers,
        "num_attention_heads": attention.num_heads,
        "intermediate_size": ffn.d_ff,
        "hidden_act": ACTIVATIONS_TO_HF[ffn.activation],
        "hidden_dropout_prob": spec.dropout,
        "attention_probs_dropout_prob": attention.dropout,
        "max_position_embeddings": spec.max_positions + offset,
        **({"type_vocab_size": spec.embedding.segment_vocab_size} if variant.token_types else {}),
        **({"layer_norm_eps": stack.norm.eps} if variant.eps is None else {}),
        "initializer_range": spec.init.std,
        "tie_word_embeddings": mlm.tied if mlm else True,
        "pad_token_id": spec.pad_token_id,
        "bos_token_id": spec.bos_token_id,
        "eos_token_id": spec.eos_token_id,
        **variant.written,
        **extra,
        **(_classifier_out(variant, classifier, spec) if classifier is not None else {}),
    }
    return {variant.key(key): value for key, value in config.items()}


def _head_class(variant: Variant, spec: EncoderSpec) -> str:
    heads = spec.heads
    if heads.classifier is not None:
        return variant.classes[heads.classifier.task]
    if heads.mlm is not None:
        return variant.classes["mlm"]
    if heads.replaced_token is not None and "replaced_token" in variant.classes:
        return variant.classes["replaced_token"]
    return variant.classes["body"]


def _classifier_out(variant: Variant, classifier: Classifier, spec: EncoderSpec) -> dict[str, Any]:
    if variant.classifier_out is not None:
        return variant.classifier_out(classifier, spec)
    return classifier_to_hf(classifier)


# -- tensors -----------------------------------------------------------------------------------------------


def tensor_rules(variant: Variant, spec: EncoderSpec, prefix: str) -> list[Rule]:
    """zoo <-> HF names; body names carry ``prefix`` (``bert.`` under the head classes)."""
    stack = spec.stacks()["encoder"]
    attention = stack.attention
    C = attention.num_heads * attention.resolved_head_dim(spec.d_model)
    emb = f"{prefix}embeddings"
    rules = [
        rename("embed.tokens.weight", f"{emb}.word_embeddings.weight"),
        rename("encoder.positions.weight", f"{emb}.position_embeddings.weight"),
    ]
    if variant.pre_norm:  # XL: no embedding norm, one after the stack
        rules += layernorm("encoder.final_norm", f"{prefix}encoder.LayerNorm")
    else:
        rules += layernorm("encoder.embed_norm", f"{emb}.LayerNorm")
    if spec.embedding.segment_vocab_size:
        rules.append(rename("embed.segments.weight", f"{emb}.token_type_embeddings.weight"))
    if spec.embedding.factorized_dim and variant.projection:
        rules += linear("encoder.embed_proj", f"{prefix}{variant.projection}")
    if variant.relative_bias is not None:
        rules.append(rename("encoder.position_bias.weight", f"{prefix}{variant.relative_bias[0]}.weight"))
    layer = variant.layer
    for i in range(1 if stack.share_layers else stack.num_layers):  # ALBERT's group i holds layer i
        zoo, hf = f"encoder.layers.{i}", f"{prefix}{layer.path.format(i)}"
        qkv = [f"{hf}.{name}" for name in layer.qkv]
        rules += [
            *fused_linear(f"{zoo}.self_attn.qkv_proj", qkv, (C, C, C), bias=attention.bias),
            *linear(f"{zoo}.self_attn.out_proj", f"{hf}.{layer.out}"),
            *layernorm(f"{zoo}.self_attn_norm", f"{hf}.{layer.attn_norm}"),
            *linear(f"{zoo}.ffn.up_proj", f"{hf}.{layer.up}"),
            *linear(f"{zoo}.ffn.down_proj", f"{hf}.{layer.down}"),
            *layernorm(f"{zoo}.ffn_norm", f"{hf}.{layer.ffn_norm}"),
        ]
    heads = spec.heads
    if heads.pooler and variant.pooler:
        rules += linear("pooler.dense", f"{prefix}{variant.pooler}")
    if heads.mlm is not None:
        names = variant.mlm
        rules += [*linear("mlm_head.dense", names.dense), *layernorm("mlm_head.norm", names.norm)]
        if heads.mlm.tied:  # the decoder's weight is the embedding, its bias tied to the head's
            rules.append(rename("mlm_head.bias", names.bias))
        else:  # untied, the decoder's own bias is the one the forward adds
            rules += linear("mlm_head", names.decoder)
    if heads.replaced_token is not None and variant.discriminator:
        rules += [
            *linear("replaced_token_head.dense", f"{variant.discriminator}.dense"),
            *linear("replaced_token_head.out_proj", f"{variant.discriminator}.dense_prediction"),
        ]
    return rules + classifier_rules(heads.classifier)


def hf_to_zoo(variant: Variant, tensors: StateDict, spec: ModelSpec) -> StateDict:
    assert isinstance(spec, EncoderSpec)
    if variant.legacy_norms:
        tensors = {
            _LEGACY_NORM.sub(lambda m: f"{m[1]}.{'weight' if m[2] == 'gamma' else 'bias'}", n): t
            for n, t in tensors.items()
        }
    names, mlm = variant.mlm, spec.heads.mlm
    # A tied head may still store its decoder (copies of the embedding and bias: used only when equal); an
    # untied one keeps an unused bias beside the decoder's own.
    decoder = re.escape(names.decoder)
    extra = [rf"{decoder}\.(weight|bias)"] if mlm is None else [] if mlm.tied else [re.escape(names.bias)]
    body = strip_prefix(tensors, variant.prefix)
    tied = _mlm_copies(names) if mlm is not None and mlm.tied else {}
    return rules_to_zoo(tensor_rules(variant, spec, ""), body, ignore=[*variant.ignored, *extra], tied=tied)


def _mlm_copies(names: MLMHead) -> dict[str, str]:
    """The tensors a tied MLM head may store as copies (`common.check_tied_copies`): the decoder's weight
    (the embeddings) and, where the head adds a bias of its own beside the decoder's, the decoder's bias
    (DistilBERT's and ELECTRA's decoder bias is the head's bias itself, read by the rules)."""
    copies = {f"{names.decoder}.weight": "embed.tokens.weight"}
    if names.bias != f"{names.decoder}.bias":
        copies[f"{names.decoder}.bias"] = "mlm_head.bias"
    return copies


def zoo_to_hf(variant: Variant, tensors: StateDict, spec: ModelSpec) -> StateDict:
    assert isinstance(spec, EncoderSpec)
    heads = spec.heads
    headed = any(h is not None for h in (heads.mlm, heads.classifier, heads.replaced_token))
    out = rules_to_hf(tensor_rules(variant, spec, variant.prefix if headed else ""), tensors)
    names, mlm = variant.mlm, heads.mlm
    own_bias = f"{names.decoder}.bias"
    if mlm is not None and not mlm.tied and names.bias != own_bias and own_bias in out:
        out[names.bias] = out[own_bias].clone()  # transformers expects both biases even when untied
    return out


def mapping(variant: Variant) -> FamilyMapping:
    """The `FamilyMapping` of one row."""
    return FamilyMapping(
        model_types=(variant.model_type,),
        config_to_spec=lambda config, names: config_to_spec(variant, config, names),
        spec_to_config=lambda spec: spec_to_config(variant, spec),
        hf_to_zoo=lambda tensors, spec: hf_to_zoo(variant, tensors, spec),
        zoo_to_hf=lambda tensors, spec: zoo_to_hf(variant, tensors, spec),
    )


MAPPINGS = [mapping(BERT), mapping(ROBERTA), mapping(XLM_ROBERTA), mapping(XLM_ROBERTA_XL)]
