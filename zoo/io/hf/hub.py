"""Hugging Face Hub ids for `zoo.from_hf`: ``"name"`` or ``"org/name"``, optionally ``"@revision"``, read
from huggingface_hub's local cache (downloaded into it where the network and ``HF_HUB_OFFLINE`` allow).

    zoo.from_hf("Helsinki-NLP/opus-mt-en-de")          # main's snapshot: cached, else downloaded
    zoo.from_hf("Helsinki-NLP/opus-mt-en-de@<commit>")  # a branch, a tag or a commit hash
    HF_HUB_OFFLINE=1                                    # the cache only; an id not in it is an error

A string is a folder when that path exists, and a Hub id only otherwise (an ``os.PathLike`` is always a
folder); ``org/name`` whose ``org`` is a folder here (``runs/demo`` beside ``runs/``) is a missing folder,
never looked up on the Hub (`names_a_local_path`). The cache is huggingface_hub's (``HF_HUB_CACHE``, default ``~/.cache/huggingface/hub``):

    models--org--name/
        blobs/<hash>                        the files' contents
        refs/main                           the commit the branch pointed to when it was downloaded
        snapshots/<commit>/config.json      symbolic links into blobs/: the folder `from_hf` reads

Only what zoo reads is fetched: ``config.json``, the top-level safetensors weights and their index, the
tokenizer files; never a pickled ``pytorch_model.bin``. huggingface_hub is the optional ``hub`` extra and is
imported only when a Hub id is read.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from zoo._extras import install_hint
from zoo.io.hf.common import HFError
from zoo.io.names import (
    CONFIG_NAME,
    INDEX_NAME,
    SPECIAL_TOKENS_MAP_NAME,
    TOKENIZER_CONFIG_NAME,
    TOKENIZER_NAME,
)

__all__ = ["HubDependencyError", "hub_cache_dir", "names_a_local_path", "parse_hub_id", "resolve_checkpoint"]

INSTALL_HINT = install_hint("hub")
ALLOW_PATTERNS = [
    CONFIG_NAME,
    "*.safetensors",
    INDEX_NAME,
    TOKENIZER_NAME,
    TOKENIZER_CONFIG_NAME,
    SPECIAL_TOKENS_MAP_NAME,
]
IGNORE_PATTERNS = ["*/*"]  # top level only: not onnx/, not sentence-transformers' module folders

# huggingface_hub's repo id rule (validate_repo_id): word characters, '-' and '.', one optional 'org/'
# part, no '--' or '..', at most 96 characters; then '@' and a branch, tag or commit.
_HUB_ID = re.compile(r"(?P<repo>(?:\w[\w.-]*/)?\w[\w.-]*)(?:@(?P<revision>\w[\w./-]*))?")
_TRUE = {"1", "ON", "YES", "TRUE"}  # huggingface_hub's spellings of a true environment variable


class HubDependencyError(ImportError, HFError):
    """huggingface_hub is not installed (an HFError too, so the CLI shows the message, not a traceback)."""


def parse_hub_id(text: str) -> tuple[str, str | None] | None:
    """``(repo_id, revision)`` when ``text`` reads as a Hub id (``name``, ``org/name``, ``...@revision``)."""
    match = _HUB_ID.fullmatch(text)
    if match is None:
        return None
    repo = match["repo"]
    if ".." in text or "--" in repo or len(repo) > 96 or repo.endswith((".", "-")):
        return None
    return repo, match["revision"]


def names_a_local_path(text: str) -> bool:
    """Whether ``text``, though it may read as ``org/name``, names a path here: its first part is a folder in
    the working directory (``runs/demo`` beside ``runs/``). Where ``demo`` is missing, the user mistyped a
    folder; a Hub repository named ``runs/demo`` is not what they meant. (``./x``, ``../x``, ``/x`` and
    ``~/x`` are no Hub ids at all: `parse_hub_id`.)"""
    head, sep, _ = text.partition("/")
    return bool(sep) and Path(head).is_dir()


def resolve_checkpoint(path: str | os.PathLike[str]) -> Path:
    """The folder a `from_hf` argument names: an existing path, any ``os.PathLike`` and anything that is not
    a Hub id as given or names a local path (`names_a_local_path`; the caller reports a missing folder); else
    the Hub id's snapshot in the cache."""
    folder = Path(path).expanduser()
    if not isinstance(path, str) or folder.exists():
        return folder
    parsed = parse_hub_id(path)
    if parsed is None or names_a_local_path(path):
        return folder
    return snapshot(*parsed, asked=path)


