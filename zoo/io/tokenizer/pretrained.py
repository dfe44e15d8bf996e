"""The transformers tokenizer folder, both ways: what ``save_pretrained`` writes and ``from_file`` reads back.

Written: ``tokenizer.json`` (with zoo's eos framing as a post-processor when it has none),
``tokenizer_config.json`` and ``special_tokens_map.json``, each atomically. Read: the ``model_max_length``
and special tokens of a ``tokenizer_config.json``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as HFTokenizer

from zoo.io.atomic import write_text_atomic
from zoo.io.jsonfile import read_json_object
from zoo.io.names import SPECIAL_TOKENS_MAP_NAME, TOKENIZER_CONFIG_NAME, TOKENIZER_NAME
from zoo.io.tokenizer.batch import is_int
from zoo.io.tokenizer.specials import SPECIAL_TOKENS

# transformers writes this for "no limit" (VERY_LARGE_INTEGER, int(1e30)); anything this large means unknown.
_NO_LIMIT = 10**18


def write_folder(
    directory: Path, backend: HFTokenizer, *, specials: dict[str, str | None], model_max_length: int | None
) -> Path:
    """Write ``backend`` as a transformers folder (see ``Tokenizer.save_pretrained``); returns the folder.

    ``specials`` is ``{"pad_token": "<pad>", ...}``; ``model_max_length`` is left out of the config when None.
    """
    post_processor = json.loads(backend.to_str()).get("post_processor")
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **specials,
        # Only what the model reads: GPT-2 in transformers would add token_type_ids through its wte.
        "model_input_names": [
            "input_ids",
            *(["token_type_ids"] if _has_segment_ids(post_processor) else []),
            "attention_mask",
        ],
        # transformers' extra cleanup would rewrite " ." as "." and make its decode differ from ours.
        "clean_up_tokenization_spaces": False,
        "padding_side": "right",
    }
    if model_max_length is not None:
        config["model_max_length"] = model_max_length
    write_text_atomic(directory / TOKENIZER_NAME, backend.to_str(pretty=True))
    write_text_atomic(
        directory / TOKENIZER_CONFIG_NAME, json.dumps(config, indent=2, ensure_ascii=False) + "\n"
    )
    write_text_atomic(
        directory / SPECIAL_TOKENS_MAP_NAME, json.dumps(specials, indent=2, ensure_ascii=False) + "\n"
    )
    return directory


def with_eos_template(tok: HFTokenizer, eos: int | None) -> HFTokenizer:
    """``tok``, or a copy framing rows as ``[*ids, eos]`` through a post-processor when ``tok`` has none.

    transformers frames rows only through the post-processor, so without one ``AutoTokenizer`` would
    give ``[*ids]`` where ``Tokenizer.__call__`` gives ``[*ids, eos]``. Built as JSON rather than from a
    template string, which cannot hold a token with ``:`` or spaces. All type ids are 0: zoo models have
    no segment embeddings.
    """
    if tok.post_processor is not None or eos is None:
        return tok
    token = tok.id_to_token(eos)
    sequence = [{"Sequence": {"id": "A", "type_id": 0}}, {"SpecialToken": {"id": token, "type_id": 0}}]
    pair = [*sequence, {"Sequence": {"id": "B", "type_id": 0}}, sequence[1]]
    data = json.loads(tok.to_str())
    data["post_processor"] = {
        "type": "TemplateProcessing",
        "single": sequence,
        "pair": pair,
        "special_tokens": {token: {"id": token, "ids": [eos], "tokens": [token]}},
    }
    return HFTokenizer.from_str(json.dumps(data))


def _has_segment_ids(post_processor: Any) -> bool:
    """Whether a post-processor (as JSON) gives a second segment its own type id, as BERT's does."""
    if isinstance(post_processor, dict):
        if post_processor.get("type") == "BertProcessing" or post_processor.get("type_id", 0) != 0:
            return True
        return any(_has_segment_ids(value) for value in post_processor.values())
    if isinstance(post_processor, list):
        return any(_has_segment_ids(value) for value in post_processor)
    return False


def read_tokenizer_config(path: Path) -> tuple[int | None, dict[str, str]]:
    """``model_max_length`` and the special tokens named by a transformers ``tokenizer_config.json``."""
    if not path.is_file():
        return None, {}
    config = read_json_object(path)
    limit = config.get("model_max_length")
    limit = limit if is_int(limit) and 0 < limit < _NO_LIMIT else None
    names = {}
    for name in SPECIAL_TOKENS:
        token = config.get(f"{name}_token")
        if isinstance(token, dict):  # a serialised AddedToken: {"content": "[PAD]", ...}
            token = token.get("content")
        if isinstance(token, str):
            names[name] = token
    return limit, names
