"""The transformers tokenizer folder, both ways: what ``save_pretrained`` writes and ``from_file`` reads back.

Written: ``tokenizer.json`` (with zoo's framing, bos and eos as asked, as a post-processor when it has
none), ``tokenizer_config.json`` (that framing's ``add_bos_token`` / ``add_eos_token``, the chat template when
there is one) and ``special_tokens_map.json``, each atomically. Read: the ``model_max_length``, special
tokens and chat templates of a ``tokenizer_config.json``, and a ``chat_template.jinja`` beside it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NamedTuple

from tokenizers import Tokenizer as HFTokenizer

from zoo.io.atomic import write_text_atomic
from zoo.io.jsonfile import check_file_size, read_json_object
from zoo.io.names import SPECIAL_TOKENS_MAP_NAME, TOKENIZER_CONFIG_NAME, TOKENIZER_NAME
from zoo.io.tokenizer.batch import is_int
from zoo.io.tokenizer.errors import TokenizerError
from zoo.io.tokenizer.specials import SPECIAL_TOKENS
from zoo.spec.limits import Limit

# transformers writes this for "no limit" (VERY_LARGE_INTEGER, int(1e30)); anything this large means unknown.
_NO_LIMIT = 10**18
# A chat template is a page of Jinja; a file this large is not one (read whole, then compiled).
TEMPLATE_BYTES = Limit("ZOO_MAX_CHAT_TEMPLATE_BYTES", 4 * 2**20, "bytes")


def write_folder(
    directory: Path,
    backend: HFTokenizer,
    *,
    specials: dict[str, str | None],
    model_max_length: int | None,
    chat_templates: dict[str, str] | None = None,
    flags: dict[str, bool] | None = None,
) -> Path:
    """Write ``backend`` as a transformers folder (see ``Tokenizer.save_pretrained``); returns the folder.

    ``specials`` is ``{"pad_token": "<pad>", ...}``; ``model_max_length`` is left out of the config when None;
    ``chat_templates`` (``{"default": source, ...}``) go to its ``"chat_template"`` (`config_templates`);
    ``flags`` (`framing_flags`) go to the config as they are.
    """
    config = tokenizer_config(
        backend, specials=specials, model_max_length=model_max_length, chat_templates=chat_templates
    ) | (flags or {})
    write_text_atomic(directory / TOKENIZER_NAME, backend.to_str(pretty=True))
    write_text_atomic(
        directory / TOKENIZER_CONFIG_NAME, json.dumps(config, indent=2, ensure_ascii=False) + "\n"
    )
    write_text_atomic(
        directory / SPECIAL_TOKENS_MAP_NAME, json.dumps(specials, indent=2, ensure_ascii=False) + "\n"
    )
    return directory


def tokenizer_config(
    backend: HFTokenizer,
    *,
    specials: dict[str, str | None],
    model_max_length: int | None,
    chat_templates: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The ``tokenizer_config.json`` of ``backend``: what transformers needs to give zoo's ids and text."""
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
    if chat_templates:
        config["chat_template"] = config_templates(chat_templates)
    return config


def config_templates(templates: dict[str, str]) -> str | list[dict[str, str]]:
    """Chat templates as a ``tokenizer_config.json`` holds them: the default one alone as a string, several
    as ``[{"name": ..., "template": ...}]`` (transformers reads both)."""
    if list(templates) == ["default"]:
        return templates["default"]
    return [{"name": name, "template": source} for name, source in templates.items()]


def with_framing(tok: HFTokenizer, *, bos: int | None, eos: int | None) -> HFTokenizer:
    """A copy of ``tok`` framing rows as ``[bos, *ids, eos]`` through a post-processor (``bos`` / ``eos``
    None: left out), for a tokenizer without one; pairs are ``[bos, *a, eos, *b, eos]``.

    transformers frames rows only through the post-processor, so without one ``AutoTokenizer`` would give
    ``[*ids]``. Built as JSON rather than from a template string, which cannot hold a token with ``:`` or
    spaces. All type ids are 0: zoo models have no segment embeddings.
    """
    first = [{"SpecialToken": {"id": tok.id_to_token(bos), "type_id": 0}}] if bos is not None else []
    last = [{"SpecialToken": {"id": tok.id_to_token(eos), "type_id": 0}}] if eos is not None else []
    single = [*first, {"Sequence": {"id": "A", "type_id": 0}}, *last]
    data = json.loads(tok.to_str())
    data["post_processor"] = {
        "type": "TemplateProcessing",
        "single": single,
        "pair": [*single, {"Sequence": {"id": "B", "type_id": 0}}, *last],
        "special_tokens": {
            token: {"id": token, "ids": [i], "tokens": [token]}
            for i in (bos, eos)
            if i is not None and (token := tok.id_to_token(i)) is not None
        },
    }
    return HFTokenizer.from_str(json.dumps(data))


