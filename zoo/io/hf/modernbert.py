"""ModernBERT (``modernbert``): ModernBertModel, ModernBertForMaskedLM and the sequence / token classifiers.

After transformers' ``models/modernbert/modeling_modernbert.py`` (Warner et al. 2024). A pre-norm encoder of
bias-free LayerNorms (``norm_bias``), rotary positions, GeGLU and no biases by default, in zoo's terms:

    embeddings      tok_embeddings -> norm (no positions added)        embedding.norm, no segments
    layer 0         attn_norm is the identity: the embedding norm      norm.first_attention_norm: false
                    stands in for it
    layers          fused Wqkv = zoo's [q; k; v] rows; Wi = [act half;  attention.bias / ffn.bias
                    gate half] = zoo's gated up_proj, the same order
    local layers    every ``global_attn_every_n_layers``-th layer is    encoder.layer_patterns
                    global (``layer_types``); the others see |i - j|     {kind: sliding_window,
                    <= local_attention // 2                              window: local_attention // 2 + 1}
    rotary          global and local bases (``rope_parameters`` by       position.theta / local_theta
                    layer type; 4.x: global_rope_theta, local_rope_theta)
    final_norm      after the last layer                               norm.final
    MLM head        head (dense -> classifier_activation -> norm) ->    heads.mlm: dense_bias =
                    decoder (tied, bias = decoder_bias)                  classifier_bias, bias = decoder_bias
    classifiers     the same head on [CLS] or the masked mean           heads.classifier.transform, pooling
                    (classifier_pooling), dropout, classifier           first_token / mean

Training-only settings differ: transformers drops out after each attention output projection
(``attention_dropout``) where zoo drops out on every residual branch (``dropout`` = ``embedding_dropout``);
``sparse_prediction`` and ``deterministic_flash_attn`` change no logits. Rotary scaling on the local layers
and attention patterns other than full / sliding_window are refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from zoo.io.hf.classifier import Task, classifier_from_hf, classifier_to_hf
from zoo.io.hf.common import (
    ACTIVATIONS_TO_HF,
    FamilyMapping,
    HFError,
    Rule,
    StateDict,
    activation_from_hf,
    architecture,
    layernorm,
    linear,
    rename,
    require,
    rules_to_hf,
    rules_to_zoo,
    strip_prefix,
    token_id,
)
from zoo.io.hf.rope import as_rotary, layer_rope, legacy_scaling, local_rope, rope_to_config
from zoo.spec import EncoderSpec, ModelSpec, RotaryPositions, parse_spec
from zoo.spec.errors import short_repr
from zoo.spec.limits import LAYERS

PREFIX = "model."
FULL, SLIDING = "full_attention", "sliding_attention"
BODY, MLM = "ModernBertModel", "ModernBertForMaskedLM"
SEQUENCE, TOKEN = "ModernBertForSequenceClassification", "ModernBertForTokenClassification"
_THETA = {"global": 160_000.0, "local": 10_000.0}  # ModernBertConfig.default_theta
_DEFAULTS: dict[str, Any] = {
    "vocab_size": 50368, "hidden_size": 768, "intermediate_size": 1152, "num_hidden_layers": 22,
    "num_attention_heads": 12, "hidden_activation": "gelu", "max_position_embeddings": 8192, "norm_eps": 1e-5,
    "norm_bias": False, "pad_token_id": 50283, "eos_token_id": 50282, "bos_token_id": 50281,
    "attention_bias": False, "local_attention": 128, "mlp_bias": False, "decoder_bias": True,
    "classifier_pooling": "cls", "classifier_bias": False, "classifier_activation": "gelu",
    "tie_word_embeddings": True, "global_attn_every_n_layers": 3,
}  # fmt: skip
_POOLING = {"cls": "first_token", "mean": "mean"}


# -- config -> spec ----------------------------------------------------------------------------------------


def config_to_spec(config: dict[str, Any], names: set[str]) -> ModelSpec:
    def get(key: str) -> Any:
        return config.get(key, _DEFAULTS.get(key))

    vocab, d_model = get("vocab_size"), get("hidden_size")
    body = {n.removeprefix(PREFIX) for n in names}
    arch = architecture(config)
    tasks: dict[str, Task] = {SEQUENCE: "sequence", TOKEN: "token"}
    task = tasks.get(arch or "")
    if arch is None and "classifier.weight" in body:
        task = "sequence"  # the common case; architectures says which when it is there
    has_mlm = arch == MLM or (arch is None and "decoder.bias" in body)
    pooling = get("classifier_pooling")
    if pooling not in _POOLING:
        raise HFError(f"config.json classifier_pooling={short_repr(pooling)}: expected 'cls' or 'mean'")
    head_activation = activation_from_hf(get("classifier_activation"), field="classifier_activation")
    classifier = None
    if task is not None:
        classifier = classifier_from_hf(config, task, pooling=_POOLING[pooling], absent=0.0)
        classifier["transform"] = {"activation": head_activation, "bias": get("classifier_bias")}
    mlm = {
        "activation": head_activation,
        "tied": get("tie_word_embeddings"),
        "dense_bias": get("classifier_bias"),
        "bias": get("decoder_bias"),
    }
    return parse_spec({
        "family": "encoder",
        "vocab_size": vocab,
        "d_model": d_model,
        "num_layers": get("num_hidden_layers"),
        "max_positions": get("max_position_embeddings"),
        "attention": {
            "num_heads": get("num_attention_heads"),
            "bias": get("attention_bias"),
            "dropout": config.get("attention_dropout", 0.0),
        },
        "ffn": {
            "d_ff": get("intermediate_size"),
            "activation": activation_from_hf(get("hidden_activation"), field="hidden_activation"),
            "gated": True,
            "bias": get("mlp_bias"),
            "dropout": config.get("mlp_dropout", 0.0),
        },
        "norm": {
            "kind": "layernorm", "eps": get("norm_eps"), "bias": get("norm_bias"), "placement": "pre",
            "final": True, "first_attention_norm": False,
        },
        "position": _rope_from_config(config),
        "embedding": {"norm": True},
        "encoder": _patterns_spec(config, get),
        "heads": {"mlm": mlm if has_mlm else None, "classifier": classifier},
        "dropout": config.get("embedding_dropout", 0.0),
        "init": {"std": config.get("initializer_range", 0.02)},
        "pad_token_id": token_id(config, "pad_token_id", vocab, _DEFAULTS["pad_token_id"]),
        "bos_token_id": token_id(config, "bos_token_id", vocab, _DEFAULTS["bos_token_id"]),
        "eos_token_id": token_id(config, "eos_token_id", vocab, _DEFAULTS["eos_token_id"]),
    })  # fmt: skip


def _patterns_spec(config: dict[str, Any], get: Any) -> dict[str, Any]:
    """``encoder:`` overrides for ``layer_types`` (or ``global_attn_every_n_layers``) and ``local_attention``."""
    num_layers = get("num_hidden_layers")
    if not isinstance(num_layers, int) or not 1 <= num_layers <= LAYERS.value:
        raise HFError(
            f"config.json num_hidden_layers={short_repr(num_layers)} must be in [1, {LAYERS.value:,}] "
            f"({LAYERS.env} raises it)"
        )
    types = config.get("layer_types")
    if types is None:
        every = get("global_attn_every_n_layers")
        if not isinstance(every, int) or every < 1:
            raise HFError(f"config.json global_attn_every_n_layers={short_repr(every)}: a positive integer")
        types = [SLIDING if i % every else FULL for i in range(num_layers)]
    if (
        not isinstance(types, list)
        or len(types) != num_layers
        or any(t not in (FULL, SLIDING) for t in types)
    ):
        raise HFError(
            f"config.json layer_types must list {num_layers} entries of {FULL!r} / {SLIDING!r} "
            f"(num_hidden_layers={num_layers})"
        )
    local = get("local_attention")
    if SLIDING in types and (not isinstance(local, int) or isinstance(local, bool) or local < 0):
        raise HFError(f"config.json local_attention={short_repr(local)}: a number of keys (>= 0) is expected")
    window = {"kind": "sliding_window", "window": local // 2 + 1} if SLIDING in types else None
    patterns = [window if kind == SLIDING else {"kind": "full"} for kind in types]
    if all(p == patterns[0] for p in patterns):
        return {} if patterns[0] == {"kind": "full"} else {"pattern": patterns[0]}
    return {"layer_patterns": patterns}


def _rope_from_config(config: dict[str, Any]) -> dict[str, Any]:
    """theta (+ scaling) from the global layers' rotary settings, local_theta from the local layers'."""
    params = config.get("rope_parameters")
    if params is not None and not (isinstance(params, Mapping) and set(params) <= {FULL, SLIDING}):
        raise HFError(
            f"config.json rope_parameters must map {FULL!r} and {SLIDING!r} to rotary settings (ModernBERT "
            f"keys them by layer type), got {short_repr(params)}"
        )
    scaling = legacy_scaling(config)  # transformers lays it over both layer types
    full, local = layer_rope(params, FULL, scaling), layer_rope(params, SLIDING, scaling)
    full.setdefault("rope_theta", config.get("global_rope_theta", _THETA["global"]))
    local.setdefault("rope_theta", config.get("local_rope_theta", _THETA["local"]))
    where = "rope_scaling" if scaling else f"rope_parameters.{FULL}"
    return local_rope(full, local, where=where, local_where=f"rope_parameters.{SLIDING}")


# -- spec -> config ----------------------------------------------------------------------------------------


def spec_to_config(spec: ModelSpec) -> dict[str, Any]:
    family = "modernbert"
    require(family, [("family", spec.family, "encoder")])
    assert isinstance(spec, EncoderSpec)
    stack = spec.stacks()["encoder"]
    attention, ffn, norm, heads = stack.attention, stack.ffn, stack.norm, spec.heads
    mlm, classifier = heads.mlm, heads.classifier
    transform = classifier.transform if classifier is not None else None
    head_activation = mlm.activation if mlm else transform.activation if transform else "gelu"
    head_bias = mlm.dense_bias if mlm else transform.bias if transform else False
    if classifier is not None:
        head_class = SEQUENCE if classifier.task == "sequence" else TOKEN
    else:
        head_class = MLM if mlm else BODY
    pooling = getattr(classifier, "pooling", "first_token")
    return {
        "model_type": family,
        "architectures": [head_class],
        "vocab_size": spec.vocab_size,
        "hidden_size": spec.d_model,
        "intermediate_size": ffn.d_ff,
        "num_hidden_layers": stack.num_layers,
        "num_attention_heads": attention.num_heads,
        "hidden_activation": ACTIVATIONS_TO_HF[ffn.activation],
        "max_position_embeddings": spec.max_positions,
        "initializer_range": spec.init.std,
        "norm_eps": norm.eps,
        "norm_bias": norm.bias,
        "attention_bias": attention.bias,
        "attention_dropout": attention.dropout,
        "mlp_bias": ffn.bias,
        "mlp_dropout": ffn.dropout,
        "embedding_dropout": spec.dropout,
        "decoder_bias": mlm.bias if mlm else True,
        "classifier_bias": head_bias,
        "classifier_activation": ACTIVATIONS_TO_HF[head_activation],
        "classifier_pooling": {v: k for k, v in _POOLING.items()}.get(pooling, "cls"),
        "tie_word_embeddings": mlm.tied if mlm else True,
        "pad_token_id": spec.pad_token_id,
        "bos_token_id": spec.bos_token_id,
        "eos_token_id": spec.eos_token_id,
        "cls_token_id": spec.bos_token_id,
        "sep_token_id": spec.eos_token_id,
        **_patterns_to_config(spec),
        **_rope_to_config(as_rotary(stack.position)),
        **(classifier_to_hf(classifier, model_dropout=0.0) if classifier is not None else {}),
    }


def _patterns_to_config(spec: EncoderSpec) -> dict[str, Any]:
    stack = spec.stacks()["encoder"]
    types, windows = [], set()
    for i in range(stack.num_layers):
        pattern = stack.layer_pattern(i)
        if pattern.kind not in ("full", "sliding_window"):
            raise HFError(
                f"modernbert cannot express {stack.pattern_path(i)}.kind={pattern.kind!r}: Hugging Face "
                "modernbert has global and local (sliding-window) layers only"
            )
        types.append(SLIDING if pattern.kind == "sliding_window" else FULL)
        if pattern.kind == "sliding_window":
            windows.add(pattern.window)
    if len(windows) > 1:
        raise HFError(
            f"modernbert cannot express {stack.name}.layer_patterns with windows {sorted(windows)}: Hugging "
            "Face modernbert has one local_attention for all its local layers"
        )
    window = windows.pop() if windows else 65  # transformers' default, unused without local layers
    return {"layer_types": types, "local_attention": 2 * (window - 1)}


def _rope_to_config(position: RotaryPositions) -> dict[str, Any]:
    full = rope_to_config(position)["rope_parameters"]
    local = (
        full if position.local_theta is None else {"rope_type": "default", "rope_theta": position.local_theta}
    )
    return {
        "global_rope_theta": position.theta,
        "local_rope_theta": local["rope_theta"],
        "rope_parameters": {FULL: full, SLIDING: dict(local)},
    }


# -- tensors -----------------------------------------------------------------------------------------------


def _rules(spec: EncoderSpec, prefix: str) -> list[Rule]:
    """zoo <-> HF names; body names carry ``prefix`` (``model.`` under the head classes)."""
    stack = spec.stacks()["encoder"]
    attention, ffn, norm = stack.attention, stack.ffn, stack.norm
    rules = [
        rename("embed.tokens.weight", f"{prefix}embeddings.tok_embeddings.weight"),
        *layernorm("encoder.embed_norm", f"{prefix}embeddings.norm", bias=norm.bias),
        *layernorm("encoder.final_norm", f"{prefix}final_norm", bias=norm.bias),
    ]
    for i in range(stack.num_layers):
        zoo, hf = f"encoder.layers.{i}", f"{prefix}layers.{i}"
        rules += [
            *linear(f"{zoo}.self_attn.qkv_proj", f"{hf}.attn.Wqkv", bias=attention.bias),
            *linear(f"{zoo}.self_attn.out_proj", f"{hf}.attn.Wo", bias=attention.bias),
            *linear(f"{zoo}.ffn.up_proj", f"{hf}.mlp.Wi", bias=ffn.bias),
            *linear(f"{zoo}.ffn.down_proj", f"{hf}.mlp.Wo", bias=ffn.bias),
            *layernorm(f"{zoo}.ffn_norm", f"{hf}.mlp_norm", bias=norm.bias),
        ]
        if i > 0 or norm.first_attention_norm:
            rules += layernorm(f"{zoo}.self_attn_norm", f"{hf}.attn_norm", bias=norm.bias)
    mlm, classifier = spec.heads.mlm, spec.heads.classifier
    if mlm is not None:
        rules += [
            *linear("mlm_head.dense", "head.dense", bias=mlm.dense_bias),
            *layernorm("mlm_head.norm", "head.norm", bias=norm.bias),
        ]
        if mlm.bias:
            rules.append(rename("mlm_head.bias", "decoder.bias"))
        if not mlm.tied:
            rules.append(rename("mlm_head.weight", "decoder.weight"))
    if classifier is not None:
        if classifier.transform is not None:
            rules += [
                *linear("classifier.transform.dense", "head.dense", bias=classifier.transform.bias),
                *layernorm("classifier.transform.norm", "head.norm", bias=norm.bias),
            ]
        rules += linear("classifier.out_proj", "classifier")
    return rules


def _hf_to_zoo(tensors: StateDict, spec: ModelSpec) -> StateDict:
    assert isinstance(spec, EncoderSpec)
    mlm = spec.heads.mlm
    tied = {"decoder.weight": "embed.tokens.weight"} if mlm is not None and mlm.tied else {}  # used if equal
    return rules_to_zoo(_rules(spec, ""), strip_prefix(tensors, PREFIX), tied=tied)


def _zoo_to_hf(tensors: StateDict, spec: ModelSpec) -> StateDict:
    assert isinstance(spec, EncoderSpec)
    headed = spec.heads.mlm is not None or spec.heads.classifier is not None
    return rules_to_hf(_rules(spec, PREFIX if headed else ""), tensors)


MAPPING = FamilyMapping(
    model_types=("modernbert",),
    config_to_spec=config_to_spec,
    spec_to_config=spec_to_config,
    hf_to_zoo=_hf_to_zoo,
    zoo_to_hf=_zoo_to_hf,
)
