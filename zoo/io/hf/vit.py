"""ViT (``model_type: vit``): ``ViTModel`` and ``ViTForImageClassification`` (Dosovitskiy et al. 2021).

transformers' ``models/vit/modeling_vit.py``: a pre-norm encoder over image patches (zoo's image front-end,
`zoo.spec.PatchEmbeddingSpec`, and ``position: none``: the positions live in the embeddings), and

    embeddings          embeddings.{cls_token, position_embeddings (1, 1 + patches, C),
                        patch_embeddings.projection (a C x channels x p x p convolution)}: zoo's embed.*
    layer               layernorm_before -> attention (q, k, v biased as qkv_bias; output always biased)
                        -> residual; layernorm_after -> fc1 -> hidden_act -> fc2 -> residual
    final norm          layernorm (layer_norm_eps, as every norm): zoo's encoder.final_norm
    pooler              ViTModel's: tanh(dense(hidden[:, 0])), zoo's ``heads.pooler`` (pooler_act tanh and
                        pooler_output_size = hidden_size only); ViTForImageClassification has none
    image head          classifier (C -> num_labels) on the class token: ``heads.classifier`` with
                        ``task: image, pooling: class_token``; no dropout before it (transformers has none)

Tensor names are written as the Hub's checkpoints hold them (``encoder.layer.{i}.attention.attention.query``,
``intermediate.dense``, ``output.dense``), which transformers 4 reads as they are and transformers 5 renames
as it loads; both spellings are read. The classification head keeps the body under ``vit.``. A ViTModel
always has its pooler in transformers: a bare body without ``heads.pooler`` is refused on export.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from zoo.io.hf.classifier import classifier_from_hf, classifier_rules, classifier_to_hf
from zoo.io.hf.common import (
    ACTIVATIONS_TO_HF,
    FamilyMapping,
    HFError,
    Rule,
    StateDict,
    TypedConfig,
    activation_from_hf,
    architecture,
    fused_linear,
    layernorm,
    linear,
    reject,
    rename,
    require,
    rules_to_hf,
    rules_to_zoo,
    strip_prefix,
)
from zoo.spec import EncoderSpec, ModelSpec, PatchEmbeddingSpec, parse_spec

PREFIX = "vit."
BODY, CLASSIFIER = "ViTModel", "ViTForImageClassification"
DEFAULTS: dict[str, Any] = {  # ViTConfig's
    "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072,
    "hidden_act": "gelu", "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0,
    "initializer_range": 0.02, "layer_norm_eps": 1e-12, "image_size": 224, "patch_size": 16,
    "num_channels": 3, "qkv_bias": True,
}  # fmt: skip
# transformers 5's names -> the Hub's (transformers 4's), which export writes
_NEW_NAMES = (
    (re.compile(r"^layers\.(\d+)\.attention\.([qkv])_proj\."), None),
    (re.compile(r"^layers\.(\d+)\.attention\.o_proj\."), r"encoder.layer.\1.attention.output.dense."),
    (re.compile(r"^layers\.(\d+)\.mlp\.fc1\."), r"encoder.layer.\1.intermediate.dense."),
    (re.compile(r"^layers\.(\d+)\.mlp\.fc2\."), r"encoder.layer.\1.output.dense."),
    (re.compile(r"^layers\.(\d+)\."), r"encoder.layer.\1."),
)
_QKV = {"q": "query", "k": "key", "v": "value"}


def _hub_name(name: str) -> str:
    """A transformers 5 ViT tensor name in the Hub's spelling; other names as they are."""
    for pattern, target in _NEW_NAMES:
        match = pattern.match(name)
        if match is None:
            continue
        if target is None:  # q/k/v
            head = f"encoder.layer.{match[1]}.attention.attention.{_QKV[match[2]]}."
            return head + name[match.end() :]
        return pattern.sub(target, name, count=1)
    return name


def _square(config: Mapping[str, Any], key: str) -> int:
    value = config.get(key, DEFAULTS[key])
    if isinstance(value, list) and len(value) == 2 and value[0] == value[1]:
        value = value[0]
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise HFError(
            f"config.json {key}: expected a positive integer (zoo's patch embedding is square), got {value!r}"
        )
    return value


# -- config -> spec ----------------------------------------------------------------------------------------


def config_to_spec(config: dict[str, Any], names: set[str]) -> ModelSpec:
    config = TypedConfig(config)
    arch = architecture(config)
    if arch not in (None, BODY, CLASSIFIER):
        raise HFError(
            f"config.json architectures: {arch} is not converted; zoo reads {BODY} and {CLASSIFIER}"
        )
    reject(config, "pooler_act", "tanh", why="zoo's pooler is BERT's tanh(dense(.))")

    def get(key: str) -> Any:
        return config.get(key, DEFAULTS[key])

    d_model = get("hidden_size")
    reject(config, "pooler_output_size", d_model, why="zoo's pooler keeps hidden_size")
    body = {n.removeprefix(PREFIX) for n in names}
    classify = arch == CLASSIFIER or (arch is None and "classifier.weight" in body)
    activation = activation_from_hf(get("hidden_act"), field="hidden_act")
    classifier = None
    if classify:
        classifier = classifier_from_hf(config, "image", pooling="class_token") | {"dropout": None}
    return parse_spec({
        "family": "encoder",
        "d_model": d_model,
        "num_layers": get("num_hidden_layers"),
        "attention": {
            "num_heads": get("num_attention_heads"),
            "bias": get("qkv_bias"),
            "out_bias": True,
            "dropout": get("attention_probs_dropout_prob"),
        },
        "ffn": {"d_ff": get("intermediate_size"), "activation": activation},
        "norm": {"kind": "layernorm", "eps": get("layer_norm_eps"), "placement": "pre"},
        "position": {"kind": "none"},
        "embedding": {
            "kind": "patches",
            "image_size": _square(config, "image_size"),
            "patch_size": _square(config, "patch_size"),
            "channels": get("num_channels"),
        },
        "heads": {
            "pooler": any(n.startswith("pooler.dense.") for n in body),
            "classifier": classifier,
        },
        "dropout": get("hidden_dropout_prob"),
        "init": {"std": get("initializer_range")},
    })  # fmt: skip


