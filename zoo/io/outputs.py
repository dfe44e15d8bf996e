"""Where a writer may write: an output folder (or file) holding something it must not write over is refused.

`zoo.to_hf`, `zoo.lora.to_peft`, `zoo.export.save_program` and `zoo.export.export_onnx` check their output
here, and so do ``zoo convert``, ``zoo quantize`` and ``zoo export`` (before they load anything):

    missing, or an empty folder                       written
    an earlier output of the same kind: a Hugging      written over, as a rerun expects: these are made
      Face export, PEFT adapters, a .pt2 or .onnx      from something else, and made again the same way
    files zoo does not know (a model card, notes)      left alone, never touched: they do not count
    a zoo checkpoint (spec.json, its weights)          refused: it may hold the only copy of trained
                                                       weights, so even the commands that write one
                                                       (convert --from-hf / --from-zoo, quantize) replace
                                                       it only when told to
    a model of another kind, or any folder (a          refused
      training run's checkpoints/)
    a file that is not of the kind written (weights    refused
      named model.onnx)

A refusal is one line naming the path, what it holds and the option that writes anyway (``overwrite=True``,
``--overwrite``). A folder's kinds go by file names (`Output.names`: a zoo checkpoint's ``spec.json`` is no
Hugging Face file, so ``to_hf`` refuses a zoo model); a file's by its content. With ``overwrite`` the folder
is made to hold one model: the other kinds' model files (``spec.json`` before a Hugging Face export, say:
`clear_other_models`) are removed and the writer replaces its own; anything else — a run's records and
checkpoints, files zoo does not know — stays where it is. A temporary file an interrupted write left
(``.<name>.<random>.tmp``) is the writer's own.

`zoo.save` itself checks nothing: it is the low-level writer that replaces the checkpoint in a folder and
leaves the other files (a training run saves its model beside its records that way).
"""

from __future__ import annotations

import os
import re
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from zoo.io.names import (
    CONFIG_NAME,
    GENERATION_CONFIG_NAME,
    HF_SHARD_PATTERN,
    INDEX_NAME,
    PEFT_CONFIG_NAME,
    PEFT_WEIGHTS_NAME,
    SHARD_PATTERN,
    SPEC_NAME,
    SPECIAL_TOKENS_MAP_NAME,
    TOKENIZER_CONFIG_NAME,
    TOKENIZER_NAME,
    WEIGHTS_NAME,
)

_TEMP = re.compile(r"\..+\.tmp")  # `zoo.io.atomic`'s temporary folders: what an interrupted write left


