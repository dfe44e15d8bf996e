"""Labelled data for classification: read and checked, every line, before training starts.

    sequence_classification   ``text<TAB>label`` lines, or JSON lines ``{"text": "...", "label": "pos"}``
    token_classification      JSON lines ``{"tokens": ["Ada", "sings"], "tags": ["B-PER", "O"]}``, or
                              CoNLL-style ``token<TAB>tag`` lines (or space-separated columns, tag last;
                              ``-DOCSTART-`` lines skipped), a blank line between sentences

A file is JSON lines when its name ends in ``.jsonl`` or ``.json``. A label is a non-empty string or an
integer (kept as its decimal string). A bad line is a `DataError` naming the file and line.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zoo.training.config import Task
from zoo.training.data import DataError, TextExamples


@dataclass(frozen=True)
class LabelledText(TextExamples):
    """Texts (``targets``; the words joined by spaces for tokens) and their labels: one name per text, or
    one per word (``words``) for token classification."""

    labels: list[Any]
    words: list[list[str]] | None = None


# --- reading ----------------------------------------------------------------------------------------------


def read_labelled(path: Path, *, task: Task) -> LabelledText:
    """Read and check one split for ``task``; a bad line is a `DataError` naming the file and line."""
    lines = _read_lines(path)
    filled = [(number, line) for number, line in lines if line.strip()]  # blank lines are skipped
    json_lines = path.suffix in (".jsonl", ".json")
    words: list[list[str]] | None = None
    labels: list[Any]
    if task == "sequence_classification":
        read = _json_sequence if json_lines else _tsv_sequence
        rows = [read(path, number, line) for number, line in filled]
        texts, labels, origins = [t for t, _, _ in rows], [lab for _, lab, _ in rows], [o for _, _, o in rows]
    else:
        sentences = [_json_tokens(path, n, line) for n, line in filled] if json_lines else _conll(path, lines)
        words = [w for w, _, _ in sentences]
        labels, origins = [tags for _, tags, _ in sentences], [o for _, _, o in sentences]
        texts = [" ".join(w) for w in words]
    if not texts:
        raise DataError(f"{path}: no examples (the file is empty or blank)")
    return LabelledText(targets=texts, sources=None, origins=origins, labels=labels, words=words)


def _read_lines(path: Path) -> list[tuple[int, str]]:
    if not path.is_file():
        raise FileNotFoundError(f"{path}: data file not found")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise DataError(f"{path}: not UTF-8 text ({error.reason} at byte {error.start})") from None
    return [(number, line.rstrip("\r")) for number, line in enumerate(text.split("\n"), start=1)]


def _label(value: Any, where: str, field: str) -> str:
    if isinstance(value, bool) or not isinstance(value, str | int) or (isinstance(value, str) and not value):
        raise DataError(f"{where}: {field} must be a non-empty string or an integer, got {value!r:.60}")
    return str(value)


def _tsv_sequence(path: Path, number: int, line: str) -> tuple[str, str, str]:
    fields = line.split("\t")
    where = f"{path}:{number}"
    if len(fields) != 2 or not fields[0].strip():
        found = "no tab" if len(fields) == 1 else f"{len(fields) - 1} tabs" if len(fields) > 2 else "no text"
        raise DataError(f"{where}: expected 'text<TAB>label', found {found}: {line[:60]!r}")
    return fields[0], _label(fields[1].strip(), where, "the label"), where


def _json_object(path: Path, number: int, line: str) -> dict[str, Any]:
    try:
        value = json.loads(line)
    except json.JSONDecodeError as error:
        raise DataError(f"{path}:{number}: not JSON ({error.msg} at column {error.colno})") from None
    if not isinstance(value, dict):
        raise DataError(f"{path}:{number}: expected a JSON object, got {type(value).__name__}")
    return value


def _json_sequence(path: Path, number: int, line: str) -> tuple[str, str, str]:
    where = f"{path}:{number}"
    row = _json_object(path, number, line)
    text = row.get("text")
    if not isinstance(text, str) or not text.strip():
        raise DataError(f'{where}: expected {{"text": "...", "label": ...}} with a non-empty text')
    return text, _label(row.get("label"), where, '"label"'), where


def _json_tokens(path: Path, number: int, line: str) -> tuple[list[str], list[str], str]:
    where = f"{path}:{number}"
    row = _json_object(path, number, line)
    tokens, tags = row.get("tokens"), row.get("tags")
    if not isinstance(tokens, list) or not tokens or not all(isinstance(t, str) and t for t in tokens):
        raise DataError(f'{where}: expected {{"tokens": [...], "tags": [...]}} with non-empty string tokens')
    if not isinstance(tags, list) or len(tags) != len(tokens):
        count = len(tags) if isinstance(tags, list) else type(tags).__name__
        raise DataError(f"{where}: {len(tokens)} tokens but {count} tags; one tag per token")
    return tokens, [_label(tag, where, "a tag") for tag in tags], where


def _conll(path: Path, lines: list[tuple[int, str]]) -> list[tuple[list[str], list[str], str]]:
    sentences: list[tuple[list[str], list[str], str]] = []
    words: list[str] = []
    tags: list[str] = []
    start = 0
    for number, line in [*lines, (len(lines) + 1, "")]:  # a final blank line closes the last sentence
        if not line.strip() or line.startswith("-DOCSTART-"):
            if words:
                sentences.append((words, tags, f"{path}:{start}"))
            words, tags = [], []
            continue
        fields = line.split("\t") if "\t" in line else line.split()
        if len(fields) < 2 or not fields[0].strip():
            raise DataError(f"{path}:{number}: expected 'token<TAB>tag', found {line[:60]!r}")
        start = start if words else number
        words.append(fields[0].strip())
        tags.append(_label(fields[-1].strip(), f"{path}:{number}", "the tag"))
    return sentences
