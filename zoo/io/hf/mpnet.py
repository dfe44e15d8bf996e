"""MPNet (``model_type: mpnet``): ``MPNetModel`` (with its pooler; what sentence-transformers saves, e.g.
all-mpnet-base-v2), ``MPNetForMaskedLM``, ``MPNetForSequenceClassification`` and
``MPNetForTokenClassification``.

transformers' ``models/mpnet/modeling_mpnet.py``: BERT's post-norm layer without token types, and two
position signals at once, which zoo writes as one position spec:

    position: {kind: learned, offset: 2, relative_bias: {num_buckets: 32, max_distance: 128}}

    learned table     RoBERTa's: positions counted over the real tokens from padding_idx + 1 = 2 (MPNet
                      hard-codes padding_idx 1, whatever pad_token_id says)
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
    rename,
    require,
    rules_to_hf,
    rules_to_zoo,
    strip_prefix,
    token_id,
)
from zoo.spec import EncoderSpec, ModelSpec, RelativeBiasSpec, parse_spec
from zoo.spec.model import SequenceClassifierSpec

PREFIX = "mpnet."
QKV = ("q", "k", "v")
BARE, HEADED = "MPNetModel", "MPNetForMaskedLM"
CLASSIFIERS = ("MPNetForSequenceClassification", "MPNetForTokenClassification")
OFFSET = 2  # padding_idx (always 1) + 1
BIAS = RelativeBiasSpec(num_buckets=32, max_distance=128)  # what MPNetEncoder.compute_position_bias uses


def config_to_spec(config: dict[str, Any], names: set[str]) -> ModelSpec:
    buckets = config.get("relative_attention_num_buckets", 32)
    if buckets != BIAS.num_buckets:
        raise HFError(
            f"config.json relative_attention_num_buckets={buckets} is not supported: transformers' MPNet "
            f"buckets relative positions into {BIAS.num_buckets} whatever the table holds; zoo needs "
            f"{BIAS.num_buckets}"
        )
    vocab = config.get("vocab_size", 30527)
    activation = activation_from_hf(config.get("hidden_act", "gelu"), field="hidden_act")
    body = {n.removeprefix(PREFIX) for n in names}
    task = classifier_task(config, body, classes=CLASSIFIERS, pooler="")
    classifier = None
    if task is not None:  # both heads drop out at hidden_dropout_prob: the model's dropout
        classifier = classifier_from_hf(config, task, pooling="dense", dropout_key="") | {"dropout": None}
    has_mlm = any(n.startswith("lm_head.") for n in names)
    return parse_spec({
        "family": "encoder",
        "vocab_size": vocab,
        "d_model": config.get("hidden_size", 768),
        "num_layers": config.get("num_hidden_layers", 12),
        "max_positions": config.get("max_position_embeddings", 512) - OFFSET,
        "attention": {
            "num_heads": config.get("num_attention_heads", 12),
            "dropout": config.get("attention_probs_dropout_prob", 0.1),
        },
        "ffn": {"d_ff": config.get("intermediate_size", 3072), "activation": activation},
        "norm": {"kind": "layernorm", "eps": config.get("layer_norm_eps", 1e-12), "placement": "post"},
        "position": {"kind": "learned", "offset": OFFSET, "relative_bias": BIAS.model_dump()},
        "embedding": {"segment_vocab_size": 0, "norm": True},
        "heads": {
            "pooler": "pooler.dense.weight" in body,
            "mlm": {"activation": "gelu", "tied": config.get("tie_word_embeddings", True)} if has_mlm else None,
            "classifier": classifier,
        },
        "dropout": config.get("hidden_dropout_prob", 0.1),
        "init": {"std": config.get("initializer_range", 0.02)},
        "pad_token_id": token_id(config, "pad_token_id", vocab, 1, padding_idx=False),  # padding_idx is 1
        "bos_token_id": token_id(config, "bos_token_id", vocab, 0),
        "eos_token_id": token_id(config, "eos_token_id", vocab, 2),
    })  # fmt: skip


def spec_to_config(spec: ModelSpec) -> dict[str, Any]:
    require("mpnet", [("family", spec.family, "encoder")])
    assert isinstance(spec, EncoderSpec)
    stack = spec.stacks()["encoder"]
    attention, ffn, position = stack.attention, stack.ffn, stack.position
    mlm, classifier = spec.heads.mlm, spec.heads.classifier
    checks = [
        *classic_layers(stack, spec.d_model, placement="post", final=False, position_offset=OFFSET),
        (f"{stack.sources['position']}.relative_bias", getattr(position, "relative_bias", None), BIAS),
        ("embedding.scale", spec.embedding.scale, False),
        ("embedding.norm", spec.embedding.norm, True),
        ("embedding.segment_vocab_size", spec.embedding.segment_vocab_size, 0),
        ("embedding.factorized_dim", spec.embedding.factorized_dim, None),
        ("encoder.share_layers", stack.share_layers, False),
        ("pad_token_id", spec.pad_token_id, 1),  # positions are counted past token id 1, hard-coded
    ]
    if mlm is not None:
        checks.append(("heads.mlm.activation", mlm.activation, "gelu"))
    if classifier is not None:
        checks.append(("heads.classifier.dropout", classifier.dropout, (None, spec.dropout)))
    if isinstance(classifier, SequenceClassifierSpec):
        checks += [
            ("heads.classifier.pooling", classifier.pooling, "dense"),
            ("heads.classifier.activation", classifier.activation, "tanh"),
        ]
    require("mpnet", checks)
    if classifier is not None:
        head_class = CLASSIFIERS[0 if classifier.task == "sequence" else 1]
    else:
        head_class = HEADED if mlm else BARE
    extra = classifier_to_hf(classifier) if classifier is not None else {}
    extra.pop("classifier_dropout", None)  # MPNet has none: its heads use hidden_dropout_prob
    return {
        "model_type": "mpnet",
        "architectures": [head_class],
        "vocab_size": spec.vocab_size,
        "hidden_size": spec.d_model,
        "num_hidden_layers": stack.num_layers,
        "num_attention_heads": attention.num_heads,
        "intermediate_size": ffn.d_ff,
        "hidden_act": ACTIVATIONS_TO_HF[ffn.activation],
        "hidden_dropout_prob": spec.dropout,
        "attention_probs_dropout_prob": attention.dropout,
        "max_position_embeddings": spec.max_positions + OFFSET,
        "relative_attention_num_buckets": BIAS.num_buckets,
        "layer_norm_eps": stack.norm.eps,
        "initializer_range": spec.init.std,
        "tie_word_embeddings": mlm.tied if mlm else True,
        "pad_token_id": spec.pad_token_id,
        "bos_token_id": spec.bos_token_id,
        "eos_token_id": spec.eos_token_id,
        **extra,
    }


def _rules(spec: EncoderSpec, prefix: str) -> list[Rule]:
    """zoo <-> HF names; body names carry ``prefix`` (``mpnet.`` under the head classes)."""
    stack = spec.stacks()["encoder"]
    C = stack.attention.num_heads * stack.attention.resolved_head_dim(spec.d_model)
    emb, enc = f"{prefix}embeddings", f"{prefix}encoder"
    rules = [
        rename("embed.tokens.weight", f"{emb}.word_embeddings.weight"),
        rename("encoder.positions.weight", f"{emb}.position_embeddings.weight"),
        *layernorm("encoder.embed_norm", f"{emb}.LayerNorm"),
        rename("encoder.position_bias.weight", f"{enc}.relative_attention_bias.weight"),
    ]
    for i in range(stack.num_layers):
        zoo, hf = f"encoder.layers.{i}", f"{enc}.layer.{i}"
        rules += [
            *fused_linear(f"{zoo}.self_attn.qkv_proj", [f"{hf}.attention.attn.{n}" for n in QKV], (C, C, C)),
            *linear(f"{zoo}.self_attn.out_proj", f"{hf}.attention.attn.o"),
            *layernorm(f"{zoo}.self_attn_norm", f"{hf}.attention.LayerNorm"),
            *linear(f"{zoo}.ffn.up_proj", f"{hf}.intermediate.dense"),
            *linear(f"{zoo}.ffn.down_proj", f"{hf}.output.dense"),
            *layernorm(f"{zoo}.ffn_norm", f"{hf}.output.LayerNorm"),
        ]  # fmt: skip
    heads = spec.heads
    if heads.pooler:
        rules += linear("pooler.dense", f"{prefix}pooler.dense")
    if heads.mlm is not None:
        rules += [
            *linear("mlm_head.dense", "lm_head.dense"),
            *layernorm("mlm_head.norm", "lm_head.layer_norm"),
        ]
        if heads.mlm.tied:  # decoder.weight is the embedding, decoder.bias is tied to lm_head.bias
            rules.append(rename("mlm_head.bias", "lm_head.bias"))
        else:
            rules += linear("mlm_head", "lm_head.decoder")
    rules += classifier_rules(heads.classifier)
    return rules


def hf_to_zoo(tensors: StateDict, spec: ModelSpec) -> StateDict:
    assert isinstance(spec, EncoderSpec)
    mlm = spec.heads.mlm
    # A tied head may store its decoder (copies of the embedding and bias: used only when equal); an untied
    # one an unused bias.
    ignore = [r"lm_head\.decoder\.(weight|bias)"] if mlm is None else [] if mlm.tied else [r"lm_head\.bias"]
    tied = mlm_copies("lm_head") if mlm is not None and mlm.tied else {}
    return rules_to_zoo(_rules(spec, ""), strip_prefix(tensors, PREFIX), ignore=ignore, tied=tied)


def zoo_to_hf(tensors: StateDict, spec: ModelSpec) -> StateDict:
    assert isinstance(spec, EncoderSpec)
    mlm = spec.heads.mlm
    headed = mlm is not None or spec.heads.classifier is not None  # head classes prefix the body
    out = rules_to_hf(_rules(spec, PREFIX if headed else ""), tensors)
    if mlm is not None and not mlm.tied:  # transformers expects both biases even when untied
        out["lm_head.bias"] = out["lm_head.decoder.bias"].clone()
    return out


MAPPING = FamilyMapping(
    model_types=("mpnet",),
    config_to_spec=config_to_spec,
    spec_to_config=spec_to_config,
    hf_to_zoo=hf_to_zoo,
    zoo_to_hf=zoo_to_hf,
)
