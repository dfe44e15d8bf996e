"""The names of the files zoo reads and writes, each defined once (zoo's checkpoints and Hugging Face folders).

    model.safetensors                   the weights (zoo and Hugging Face alike)
    model-00001-of-00003.safetensors    a shard, listed in model.safetensors.index.json
    spec.json                           zoo's spec, beside zoo's weights
    config.json                         a Hugging Face model config
    tokenizer.json                      a `tokenizers` file (zoo's and Hugging Face's)
    tokenizer_config.json               transformers' tokenizer settings
    special_tokens_map.json             transformers' special tokens

Imports nothing heavy, so the CLI and the training code can name files without loading torch.
"""

from __future__ import annotations

import re

WEIGHTS_NAME = "model.safetensors"
INDEX_NAME = "model.safetensors.index.json"
SHARD_PATTERN = re.compile(r"model-\d{5}-of-\d{5}\.safetensors")
SPEC_NAME = "spec.json"
CONFIG_NAME = "config.json"
TOKENIZER_NAME = "tokenizer.json"
TOKENIZER_CONFIG_NAME = "tokenizer_config.json"
SPECIAL_TOKENS_MAP_NAME = "special_tokens_map.json"


def shard_name(index: int, count: int) -> str:
    """``model-00001-of-00003.safetensors`` for index 0 of 3, as Hugging Face names shards."""
    return f"model-{index + 1:05d}-of-{count:05d}.safetensors"