def framing_flags(tok: HFTokenizer, *, bos: int | None, eos: int | None) -> dict[str, bool]:
    """``{"add_bos_token": ..., "add_eos_token": ...}`` for the `with_framing` of ``bos`` / ``eos``, as a
    ``tokenizer_config.json`` says it; empty when a token cannot be written so.

    transformers 5 rebuilds the post-processor from these flags when a config has them, from a template
    string (``"<s>:0 $A:0"``), which cannot hold a token with ``:`` or spaces: such a tokenizer gets no flags,
    and its post-processor alone frames the rows (transformers keeps it then).
    """
    tokens = [tok.id_to_token(i) or "" for i in (bos, eos) if i is not None]
    if any(":" in token or any(ch.isspace() for ch in token) for token in tokens):
        return {}
    return {"add_bos_token": bos is not None, "add_eos_token": eos is not None}


def _has_segment_ids(post_processor: Any) -> bool:
    """Whether a post-processor (as JSON) gives a second segment its own type id, as BERT's does."""
    if isinstance(post_processor, dict):
        if post_processor.get("type") == "BertProcessing" or post_processor.get("type_id", 0) != 0:
            return True
        return any(_has_segment_ids(value) for value in post_processor.values())
    if isinstance(post_processor, list):
        return any(_has_segment_ids(value) for value in post_processor)
    return False


class TokenizerConfig(NamedTuple):
    """What a transformers folder says about its tokenizer beyond ``tokenizer.json`` (`read_tokenizer_config`)."""

    model_max_length: int | None
    special_tokens: dict[str, str]  # zoo's names: {"pad": "[PAD]", ...}, the ones zoo looks up
    named_tokens: dict[str, str] | None  # every "*_token" string: {"bos_token": "<s>", ...}; None: no config
    chat_templates: dict[str, str]  # {"default": source, "tool_use": source, ...}
    chat_template_file: str | None  # the file the templates came from, for messages


def read_tokenizer_config(path: Path, template_path: Path | None = None) -> TokenizerConfig:
    """What the transformers ``tokenizer_config.json`` at ``path`` names: ``model_max_length``, the special
    tokens and the chat templates; ``template_path`` is a ``chat_template.jinja`` beside it, which wins over
    the config's ``"chat_template"`` when it exists, as in transformers (which writes that file since 4.43).

    ``"chat_template"`` is a string, or a list of ``{"name": ..., "template": ...}``. A special token is a
    string or a serialised ``AddedToken`` (``{"content": "[PAD]", ...}``); ``named_tokens`` holds every
    ``*_token`` key so given (``sep_token``, ``cls_token``, model-specific ones such as ``image_token``)
    plus the named ``extra_special_tokens``: the variables transformers gives a chat template.
    """
    config = read_json_object(path) if path.is_file() else None
    if config is None:
        limit, named = None, None
    else:
        limit = config.get("model_max_length")
        limit = limit if is_int(limit) and 0 < limit < _NO_LIMIT else None
        named = {key: token for key, value in config.items() if (token := _token(key, value)) is not None}
        extra = config.get("extra_special_tokens")
        if isinstance(extra, dict):  # {"image_token": "<image>", ...}: more named tokens
            named.update(
                {key: token for key, value in extra.items() if (token := _token(key, value)) is not None}
            )
    names = {
        name: token for name in SPECIAL_TOKENS if (token := (named or {}).get(f"{name}_token")) is not None
    }
    templates = _templates(config.get("chat_template") if config else None, path)
    source = str(path) if templates else None
    if template_path is not None and template_path.is_file():
        check_file_size(template_path, TEMPLATE_BYTES, what="chat template", error=TokenizerError)
        try:
            templates["default"] = template_path.read_text(encoding="utf-8")
        except UnicodeDecodeError as error:
            raise TokenizerError(f"{template_path}: a chat template must be UTF-8 text: {error}") from None
        source = str(template_path)
    return TokenizerConfig(limit, names, named, templates, source)


def _token(key: object, value: object) -> str | None:
    """The token a config entry ``key: value`` names (``"bos_token": "<s>"`` or an AddedToken dict), or None."""
    if not isinstance(key, str) or not key.endswith("_token"):
        return None
    if isinstance(value, dict):  # a serialised AddedToken: {"content": "[PAD]", ...}
        value = value.get("content")
    return value if isinstance(value, str) else None


def _templates(value: object, path: Path) -> dict[str, str]:
    """A config's ``"chat_template"`` as ``{name: source}``: a string is the default one."""
    if value is None:
        return {}
    if isinstance(value, str):
        return {"default": value}
    if isinstance(value, list) and all(
        isinstance(item, dict) and isinstance(item.get("name"), str) and isinstance(item.get("template"), str)
        for item in value
    ):
        return {item["name"]: item["template"] for item in value}
    raise TokenizerError(
        f"{path}: chat_template must be a string or a list of {{'name': ..., 'template': ...}}, "
        f"got {type(value).__name__}"
    )