# -- spec -> config ----------------------------------------------------------------------------------------


def spec_to_config(spec: ModelSpec) -> dict[str, Any]:
    require("vit", [("family", spec.family, "encoder")])
    assert isinstance(spec, EncoderSpec) and isinstance(spec.embedding, PatchEmbeddingSpec)
    stack, heads, embedding = spec.stacks()["encoder"], spec.heads, spec.embedding
    classifier = heads.classifier
    if classifier is not None and heads.pooler:
        raise HFError(
            "vit cannot express heads.pooler=True beside heads.classifier: ViTForImageClassification has no pooler"
        )
    if classifier is None and not heads.pooler:
        raise HFError("vit cannot express heads.pooler=False: transformers' ViTModel always has its pooler")
    return {
        "model_type": "vit",
        "architectures": [CLASSIFIER if classifier is not None else BODY],
        "hidden_size": spec.d_model,
        "num_hidden_layers": stack.num_layers,
        "num_attention_heads": stack.attention.num_heads,
        "intermediate_size": stack.ffn.d_ff,
        "hidden_act": ACTIVATIONS_TO_HF[stack.ffn.activation],
        "hidden_dropout_prob": spec.dropout,
        "attention_probs_dropout_prob": stack.attention.dropout,
        "initializer_range": spec.init.std,
        "layer_norm_eps": stack.norm.eps,
        "image_size": embedding.image_size,
        "patch_size": embedding.patch_size,
        "num_channels": embedding.channels,
        "qkv_bias": stack.attention.bias,
        "encoder_stride": embedding.patch_size,  # ViTForMaskedImageModeling's only
        "pooler_output_size": spec.d_model,
        "pooler_act": "tanh",
        **(_classifier_out(classifier) if classifier is not None else {}),
    }


def _classifier_out(classifier: Any) -> dict[str, Any]:
    config = classifier_to_hf(classifier)
    del config["classifier_dropout"]  # ViT's head has no dropout (zoo's runs only in training)
    return config


# -- tensors -----------------------------------------------------------------------------------------------


def tensor_rules(spec: EncoderSpec, prefix: str) -> list[Rule]:
    """zoo <-> Hub names; ``prefix`` on the body (``vit.`` under the classifier)."""
    C, p = spec.d_model, prefix
    bias = spec.stacks()["encoder"].attention.bias
    rules = [
        rename("embed.cls_token", f"{p}embeddings.cls_token"),
        rename("embed.positions", f"{p}embeddings.position_embeddings"),
        *linear("embed.proj", f"{p}embeddings.patch_embeddings.projection"),
        *layernorm("encoder.final_norm", f"{p}layernorm"),
    ]
    for i in range(spec.stacks()["encoder"].num_layers):
        zoo, hf = f"encoder.layers.{i}", f"{p}encoder.layer.{i}"
        qkv = [f"{hf}.attention.attention.{name}" for name in ("query", "key", "value")]
        rules += [
            *fused_linear(f"{zoo}.self_attn.qkv_proj", qkv, (C, C, C), bias=bias),
            *linear(f"{zoo}.self_attn.out_proj", f"{hf}.attention.output.dense"),
            *layernorm(f"{zoo}.self_attn_norm", f"{hf}.layernorm_before"),
            *linear(f"{zoo}.ffn.up_proj", f"{hf}.intermediate.dense"),
            *linear(f"{zoo}.ffn.down_proj", f"{hf}.output.dense"),
            *layernorm(f"{zoo}.ffn_norm", f"{hf}.layernorm_after"),
        ]
    if spec.heads.pooler:
        rules += linear("pooler.dense", f"{p}pooler.dense")
    return rules + classifier_rules(spec.heads.classifier)


def hf_to_zoo(tensors: StateDict, spec: ModelSpec) -> StateDict:
    assert isinstance(spec, EncoderSpec)
    body = {_hub_name(name): tensor for name, tensor in strip_prefix(tensors, PREFIX).items()}
    return rules_to_zoo(tensor_rules(spec, ""), body)


def zoo_to_hf(tensors: StateDict, spec: ModelSpec) -> StateDict:
    assert isinstance(spec, EncoderSpec)
    return rules_to_hf(tensor_rules(spec, PREFIX if spec.heads.classifier is not None else ""), tensors)


MAPPING = FamilyMapping(
    model_types=("vit",),
    config_to_spec=config_to_spec,
    spec_to_config=spec_to_config,
    hf_to_zoo=hf_to_zoo,
    zoo_to_hf=zoo_to_hf,
    embedding_kinds=("patches",),
)
