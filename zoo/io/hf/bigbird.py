"""Hugging Face BigBird <-> zoo: ``BigBirdModel``, ``BigBirdForMaskedLM`` (``model_type: big_bird``).

BigBird (Zaheer et al. 2020, "Big Bird: Transformers for Longer Sequences"; transformers'
``models/big_bird/modeling_big_bird.py``) is BERT with two options and a sparse attention pattern, so the
tensor table and most of the config are `zoo.io.hf.bert`'s, through a BigBird `Variant` row:

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

from collections.abc import Mapping
from typing import Any

from zoo.io.hf.bert import BERT_DEFAULTS, BERT_LAYER, BERT_MLM, NSP, Variant, classes, mapping
from zoo.io.hf.common import HFError, architecture
from zoo.spec import EncoderSpec

_ARCHITECTURES = ("BigBirdModel", "BigBirdForMaskedLM", "BigBirdForPreTraining")
# ITC's fixed shape (BigBirdBlockSparseAttention): a 3-block window, one global block at each end
WINDOW_BLOCKS, GLOBAL_BLOCKS = 3, 1
_OPTIONS = {"attention_type": "block_sparse", "use_bias": True, "rescale_embeddings": False, "block_size": 64,
           "num_random_blocks": 3}  # fmt: skip


def _read(config: Mapping[str, Any], names: set[str]) -> dict[str, Any]:
    """Only the body, its pooler and the pretraining heads convert (no classifier, QA or causal LM head); then
    BigBird's own options, over BERT's reading."""
    arch = architecture(config)
    if arch not in (None, *_ARCHITECTURES):
        raise HFError(
            f"config.json architectures={config['architectures']!r} is not supported; zoo reads "
            f"{', '.join(_ARCHITECTURES)} (without its next-sentence head)"
        )
    heads = sorted(n for n in names if n.split(".")[0] in ("classifier", "qa_classifier"))
    if heads:
        raise HFError(f"the checkpoint has a task head zoo cannot read for BigBird: {', '.join(heads[:3])}")
    config = {**_OPTIONS, **config}  # BigBirdConfig's defaults
    attention_type = config["attention_type"]
    if attention_type not in ("original_full", "block_sparse"):
        raise HFError(
            f"config.json attention_type={attention_type!r} is not supported; BigBird has 'original_full' "
            "and 'block_sparse'"
        )
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
    return changes


def _write(spec: EncoderSpec) -> dict[str, Any]:
    family, stack = BIG_BIRD.model_type, spec.stacks()["encoder"]
    if stack.layer_patterns is not None:
        raise HFError(
            f"{family} cannot express encoder.layer_patterns: Hugging Face {family} has one attention_type "
            "for every layer"
        )
    pattern = stack.pattern
    sparse: dict[str, Any] = {"attention_type": "original_full"}
    if pattern.kind == "block_sparse":  # its window and global blocks read back as ITC's
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
    return sparse | {"use_bias": stack.attention.bias, "rescale_embeddings": spec.embedding.scale}


BIG_BIRD = Variant(
    "big_bird",
    "bert.",
    classes("BigBird", classifiers=False),  # BigBird's sequence head applies hidden_act, not zoo's tanh
    # BigBirdConfig's defaults (= google/bigbird-roberta-base), for configs that leave a field out
    BERT_DEFAULTS | {"vocab_size": 50358, "hidden_act": "gelu_new", "max_position_embeddings": 4096,
                     "bos_token_id": 1, "eos_token_id": 2},
    BERT_MLM,  # the head's transform uses hidden_act, as BERT's
    BERT_LAYER,
    pooler="pooler",  # a bare Linear, where BERT's is pooler.dense
    ignored=(NSP,),  # BigBirdForPreTraining's next-sentence head
    read=_read,
    write=_write,
)  # fmt: skip
MAPPING = mapping(BIG_BIRD)