class OutputExistsError(FileExistsError):
    """An output holds what the writer did not write; the message names it and the option that writes
    anyway. A FileExistsError (an OSError), so the CLI shows its one line."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


@dataclass(frozen=True)
class Output:
    """A kind of output folder: ``what`` it holds, the file names its writer writes, and whether an earlier
    one is written over without being told (``replaces``)."""

    what: str
    names: frozenset[str]
    patterns: tuple[re.Pattern[str], ...] = ()
    marker: str | None = None  # the file that says a folder holds this kind
    replaces: bool = True

    def owns(self, name: str) -> bool:
        return name in self.names or any(p.fullmatch(name) for p in self.patterns)


ZOO_CHECKPOINT = Output(
    "a zoo checkpoint",
    frozenset({WEIGHTS_NAME, INDEX_NAME, SPEC_NAME, TOKENIZER_NAME}),
    (SHARD_PATTERN,),
    marker=SPEC_NAME,
    replaces=False,  # may be the only copy of trained weights
)
HF_CHECKPOINT = Output(
    "a Hugging Face checkpoint",
    frozenset(
        {
            WEIGHTS_NAME,
            INDEX_NAME,
            CONFIG_NAME,
            GENERATION_CONFIG_NAME,
            TOKENIZER_NAME,
            TOKENIZER_CONFIG_NAME,
            SPECIAL_TOKENS_MAP_NAME,
        }
    ),
    (HF_SHARD_PATTERN,),
    marker=CONFIG_NAME,
)
PEFT_ADAPTERS = Output(
    "PEFT adapters", frozenset({PEFT_CONFIG_NAME, PEFT_WEIGHTS_NAME}), marker=PEFT_CONFIG_NAME
)
MODELS = (ZOO_CHECKPOINT, HF_CHECKPOINT, PEFT_ADAPTERS)


def check_output_dir(
    path: str | os.PathLike[str],
    kind: Output,
    *,
    writer: str,
    overwrite: bool,
    option: str = "overwrite=True",
) -> None:
    """Refuse folder ``path`` (an `OutputExistsError`) when it holds what a writer of ``kind`` must not write
    over (`protected`), unless ``overwrite``; then the other kinds' model files are removed
    (`clear_other_models`). ``writer`` names the command or function in the message, ``option`` the way its
    caller writes anyway."""
    folder = Path(path).expanduser()
    if not folder.is_dir():
        return  # missing (created by the writer), or a file: the writer's own error names it
    found = protected(folder, kind)
    if not found:
        return
    if overwrite:
        clear_other_models(folder, kind)
        return
    listed = ", ".join(found[:6]) + (f" and {len(found) - 6} more" if len(found) > 6 else "")
    what = _describe(folder, kind, found)
    ours = all(kind.owns(name) for name in found)  # an earlier zoo checkpoint, not another kind
    verb = "would replace" if ours else "does not write"
    raise OutputExistsError(
        f"{folder} holds {what} ({listed}), which {writer} {verb}: choose another folder, or write there "
        f"anyway ({option}: the model files are replaced, the rest left)"
    )


def protected(folder: Path, kind: Output) -> list[str]:
    """What in ``folder`` a writer of ``kind`` must not write over: another kind's model files (a zoo
    ``spec.json`` before a Hugging Face export), any folder (a training run's ``checkpoints/``: none of these
    writers makes one), and, for a kind that does not replace (`Output.replaces`), its own weights. Other
    files (a model card, notes) are never touched, so they do not count; nor does a lone tokenizer."""
    found = []
    for entry in folder.iterdir():
        name = entry.name
        if _TEMP.fullmatch(name):
            continue
        if kind.owns(name):
            if not kind.replaces and name != TOKENIZER_NAME:
                found.append(name)
        elif entry.is_dir() and not entry.is_symlink():
            found.append(f"{name}/")
        elif any(other.owns(name) for other in MODELS):
            found.append(name)
    return sorted(found)


def _describe(folder: Path, kind: Output, found: list[str]) -> str:
    """What ``folder`` holds, in words: the models zoo recognises there, and folders."""
    parts = [
        o.what
        for o in MODELS
        if (o is not kind or not kind.replaces) and o.marker and (folder / o.marker).exists()
    ]
    folders = sum(name.endswith("/") for name in found)
    if folders:
        parts.append("a folder" if folders == 1 else "folders")
    return " and ".join(parts) or "model files"


def clear_other_models(folder: Path, kind: Output) -> None:
    """Remove the model files of the kinds other than ``kind`` (a zoo ``spec.json`` before a Hugging Face
    export, say), so the folder holds one model; nothing else is touched."""
    for entry in folder.iterdir():
        if kind.owns(entry.name) or not any(other.owns(entry.name) for other in MODELS):
            continue
        if entry.is_file() or entry.is_symlink():  # a link is removed, never what it points to
            entry.unlink(missing_ok=True)


# --- files ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FileOutput:
    """A kind of output file: ``what`` it is, and how to tell one (``recognise(path)``)."""

    what: str
    recognise: Callable[[Path], bool] = field(repr=False)


def _is_torch_program(path: Path) -> bool:
    """A ``torch.export.save`` archive: a zip with an ``archive_format`` entry."""
    try:
        with zipfile.ZipFile(path) as archive:
            return any(name.rsplit("/", 1)[-1] == "archive_format" for name in archive.namelist())
    except (OSError, zipfile.BadZipFile):
        return False


def _is_onnx_model(path: Path) -> bool:
    """An ONNX ModelProto: it opens with ``ir_version`` (field 1, a varint) then ``producer_name`` (field 2,
    a string) or ``opset_import`` (field 8), as every exporter writes them."""
    try:
        with path.open("rb") as f:
            head = f.read(16)
    except OSError:
        return False
    if len(head) < 3 or head[0] != 0x08:
        return False
    i = 1
    while i < len(head) and head[i] & 0x80:  # the varint's continuation bytes
        i += 1
    return i + 1 < len(head) and head[i + 1] in (0x12, 0x42)


def _is_gguf(path: Path) -> bool:
    """A GGUF file: it opens with the magic ``GGUF``."""
    try:
        with path.open("rb") as f:
            return f.read(4) == b"GGUF"
    except OSError:
        return False


TORCH_PROGRAM = FileOutput("a torch.export program", _is_torch_program)
ONNX_MODEL = FileOutput("an ONNX model", _is_onnx_model)
GGUF_MODEL = FileOutput("a GGUF model", _is_gguf)


def check_output_file(
    path: str | os.PathLike[str],
    kind: FileOutput,
    *,
    writer: str,
    overwrite: bool,
    option: str = "overwrite=True",
) -> None:
    """Refuse file ``path`` (an `OutputExistsError`) when it exists and is not ``kind`` (an earlier output of
    the same kind is written over), unless ``overwrite``."""
    file = Path(path).expanduser()
    if overwrite or not file.is_file() or kind.recognise(file):
        return
    raise OutputExistsError(
        f"{file} already exists and is not {kind.what} ({file.stat().st_size:,} bytes), which {writer} "
        f"would replace: choose another file, or replace it ({option})"
    )
