"""ELECTRA (``model_type: electra``): ``ElectraModel``, the discriminator ``ElectraForPreTraining``, the
generator ``ElectraForMaskedLM``, ``ElectraForSequenceClassification`` and ``ElectraForTokenClassification``.

transformers' ``models/electra/modeling_electra.py``: BERT's post-norm layer and names (under ``electra.``),
and

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

PREFIX = "electra."
QKV = ("query", "key", "value")
BARE, DISCRIMINATOR, GENERATOR = "ElectraModel", "ElectraForPreTraining", "ElectraForMaskedLM"
CLASSIFIERS = ("ElectraForSequenceClassification", "ElectraForTokenClassification")


def config_to_spec(config: dict[str, Any], names: set[str]) -> ModelSpec:
    reject(config, "is_decoder", False, why="a causal ELECTRA is not an encoder")
    reject(config, "add_cross_attention", False, why="an encoder has no cross-attention")
    reject(config, "position_embedding_type", "absolute", why="only absolute learned positions convert")
    vocab = config.get("vocab_size", 30522)
    hidden, embedding = config.get("hidden_size", 256), config.get("embedding_size", 128)
    activation = activation_from_hf(config.get("hidden_act", "gelu"), field="hidden_act")
    body = {n.removeprefix(PREFIX) for n in names}
    task = classifier_task(config, body, classes=CLASSIFIERS, pooler="")
    classifier = classifier_from_hf(config, task, pooling="dense") if task else None
    if classifier is not None and task == "sequence":
        classifier["activation"] = "gelu"
    # From the tensors, not architectures: a body saved alone (sentence-transformers) may keep the head
    # class's name in its config.
    generator = any(n.startswith("generator_predictions.") for n in names)
    discriminator = any(n.startswith("discriminator_predictions.") for n in names)
    return parse_spec({
        "family": "encoder",
        "vocab_size": vocab,
        "d_model": hidden,
        "num_layers": config.get("num_hidden_layers", 12),
        "max_positions": config.get("max_position_embeddings", 512),
        "attention": {
            "num_heads": config.get("num_attention_heads", 4),
            "dropout": config.get("attention_probs_dropout_prob", 0.1),
        },
        "ffn": {"d_ff": config.get("intermediate_size", 1024), "activation": activation},
        "norm": {"kind": "layernorm", "eps": config.get("layer_norm_eps", 1e-12), "placement": "post"},
        "position": {"kind": "learned"},
        "embedding": {
            "segment_vocab_size": config.get("type_vocab_size", 2),
            "norm": True,
            "factorized_dim": embedding if embedding != hidden else None,
        },
        "heads": {
            "mlm": {"activation": "gelu", "tied": config.get("tie_word_embeddings", True)} if generator else None,
            "replaced_token": {"activation": activation} if discriminator else None,
            "classifier": classifier,
        },
        "dropout": config.get("hidden_dropout_prob", 0.1),
        "init": {"std": config.get("initializer_range", 0.02)},
        "pad_token_id": token_id(config, "pad_token_id", vocab, 0),
        "bos_token_id": token_id(config, "bos_token_id", vocab),
        "eos_token_id": token_id(config, "eos_token_id", vocab),
    })  # fmt: skip


def spec_to_config(spec: ModelSpec) -> dict[str, Any]:
    require("electra", [("family", spec.family, "encoder")])
    assert isinstance(spec, EncoderSpec)
    stack = spec.stacks()["encoder"]
    attention, ffn = stack.attention, stack.ffn
    heads = spec.heads
    mlm, classifier, replaced = heads.mlm, heads.classifier, heads.replaced_token
    checks = [
        *classic_layers(stack, spec.d_model, placement="post", final=False, position_offset=0),
        ("embedding.scale", spec.embedding.scale, False),
        ("embedding.norm", spec.embedding.norm, True),
        ("encoder.share_layers", stack.share_layers, False),
        ("heads.pooler", heads.pooler, False),
    ]
    if mlm is not None:
        checks.append(("heads.mlm.activation", mlm.activation, "gelu"))
    if replaced is not None:
        checks.append(("heads.replaced_token.activation", replaced.activation, ffn.activation))
    if isinstance(classifier, SequenceClassifierSpec):
        checks += [
            ("heads.classifier.pooling", classifier.pooling, "dense"),
            ("heads.classifier.activation", classifier.activation, "gelu"),
        ]
    require("electra", checks)
    if spec.embedding.factorized_dim == spec.d_model:
        raise HFError(
            f"electra cannot express embedding.factorized_dim={spec.d_model} (= d_model): ELECTRA projects the "
            "embeddings only when embedding_size differs from hidden_size; use factorized_dim: null"
        )
    if spec.embedding.segment_vocab_size == 0:
        raise HFError(
            "electra cannot express embedding.segment_vocab_size=0: Hugging Face electra always has "
            "token-type embeddings (type_vocab_size >= 1)"
        )
    if classifier is not None:
        head_class = CLASSIFIERS[0 if classifier.task == "sequence" else 1]
    else:
        head_class = GENERATOR if mlm else DISCRIMINATOR if replaced else BARE
    return {
        "model_type": "electra",
        "architectures": [head_class],
        "vocab_size": spec.vocab_size,
        "embedding_size": spec.embedding_dim,
        "hidden_size": spec.d_model,
        "num_hidden_layers": stack.num_layers,
        "num_attention_heads": attention.num_heads,
        "intermediate_size": ffn.d_ff,
        "hidden_act": ACTIVATIONS_TO_HF[ffn.activation],
        "hidden_dropout_prob": spec.dropout,
        "attention_probs_dropout_prob": attention.dropout,
        "max_position_embeddings": spec.max_positions,
        "type_vocab_size": spec.embedding.segment_vocab_size,
        "layer_norm_eps": stack.norm.eps,
        "initializer_range": spec.init.std,
        "tie_word_embeddings": mlm.tied if mlm else True,
        "pad_token_id": spec.pad_token_id,
        "bos_token_id": spec.bos_token_id,
        "eos_token_id": spec.eos_token_id,
        **(classifier_to_hf(classifier) if classifier is not None else {}),
    }


def _rules(spec: EncoderSpec, prefix: str) -> list[Rule]:
    """zoo <-> HF names; body names carry ``prefix`` (``electra.`` under the head classes)."""
    stack = spec.stacks()["encoder"]
    C = stack.attention.num_heads * stack.attention.resolved_head_dim(spec.d_model)
    emb = f"{prefix}embeddings"
    rules = [
        rename("embed.tokens.weight", f"{emb}.word_embeddings.weight"),
        rename("embed.segments.weight", f"{emb}.token_type_embeddings.weight"),
        rename("encoder.positions.weight", f"{emb}.position_embeddings.weight"),
        *layernorm("encoder.embed_norm", f"{emb}.LayerNorm"),
    ]
    if spec.embedding.factorized_dim:
        rules += linear("encoder.embed_proj", f"{prefix}embeddings_project")
    for i in range(stack.num_layers):
        zoo, hf = f"encoder.layers.{i}", f"{prefix}encoder.layer.{i}"
        rules += [
            *fused_linear(f"{zoo}.self_attn.qkv_proj", [f"{hf}.attention.self.{n}" for n in QKV], (C, C, C)),
            *linear(f"{zoo}.self_attn.out_proj", f"{hf}.attention.output.dense"),
            *layernorm(f"{zoo}.self_attn_norm", f"{hf}.attention.output.LayerNorm"),
            *linear(f"{zoo}.ffn.up_proj", f"{hf}.intermediate.dense"),
            *linear(f"{zoo}.ffn.down_proj", f"{hf}.output.dense"),
            *layernorm(f"{zoo}.ffn_norm", f"{hf}.output.LayerNorm"),
        ]  # fmt: skip
    heads = spec.heads
    if heads.mlm is not None:
        rules += [
            *linear("mlm_head.dense", "generator_predictions.dense"),
            *layernorm("mlm_head.norm", "generator_predictions.LayerNorm"),
            rename("mlm_head.bias", "generator_lm_head.bias"),
        ]
        if not heads.mlm.tied:
            rules.append(rename("mlm_head.weight", "generator_lm_head.weight"))
    if heads.replaced_token is not None:
        rules += [
            *linear("replaced_token_head.dense", "discriminator_predictions.dense"),
            *linear("replaced_token_head.out_proj", "discriminator_predictions.dense_prediction"),
        ]
    rules += classifier_rules(heads.classifier)
    return rules


def hf_to_zoo(tensors: StateDict, spec: ModelSpec) -> StateDict:
    assert isinstance(spec, EncoderSpec)
    mlm = spec.heads.mlm
    ignore = [r"generator_lm_head\.weight"] if mlm is None else []  # a headless body's unused projection
    tied = (
        {"generator_lm_head.weight": "embed.tokens.weight"} if mlm is not None and mlm.tied else {}
    )  # used if equal
    return rules_to_zoo(_rules(spec, ""), strip_prefix(tensors, PREFIX), ignore=ignore, tied=tied)


def zoo_to_hf(tensors: StateDict, spec: ModelSpec) -> StateDict:
    assert isinstance(spec, EncoderSpec)
    heads = spec.heads
    headed = any(h is not None for h in (heads.mlm, heads.classifier, heads.replaced_token))
    return rules_to_hf(_rules(spec, PREFIX if headed else ""), tensors)


MAPPING = FamilyMapping(
    model_types=("electra",),
    config_to_spec=config_to_spec,
    spec_to_config=spec_to_config,
    hf_to_zoo=hf_to_zoo,
    zoo_to_hf=zoo_to_hf,
)
