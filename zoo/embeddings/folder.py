"""What a sentence-transformers folder says about embedding: the pooling, the normalisation, the length.

A sentence-transformers model is a Hugging Face folder plus a few small files that name the steps after the
transformer (read here, never executed):

    modules.json                  the pipeline: [Transformer, Pooling, Normalize], each with its folder
    sentence_bert_config.json     in the Transformer's folder: max_seq_length, do_lower_case
    1_Pooling/config.json         the pooling: ``pooling_mode`` ("mean", a list of modes) or the older
                                  ``pooling_mode_mean_tokens: true`` switches; ``include_prompt``
    config_sentence_transformers.json   ``default_prompt_name`` and its ``prompts``

A folder without ``modules.json`` (a plain Hugging Face or zoo folder) gets what sentence-transformers gives
one: mean pooling, no normalisation. Only the Transformer, Pooling and Normalize modules are understood; any
other (Dense, LayerNorm, a Router...) is refused, naming it, rather than silently left out of the vectors.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Literal, get_args

from zoo.io.atomic import write_text_atomic
from zoo.io.jsonfile import read_json, read_json_object
from zoo.io.names import POOLING_CONFIG_NAME, SBERT_CONFIG_NAME, ST_CONFIG_NAME, ST_MODULES_NAME
from zoo.io.paths import inside

PoolingMode = Literal["mean", "cls", "max", "lasttoken", "mean_sqrt_len_tokens", "weightedmean"]
POOLING_MODES: tuple[str, ...] = get_args(PoolingMode)

# The older config's switches, in the order sentence-transformers concatenates their vectors.
_LEGACY_SWITCHES = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}
_SUPPORTED = ("Transformer", "Pooling", "Normalize")


class EmbeddingConfigError(ValueError):
    """A sentence-transformers file zoo cannot follow: the message names the file and what was expected."""


@dataclass(frozen=True)
class FolderSettings:
    """The embedding settings a folder gives, before the caller's arguments override them.

    ``model_dir``: the Transformer module's folder (the model and its tokenizer; None for a model that
    came from no folder); ``pooling``: the modes,
    their vectors concatenated in this order (None: the folder names none); ``normalize``: a Normalize
    module follows the pooling; ``max_length``: ``max_seq_length`` (None: the tokenizer's and the model's
    limits decide); ``lowercase``: ``do_lower_case``; ``prompt``: text put before every input (the
    default prompt), and ``include_prompt``: whether its tokens count in the pooling.
    """

    model_dir: Path | None
    pooling: tuple[str, ...] | None = None
    normalize: bool = False
    max_length: int | None = None
    lowercase: bool = False
    prompt: str | None = None
    include_prompt: bool = True
    from_modules: bool = False


def read_folder_settings(folder: Path) -> FolderSettings:
    """The settings of ``folder``: a sentence-transformers folder (``modules.json``), else mean pooling."""
    modules_file = folder / ST_MODULES_NAME
    if not modules_file.is_file():
        return FolderSettings(model_dir=folder)
    modules = read_json(inside(folder, ST_MODULES_NAME), error=EmbeddingConfigError)
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        raise EmbeddingConfigError(
            f"{modules_file}: expected a JSON list of modules ({{type, path}} objects)"
        )
    kinds = [_kind(m, modules_file, i) for i, m in enumerate(modules)]
    for i, kind in enumerate(kinds):
        if kind not in _SUPPORTED:
            raise EmbeddingConfigError(
                f"{modules_file}: module {i} is {modules[i].get('type')!r} (path {modules[i].get('path')!r}), "
                f"which zoo.embed does not support; it follows {', '.join(_SUPPORTED)} modules only"
            )
    if not kinds or kinds[0] != "Transformer" or kinds.count("Transformer") > 1:
        raise EmbeddingConfigError(
            f"{modules_file}: expected one Transformer module, the first; got {', '.join(kinds) or 'none'}"
        )
    if kinds.count("Pooling") > 1 or ("Pooling" in kinds and kinds.index("Pooling") != 1):
        raise EmbeddingConfigError(
            f"{modules_file}: expected at most one Pooling module, right after the Transformer; got "
            f"{', '.join(kinds)}"
        )
    model_dir = _module_dir(folder, modules[0], modules_file)
    max_length, lowercase = _transformer_config(model_dir)
    pooling, include_prompt = (None, True)
    if "Pooling" in kinds:
        pooling, include_prompt = _pooling_config(_module_dir(folder, modules[1], modules_file))
    prompt = _default_prompt(folder)
    return FolderSettings(
        model_dir=model_dir,
        pooling=pooling,
        # Normalize after a Pooling: a Normalize before it would act on token vectors, not on sentences.
        normalize="Normalize" in kinds and "Pooling" in kinds,
        max_length=max_length,
        lowercase=lowercase,
        prompt=prompt,
        include_prompt=include_prompt,
        from_modules=True,
    )


def write_folder_settings(folder: Path, settings: FolderSettings, *, dim: int) -> None:
    """Make ``folder`` (a Hugging Face folder: config, weights, tokenizer) a sentence-transformers folder that
    `read_folder_settings` reads back as ``settings``: ``modules.json`` (Transformer at the folder itself,
    Pooling, Normalize when ``settings.normalize``), ``sentence_bert_config.json`` and
    ``1_Pooling/config.json`` (the older switches, which every sentence-transformers version reads; ``dim``
    is the token vectors' width). A prompt is not written (an `EmbeddingConfigError`)."""
    modes = settings.pooling or ("mean",)
    if settings.prompt is not None or settings.lowercase:
        raise EmbeddingConfigError(f"{folder}: writing a prompt or do_lower_case is not supported")
    legacy = [mode for mode in _LEGACY_SWITCHES.values() if mode in modes]
    if list(modes) != legacy:
        raise EmbeddingConfigError(
            f"{folder}: pooling {list(modes)} must follow the order {list(_LEGACY_SWITCHES.values())}"
        )
    kinds = ["Transformer", "Pooling", *(["Normalize"] if settings.normalize else [])]
    paths = {"Transformer": "", "Pooling": "1_Pooling", "Normalize": "2_Normalize"}
    modules = [
        {"idx": i, "name": str(i), "path": paths[kind], "type": f"sentence_transformers.models.{kind}"}
        for i, kind in enumerate(kinds)
    ]
    pooling = {"word_embedding_dimension": dim} | {
        key: mode in modes for key, mode in _LEGACY_SWITCHES.items()
    }
    sbert = {"max_seq_length": settings.max_length, "do_lower_case": False}
    (folder / "1_Pooling").mkdir(exist_ok=True)
    if settings.normalize:
        (folder / "2_Normalize").mkdir(exist_ok=True)
    _write_json(folder / "1_Pooling" / POOLING_CONFIG_NAME, pooling)
    _write_json(folder / SBERT_CONFIG_NAME, sbert)
    _write_json(folder / ST_MODULES_NAME, modules)  # last: the folder is a sentence-transformers one now


def _write_json(path: Path, data: Any) -> None:
    write_text_atomic(path, json.dumps(data, indent=2) + "\n")


def check_pooling(pooling: object, *, where: str = "pooling") -> tuple[str, ...]:
    """``pooling`` (a mode, or a list of modes whose vectors are concatenated) as a tuple of modes."""
    modes = [pooling] if isinstance(pooling, str) else pooling
    if not isinstance(modes, (list, tuple)) or not modes or any(m not in POOLING_MODES for m in modes):
        raise ValueError(
            f"{where} must be one of {', '.join(POOLING_MODES)}, or a non-empty list of them; got {pooling!r}"
        )
    return tuple(modes)


def _kind(module: dict[str, Any], file: Path, index: int) -> str:
    """``sentence_transformers.models.Pooling`` (or ``...modules.pooling.Pooling``) -> ``Pooling``."""
    kind = module.get("type")
    if not isinstance(kind, str) or not kind:
        raise EmbeddingConfigError(f"{file}: module {index} has no 'type' (a class name such as Pooling)")
    return kind.rsplit(".", 1)[-1]


def _module_dir(folder: Path, module: dict[str, Any], file: Path) -> Path:
    """The module's folder: ``path`` relative to ``folder`` ("" is the folder itself), never out of it."""
    path = module.get("path", "")
    if not isinstance(path, str) or PurePosixPath(path).is_absolute() or ".." in PurePosixPath(path).parts:
        raise EmbeddingConfigError(f"{file}: module path {path!r} must be a folder inside {folder}")
    return inside(folder, path, error=EmbeddingConfigError) if path else folder


def _transformer_config(model_dir: Path) -> tuple[int | None, bool]:
    """``max_seq_length`` and ``do_lower_case`` of ``sentence_bert_config.json``, when there is one."""
    file = model_dir / SBERT_CONFIG_NAME
    if not file.is_file():
        return None, False
    config = read_json_object(inside(model_dir, SBERT_CONFIG_NAME), error=EmbeddingConfigError)
    max_length = config.get("max_seq_length")
    if max_length is not None and (type(max_length) is not int or max_length < 1):
        raise EmbeddingConfigError(f"{file}: max_seq_length must be an int >= 1 or null, got {max_length!r}")
    lowercase = config.get("do_lower_case", False)
    if not isinstance(lowercase, bool):
        raise EmbeddingConfigError(f"{file}: do_lower_case must be true or false, got {lowercase!r}")
    return max_length, lowercase


def _pooling_config(pooling_dir: Path) -> tuple[tuple[str, ...], bool]:
    """The modes of a Pooling module's ``config.json`` (new ``pooling_mode`` or the older switches)."""
    file = pooling_dir / POOLING_CONFIG_NAME
    if not file.is_file():  # sentence-transformers' Pooling() defaults
        return ("mean",), True
    config = read_json_object(inside(pooling_dir, POOLING_CONFIG_NAME), error=EmbeddingConfigError)
    if "pooling_mode" in config:
        try:
            modes = check_pooling(config["pooling_mode"], where=f"{file}: pooling_mode")
        except ValueError as error:
            raise EmbeddingConfigError(str(error)) from None
    else:
        modes = tuple(mode for key, mode in _LEGACY_SWITCHES.items() if config.get(key) is True) or ("mean",)
    include_prompt = config.get("include_prompt", True)
    if not isinstance(include_prompt, bool):
        raise EmbeddingConfigError(f"{file}: include_prompt must be true or false, got {include_prompt!r}")
    return modes, include_prompt


def _default_prompt(folder: Path) -> str | None:
    """The text of ``default_prompt_name`` in ``config_sentence_transformers.json`` (None: no prompt)."""
    file = folder / ST_CONFIG_NAME
    if not file.is_file():
        return None
    config = read_json_object(inside(folder, ST_CONFIG_NAME), error=EmbeddingConfigError)
    name = config.get("default_prompt_name")
    if name is None:
        return None
    prompts = config.get("prompts") or {}
    if not isinstance(prompts, dict) or not isinstance(prompts.get(name), str):
        raise EmbeddingConfigError(f"{file}: default_prompt_name {name!r} is not one of its prompts")
    return prompts[name] or None
