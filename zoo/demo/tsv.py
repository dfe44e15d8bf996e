"""Pairs as ``source<TAB>target`` text files, the format `zoo train` reads (`zoo.training.tasks.seq2seq`)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path


def write_tsv(pairs: Iterable[tuple[str, str]], path: str | Path) -> None:
    """Write ``source<TAB>target`` lines, UTF-8, ``\\n``-terminated."""
    lines = []
    for src, tgt in pairs:
        if any(c in text for text in (src, tgt) for c in "\t\n\r"):
            raise ValueError(f"pair contains a tab or newline and cannot be written as TSV: {(src, tgt)!r}")
        lines.append(f"{src}\t{tgt}\n")
    Path(path).write_text("".join(lines), encoding="utf-8")


def read_tsv(path: str | Path) -> list[tuple[str, str]]:
    """Read pairs written by :func:`write_tsv`."""
    pairs = []
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), start=1):
        if not line:
            continue
        fields = line.split("\t")
        if len(fields) != 2:
            raise ValueError(f"{path}:{number}: expected 'source<TAB>target', got {len(fields)} field(s)")
        pairs.append((fields[0], fields[1]))
    return pairs
