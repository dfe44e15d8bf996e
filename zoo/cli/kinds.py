"""Which kind of file or folder the user gave, so that a mix-up is one line saying what it is and which
command takes it, rather than a page of validation errors.

    zoo train examples/my_stack.yaml
    error: examples/my_stack.yaml is a model spec, not a training config; `zoo show examples/my_stack.yaml`
    shows it, and a training config trains it with model: {file: examples/my_stack.yaml}

`file_kind` recognises a file by its top-level keys (a folder by the files in it): a model spec
(``family``), a training config (``model`` + ``data``), a Hugging Face ``config.json`` (``model_type``), a
``tokenizer.json`` (``added_tokens``); a training run's folder (``train_config.yaml``), a zoo checkpoint
(``spec.json``), a Hugging Face folder (``config.json``). A command wraps its loading in `expecting`: when
loading fails and the target is recognised as another kind, the error becomes that one line; a target of the
expected kind (or of none known) keeps its own error, which names the field that is wrong.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zoo.io.jsonfile import parse_json
from zoo.io.names import CHECKPOINTS_DIR, CONFIG_NAME, SPEC_NAME, TRAIN_CONFIG_NAME, WEIGHTS_NAME

_MAX_BYTES = 64 * 2**20  # a tokenizer.json can be tens of MB; anything larger is none of these
_SPEC_KEYS = {"family", "d_model", "num_layers", "vocab_size", "attention", "ffn", "max_positions"}


@dataclass(frozen=True)
class Kind:
    """A kind of file or folder: what to call it, and (``{path}``, ``{folder}``: the target, its folder;
    shell-quoted) which command takes it."""

    name: str
    use: str

    def usage(self, target: str | Path) -> str:
        path = Path(target)
        return self.use.format(
            path=shlex.quote(str(target)),
            folder=shlex.quote(str(path.parent)),
            config=shlex.quote(str(path / TRAIN_CONFIG_NAME)),
        )


SPEC = Kind(
    "a model spec",
    "`zoo show {path}` shows it, and a training config trains it with model: {{file: {path}}}",
)
TRAIN_CONFIG = Kind("a training config", "`zoo train {path}` runs it")
HF_CONFIG = Kind(
    "a Hugging Face config.json",
    "give its folder: `zoo show {folder}`, or `zoo convert --from-hf {folder} --out DIR` to import it",
)
TOKENIZER = Kind("a tokenizer", "a training config reuses it with tokenizer: {{path: {path}}}")
HF_FOLDER = Kind(
    "a Hugging Face checkpoint folder",
    "`zoo show {path}` shows it; `zoo convert --from-hf {path} --out DIR` imports it",
)
CHECKPOINT = Kind(
    "a zoo checkpoint",
    "`zoo show`, `zoo generate`, `zoo translate` or `zoo convert --to-hf {path} --out DIR` take it",
)
RUN = Kind(
    "a training run's folder",
    "its model goes to `zoo show`, `zoo generate`, `zoo translate` or `zoo convert --to-hf {path} --out DIR`; "
    "`zoo train {config} --resume` continues the run",
)


def file_kind(target: str | Path) -> Kind | None:
    """The kind of ``target`` (a file or folder), or None when it is none of the known kinds (or unreadable).

    A folder: a training run's (``train_config.yaml`` or ``checkpoints/``), else a zoo checkpoint
    (``spec.json`` or ``model.safetensors`` without a ``config.json``), else a Hugging Face one
    (``config.json``). A file: by the top-level keys of its YAML or JSON mapping (`mapping_kind`).
    """
    path = Path(target).expanduser()
    try:
        if path.is_dir():
            if (path / TRAIN_CONFIG_NAME).is_file() or (path / CHECKPOINTS_DIR).is_dir():
                return RUN
            if (path / SPEC_NAME).is_file():
                return CHECKPOINT
            if (path / CONFIG_NAME).is_file():
                return HF_FOLDER
            return CHECKPOINT if (path / WEIGHTS_NAME).is_file() else None
        if not path.is_file() or path.suffix == ".safetensors" or path.stat().st_size > _MAX_BYTES:
            return None
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    return mapping_kind(_parse(text))


def mapping_kind(data: Any) -> Kind | None:
    """The kind of a parsed file, by its top-level keys; None for anything else."""
    if not isinstance(data, dict):
        return None
    keys = {str(key) for key in data}
    if "added_tokens" in keys or ("model" in keys and keys & {"normalizer", "pre_tokenizer", "decoder"}):
        return TOKENIZER
    if keys & {"model_type", "architectures"}:
        return HF_CONFIG
    if "data" in keys or ("model" in keys and isinstance(data["model"], dict)):
        return TRAIN_CONFIG
    if keys & _SPEC_KEYS:
        return SPEC
    return None


def _parse(text: str) -> Any:
    """JSON (fast, for a large tokenizer.json), else bounded YAML; None when it is neither."""
    try:
        return parse_json(text, where="")  # bounded: a file nested 50,000 deep is "neither", not a crash
    except ValueError:
        pass
    import yaml

    from zoo.spec.files import load_yaml

    try:
        return load_yaml(text)
    except (yaml.YAMLError, ValueError):
        return None


def mismatch(target: str | Path, found: Kind, expected: str) -> str:
    """``"X is a model spec, not a training config; `zoo show X` shows it, ..."``."""
    return f"{target} is {found.name}, not {expected}; {found.usage(target)}"


@contextmanager
def expecting(target: str | Path | None, *kinds: Kind, expected: str) -> Iterator[None]:
    """Around the loading of ``target``: a user error (ValueError, OSError) raised inside becomes the one
    line of `mismatch` when ``target`` is recognised as a kind not in ``kinds``; otherwise it is kept."""
    try:
        yield
    except (ValueError, OSError) as error:
        if target is None:
            raise
        found = file_kind(target)
        if found is None or found in kinds:
            raise
        raise ValueError(mismatch(target, found, expected)) from error
