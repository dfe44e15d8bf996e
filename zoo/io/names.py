"""The names of the files zoo reads and writes, each defined once (zoo's checkpoints and Hugging Face folders).

    model.safetensors                   the weights (zoo and Hugging Face alike)
    model-00001-of-00003.safetensors    a Hugging Face shard, listed in model.safetensors.index.json
    model-00001-of-00003-9f2c41d0.safetensors
                                        a zoo shard: the suffix is unique to one save, so a save never
                                        overwrites a shard the current index still names
    spec.json                           zoo's spec, beside zoo's weights
    config.json                         a Hugging Face model config
    tokenizer.json                      a `tokenizers` file (zoo's and Hugging Face's)
    tokenizer_config.json               transformers' tokenizer settings
    special_tokens_map.json             transformers' special tokens
    chat_template.jinja                 a chat template (transformers >= 4.43 writes it beside the config)

Imports nothing heavy, so the CLI and the training code can name files without loading torch.
"""

from __future__ import annotations

import re

WEIGHTS_NAME = "model.safetensors"
INDEX_NAME = "model.safetensors.index.json"
HF_SHARD_PATTERN = re.compile(r"model-\d{5}-of-\d{5}\.safetensors")
SHARD_PATTERN = re.compile(r"model-\d{5}-of-\d{5}(-[0-9a-f]{8})?\.safetensors")  # Hugging Face's or zoo's
SPEC_NAME = "spec.json"
CONFIG_NAME = "config.json"
TOKENIZER_NAME = "tokenizer.json"
TOKENIZER_CONFIG_NAME = "tokenizer_config.json"
SPECIAL_TOKENS_MAP_NAME = "special_tokens_map.json"
CHAT_TEMPLATE_NAME = "chat_template.jinja"


def shard_name(index: int, count: int, tag: str | None = None) -> str:
    """``model-00001-of-00003.safetensors`` for index 0 of 3, as Hugging Face names shards; with ``tag``
    (8 hex digits, one save's own), ``model-00001-of-00003-<tag>.safetensors``."""
    return f"model-{index + 1:05d}-of-{count:05d}{f'-{tag}' if tag else ''}.safetensors"


def is_plain_file_name(name: object) -> bool:
    """Whether ``name`` is a bare file name: no folder part, not absolute, not ``.`` or ``..``, no drive.

    What an index may name: joined to the checkpoint folder it stays in that folder (the name itself cannot
    leave; a symlink there is followed only while it stays in the folder, or in Hugging Face's cache, whose
    snapshots link to its blobs: `zoo.io.paths.inside`).
    """
    return (
        isinstance(name, str)
        and name not in ("", ".", "..")
        and not any(sep in name for sep in ("/", "\\", ":", "\0"))
    )