def hub_cache_dir() -> Path:
    """huggingface_hub's cache folder, from the environment as it is now (huggingface_hub reads it once, at
    import): ``HF_HUB_CACHE``, else ``HUGGINGFACE_HUB_CACHE``, else ``$HF_HOME/hub``, else
    ``$XDG_CACHE_HOME/huggingface/hub`` (``~/.cache`` by default)."""
    env = os.environ
    home = env.get("HF_HOME") or os.path.join(env.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")
    cache = env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE") or os.path.join(home, "hub")
    return Path(os.path.expandvars(cache)).expanduser()


def downloads_off() -> bool:
    """Whether ``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``) is set in the environment now."""
    flags = (os.environ.get("HF_HUB_OFFLINE"), os.environ.get("TRANSFORMERS_OFFLINE"))
    return any((flag or "").upper() in _TRUE for flag in flags)


def snapshot(repo_id: str, revision: str | None = None, *, asked: str | None = None) -> Path:
    """The cached snapshot folder of ``repo_id`` at ``revision`` (main by default), downloading the files
    zoo reads unless downloads are off. Errors name the id, the cache and what to do."""
    _require_hub()
    from huggingface_hub import constants, errors, snapshot_download

    cache = hub_cache_dir()
    offline = downloads_off() or constants.HF_HUB_OFFLINE  # the latter: as set when huggingface_hub loaded
    at = f"{repo_id}@{revision}" if revision else repo_id
    nothing_here = f"no folder {asked!r}, and " if asked else ""
    download = f"hf download {repo_id}" + (f" --revision {revision}" if revision else "")
    try:
        folder = snapshot_download(
            repo_id,
            revision=revision,
            cache_dir=cache,
            local_files_only=offline,
            allow_patterns=ALLOW_PATTERNS,
            ignore_patterns=IGNORE_PATTERNS,
        )
    except errors.RevisionNotFoundError:
        raise FileNotFoundError(
            f"{nothing_here}the Hugging Face Hub model {repo_id!r} has no revision {revision!r}"
        ) from None
    except errors.RepositoryNotFoundError:  # GatedRepoError too
        raise FileNotFoundError(
            f"{nothing_here}the Hugging Face Hub has no model {repo_id!r} this account can read (private or "
            "gated models need `hf auth login`)"
        ) from None
    except errors.LocalEntryNotFoundError as error:
        if isinstance(error, getattr(errors, "IncompleteSnapshotError", ())):  # huggingface_hub >= 1.x
            raise FileNotFoundError(f"{at}: {error}") from None
        why = (
            "downloads are off (HF_HUB_OFFLINE=1)"
            if offline
            else f"the Hub could not be reached ({_cause(error)})"
        )
        raise FileNotFoundError(
            f"{nothing_here}{at!r} is not in the Hugging Face cache ({cache}) and {why}; run once with "
            f"network or `{download}` (`huggingface-cli download` before huggingface_hub 1.0)"
        ) from None
    except errors.HFValidationError as error:
        raise FileNotFoundError(
            f"{asked or at!r}: not a folder, nor a Hugging Face Hub id ({error})"
        ) from None
    return Path(folder)


def _cause(error: BaseException) -> str:
    cause = error.__cause__ or error
    return f"{type(cause).__name__}: {cause}".splitlines()[0]


def _require_hub() -> None:
    """Raise a `HubDependencyError` saying how to install huggingface_hub when it is missing."""
    try:
        import huggingface_hub  # noqa: F401
    except ImportError:
        raise HubDependencyError(
            f"reading a Hugging Face Hub id needs the huggingface_hub package, which is not installed: "
            f"{INSTALL_HINT}"
        ) from None
