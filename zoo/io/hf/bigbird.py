"""Hugging Face BigBird <-> zoo: ``BigBirdModel``, ``BigBirdForMaskedLM`` (``model_type: big_bird``).

BigBird (Zaheer et al. 2020, "Big Bird: Transformers for Longer Sequences"; transformers'
``models/big_bird/modeling_big_bird.py``) is BERT with two options and a sparse attention pattern, so the
tensor table and most of the config are `zoo.io.hf.bert`'s, read through a BigBird `Flavour`:

    positions        learned, counted from 0 (as BERT; not RoBERTa's pad + 1, despite the RoBERTa vocabulary)
    use_bias         biases on query/key/value only          attention.bias (the output dense always has one)
    rescale_embeddings                                       embedding.scale
    pooler           ``pooler.{weight,bias}``                pooler.dense.* (BERT's ``pooler.dense``)
    MLM head         ``cls.predictions.*``, hidden_act       as BERT; BigBirdForPreTraining's NSP head dropped

``attention_type: original_full`` is BERT's attention and converts exactly. ``block_sparse`` (ITC: blocks of
``block_size``, a 3-block sliding window, the first and last block global, ``num_random_blocks`` random
blocks) becomes ``encoder.pattern: {kind: block_sparse, block_size, window_blocks: 3, global_blocks: 1,
random_blocks: num_random_blocks}``; the blocks cut the same tokens (transformers pads the input to a
multiple of ``block_size``, zoo lets the last block be shorter). The two compute the same function only in
part. transformers 5.x (``BigBirdModel.forward``, ``BigBirdBlockSparseAttention``):

1. attends in full when ``seq_len <= (5 + 2 * num_random_blocks) * block_size``, and stays so: it calls
   ``set_attention_type("original_full")``, which replaces the module for every later call;
2. in eval mode draws no random blocks: ``rand_attn`` is all zeros, so each of a non-global query block's
   ``num_random_blocks`` "random" blocks is block 0 again. Key block 0 enters that softmax
   ``1 + num_random_blocks`` times (as a global block, then once per copy): its logits in effect gain
   log(1 + num_random_blocks), which no boolean mask expresses;
3. in training draws them per head with numpy, ``np.random.seed(layer_idx)``; zoo draws one layout per layer
   for all heads from ``torch.Generator`` seeded with ``pattern.seed + layer``;
4. cannot run ``num_random_blocks: 0`` past the length of (1) (an empty gather fails to reshape).

zoo's pattern covers every block up to ``(4 + random_blocks) * block_size`` tokens (window, globals and the
random blocks leave no block unseen). So zoo equals transformers (1e-4 on logits) with ``original_full``,
and with ``block_sparse`` on inputs up to ``(4 + num_random_blocks) * block_size`` tokens, where both attend
everywhere. Longer, they differ: up to ``(5 + 2 * num_random_blocks) * block_size`` transformers attends in
full and zoo does not; beyond, in eval mode, they agree on the query rows of the two global blocks of the
first layer and differ elsewhere, where transformers weights block 0 by 1 + num_random_blocks and zoo sees
its random blocks instead (tests/io/test_hf_bigbird.py measures both). In training, BigBird also drops out
before its embedding LayerNorm and zoo after it (the same in eval).
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from zoo.io.hf import bert
from zoo.io.hf.bert import Flavour
from zoo.io.hf.common import (
    FamilyMapping,
    HFError,
    Rule,
    StateDict,
    architecture,
    mlm_copies,
    require,
    rules_to_hf,
    rules_to_zoo,
    strip_prefix,
)
from zoo.spec import EncoderSpec, ModelSpec

BIG_BIRD = Flavour(
    model_type="big_bird",
    prefix="bert.",
    classes=("BigBirdModel", "BigBirdForMaskedLM"),
    # refused before BERT's reading sees them (`_check_head`): BigBird's sequence head applies hidden_act,
    # not the tanh of zoo's ``pooling: dense``
    classifiers=("BigBirdForSequenceClassification", "BigBirdForTokenClassification"),
    sequence_pooling="dense",
    mlm="cls.predictions",
    mlm_dense="transform.dense",
    mlm_norm="transform.LayerNorm",
    mlm_activation=None,  # the head's transform uses hidden_act, as BERT's
    offset_from_pad=False,
    vocab_size=50358,
    pad_token_id=0,
    ignored=(r"cls\.seq_relationship\.(weight|bias)",),  # BigBirdForPreTraining's NSP head
)
# BigBirdConfig's defaults (= google/bigbird-roberta-base), for configs that leave a field out
_DEFAULTS: dict[str, Any] = {
    "vocab_size": 50358,
    "hidden_size": 768,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "intermediate_size": 3072,
    "hidden_act": "gelu_new",
    "max_position_embeddings": 4096,
    "type_vocab_size": 2,
    "layer_norm_eps": 1e-12,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "attention_type": "block_sparse",
    "use_bias": True,
    "rescale_embeddings": False,
    "block_size": 64,
    "num_random_blocks": 3,
}
_ARCHITECTURES = ("BigBirdModel", "BigBirdForMaskedLM", "BigBirdForPreTraining")
# ITC's fixed shape (BigBirdBlockSparseAttention): a 3-block window, one global block at each end
WINDOW_BLOCKS, GLOBAL_BLOCKS = 3, 1
# BigBird's pooler is a bare Linear (``pooler.weight``) where BERT's table names ``pooler.dense.weight``
_POOLER = re.compile(r"^((?:bert\.)?pooler)\.(weight|bias)$")
_BERT_POOLER = re.compile(r"^((?:bert\.)?pooler)\.dense\.(weight|bias)$")


# -- config <-> spec ------------------------------------------------------------------------------------


def _check_head(config: dict[str, Any], names: set[str]) -> None:
    """Only the body, its pooler and the pretraining heads convert (no classifier, QA or causal LM head)."""
    arch = architecture(config)
    if arch not in (None, *_ARCHITECTURES):
        raise HFError(
            f"config.json architectures={config['architectures']!r} is not supported; zoo reads "
            f"{', '.join(_ARCHITECTURES)} (without its next-sentence head)"
        )
    heads = sorted(n for n in names if n.split(".")[0] in ("classifier", "qa_classifier"))
    if heads:
        raise HFError(f"the checkpoint has a task head zoo cannot read for BigBird: {', '.join(heads[:3])}")


def _config_to_spec(config: dict[str, Any], names: set[str]) -> ModelSpec:
    _check_head(config, names)
    config = {**_DEFAULTS, **config}
    attention_type = config["attention_type"]
    if attention_type not in ("original_full", "block_sparse"):
        raise HFError(
            f"config.json attention_type={attention_type!r} is not supported; BigBird has 'original_full' "
            "and 'block_sparse'"
        )
    bert_names = {_POOLER.sub(r"\1.dense.\2", n) for n in names}  # BERT's reading looks for pooler.dense
    spec = bert.config_to_spec(BIG_BIRD, config, bert_names)
    changes: dict[str, Any] = {
        # q/k/v biases; the output dense always has one
        "attention": {"bias": bool(config["use_bias"]), "out_bias": None if config["use_bias"] else True},
        "embedding.scale": bool(config["rescale_embeddings"]),
    }
    if attention_type == "block_sparse":
        changes["encoder.pattern"] = {
            "kind": "block_sparse",
            "block_size": config["block_size"],
            "window_blocks": WINDOW_BLOCKS,
            "global_blocks": GLOBAL_BLOCKS,
            "random_blocks": config["num_random_blocks"],
        }
    return spec.override(**changes)


def _spec_to_config(spec: ModelSpec) -> dict[str, Any]:
    family = BIG_BIRD.model_type
    require(family, [("family", spec.family, "encoder")])
    assert isinstance(spec, EncoderSpec)
    if spec.heads.classifier is not None:
        raise HFError(
            f"{family} cannot express heads.classifier: zoo writes BigBirdModel and BigBirdForMaskedLM only"
        )
    stack = spec.stacks()["encoder"]
    attention, path = stack.attention, stack.sources["attention"]
    if stack.layer_patterns is not None:
        raise HFError(
            f"{family} cannot express encoder.layer_patterns: Hugging Face {family} has one attention_type "
            "for every layer"
        )
    pattern = stack.pattern
    sparse: dict[str, Any] = {"attention_type": "original_full"}
    if pattern.kind == "block_sparse":
        require(family, [
            (f"{stack.pattern_path()}.window_blocks", pattern.window_blocks, WINDOW_BLOCKS),
            (f"{stack.pattern_path()}.global_blocks", pattern.global_blocks, GLOBAL_BLOCKS),
        ])  # fmt: skip
        sparse = {
            "attention_type": "block_sparse",
            "block_size": pattern.block_size,
            "num_random_blocks": pattern.random_blocks,  # drawn by transformers, not from pattern.seed
        }
    elif pattern.kind != "full":
        raise HFError(
            f"{family} cannot express {stack.pattern_path()}.kind={pattern.kind!r}: Hugging Face {family} "
            "attends in full or block_sparse"
        )
    require(family, [(f"{path}.out_bias", attention.has_out_bias, True)])  # BigBirdSelfOutput's dense
    # BERT's checks and config for the rest, on the spec without BigBird's own options
    plain = spec.override(**{
        f"{path}.bias": True, f"{path}.out_bias": None, "embedding.scale": False, "encoder.pattern": None
    })  # fmt: skip
    config = bert.spec_to_config(BIG_BIRD, plain)
    del config["position_embedding_type"]  # BigBird has absolute positions only
    return config | sparse | {"use_bias": attention.bias, "rescale_embeddings": spec.embedding.scale}


# -- tensors ------------------------------------------------------------------------------------------


def _rules(spec: EncoderSpec, prefix: str) -> list[Rule]:
    """BERT's table (body names under ``prefix``), with BigBird's bare-Linear pooler and, without
    ``use_bias``, no query/key/value biases."""
    qkv_bias = spec.stacks()["encoder"].attention.bias
    return [
        replace(rule, hf=tuple(_BERT_POOLER.sub(r"\1.\2", name) for name in rule.hf))
        for rule in bert.tensor_rules(BIG_BIRD, spec, prefix)
        if qkv_bias or not rule.zoo.endswith(".self_attn.qkv_proj.bias")
    ]


def _hf_to_zoo(tensors: StateDict, spec: ModelSpec) -> StateDict:
    assert isinstance(spec, EncoderSpec)
    mlm = spec.heads.mlm
    # as BERT: a tied head may store its decoder (copies of the embedding and bias: used only when equal),
    # an untied one keeps an unused cls.predictions.bias beside the decoder's own
    extra = (
        [r"cls\.predictions\.decoder\.(weight|bias)"]
        if mlm is None
        else []
        if mlm.tied
        else [r"cls\.predictions\.bias"]
    )
    body = strip_prefix(tensors, BIG_BIRD.prefix)
    tied = mlm_copies("cls.predictions") if mlm is not None and mlm.tied else {}
    return rules_to_zoo(_rules(spec, ""), body, ignore=[*BIG_BIRD.ignored, *extra], tied=tied)


def _zoo_to_hf(tensors: StateDict, spec: ModelSpec) -> StateDict:
    assert isinstance(spec, EncoderSpec)
    mlm = spec.heads.mlm
    out = rules_to_hf(_rules(spec, BIG_BIRD.prefix if mlm is not None else ""), tensors)
    if mlm is not None and not mlm.tied:  # transformers expects both biases even when untied
        out["cls.predictions.bias"] = out["cls.predictions.decoder.bias"].clone()
    return out


MAPPING = FamilyMapping(
    model_types=(BIG_BIRD.model_type,),
    config_to_spec=_config_to_spec,
    spec_to_config=_spec_to_config,
    hf_to_zoo=_hf_to_zoo,
    zoo_to_hf=_zoo_to_hf,
)
