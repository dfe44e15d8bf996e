"""Training data: read parallel or plain text, validate every line up front, encode it to token ids.

    seq2seq     TSV (``source<TAB>target``, one pair a line) or two line-aligned files
    causal_lm   plain text, one example a line
    masked_lm   plain text, one example a line

Everything is read and checked before the first step, so a bad line stops the run at once with its
file and line number instead of crashing it mid-epoch. Framing: a seq2seq source and target each end
with eos (the decoder input is the target shifted right behind the start token, see `batching`); a
language-modelling line is ``bos text eos`` (``[CLS] text [SEP]`` with a BERT tokenizer).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from zoo.io.tokenizer import Tokenizer
from zoo.io.tokenizer.lengths import char_budget, cut_before_encoding
from zoo.training.config import DataFiles, ParallelFiles, Task

log = logging.getLogger(__name__)

TooLong = Literal["truncate", "skip", "error"]


class DataError(ValueError):
    """Training data that cannot be used; the message names the file and line."""


@dataclass(frozen=True)
class TextExamples:
    """Raw examples before tokenization; ``sources`` is None for language modelling."""

    targets: list[str]
    sources: list[str] | None
    origins: list[str]  # "file:line" of each example, for messages


@dataclass(frozen=True)
class EncodedExamples:
    """Token ids, framed with the special tokens, every sequence within the length limit."""

    targets: list[list[int]]
    sources: list[list[int]] | None
    origins: list[str]

    def __len__(self) -> int:
        return len(self.targets)

    def num_tokens(self) -> int:
        """Real tokens, both sides."""
        return sum(map(len, self.targets)) + sum(map(len, self.sources or []))


# --- reading --------------------------------------------------------------------------------------------


def read_examples(files: DataFiles, *, task: Task) -> TextExamples:
    """Read and check one split: TSV or aligned files for seq2seq, plain text otherwise."""
    if isinstance(files, ParallelFiles):
        return _read_aligned(files.source, files.target)
    if task == "seq2seq":
        return _read_tsv(files)
    lines = [(number, line) for number, line in _read_lines(files) if line.strip()]
    if not lines:
        raise DataError(f"{files}: no examples (the file is empty or blank)")
    return TextExamples(
        targets=[line for _, line in lines], sources=None, origins=[f"{files}:{n}" for n, _ in lines]
    )


def _read_lines(path: Path) -> list[tuple[int, str]]:
    if not path.is_file():
        raise FileNotFoundError(f"{path}: data file not found")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise DataError(f"{path}: not UTF-8 text ({error.reason} at byte {error.start})") from None
    return [(number, line.rstrip("\r")) for number, line in enumerate(text.split("\n"), start=1)]


def _read_tsv(path: Path) -> TextExamples:
    sources, targets, origins = [], [], []
    for number, line in _read_lines(path):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) != 2:
            found = "no tab" if len(fields) == 1 else f"{len(fields) - 1} tabs"
            raise DataError(f"{path}:{number}: expected 'source<TAB>target', found {found}: {line[:60]!r}")
        for side, text in zip(("source", "target"), fields):
            if not text.strip():
                raise DataError(f"{path}:{number}: empty {side}")
        sources.append(fields[0])
        targets.append(fields[1])
        origins.append(f"{path}:{number}")
    if not targets:
        raise DataError(f"{path}: no examples (the file is empty or blank)")
    return TextExamples(targets=targets, sources=sources, origins=origins)


def _read_aligned(source_path: Path, target_path: Path) -> TextExamples:
    source_lines, target_lines = _read_lines(source_path), _read_lines(target_path)
    # A final newline makes one empty trailing "line"; it is not a pair.
    for lines in (source_lines, target_lines):
        if lines and not lines[-1][1]:
            lines.pop()
    if len(source_lines) != len(target_lines):
        raise DataError(
            f"{source_path} has {len(source_lines)} lines but {target_path} has {len(target_lines)}; "
            "aligned files need one target line per source line"
        )
    if not source_lines:
        raise DataError(f"{source_path}: no examples (the file is empty)")
    for (number, source), (_, target) in zip(source_lines, target_lines):
        for path, text in ((source_path, source), (target_path, target)):
            if not text.strip():
                raise DataError(f"{path}:{number}: empty line (aligned files need text on every line)")
    return TextExamples(
        targets=[t for _, t in target_lines],
        sources=[s for _, s in source_lines],
        origins=[f"{source_path}:{n}" for n, _ in source_lines],
    )


# --- encoding -------------------------------------------------------------------------------------------


def encode_examples(
    text: TextExamples,
    *,
    task: Task,
    target_tokenizer: Tokenizer,
    source_tokenizer: Tokenizer | None = None,
    max_length: int,
    too_long: TooLong = "truncate",
) -> EncodedExamples:
    """Tokenize and frame every example; sequences over ``max_length`` tokens are cut, dropped or refused.

    A text longer than ``max_length`` tokens can cover is cut to that many characters before it is encoded
    (`zoo.io.tokenizer.lengths`): a 20 MB line costs what a line at the limit does.
    """
    target_budget = char_budget(target_tokenizer, max_length)
    target_texts, over = cut_before_encoding(text.targets, target_budget)
    if task == "seq2seq":
        if text.sources is None:
            raise DataError("seq2seq needs parallel data (a TSV file or {source, target} files)")
        source_tokenizer = source_tokenizer or target_tokenizer
        source_texts, source_over = cut_before_encoding(
            text.sources, char_budget(source_tokenizer, max_length)
        )
        over = sorted({*over, *source_over})
        sources = source_tokenizer.encode_batch(source_texts, add_eos=True)
        targets = target_tokenizer.encode_batch(target_texts, add_eos=True)
    else:
        # A foreign tokenizer may lack bos (GPT-2 has one token for both): frame with what exists.
        has_bos, has_eos = target_tokenizer.bos_id is not None, target_tokenizer.eos_id is not None
        targets = target_tokenizer.encode_batch(target_texts, add_bos=has_bos, add_eos=has_eos)
        sources = None
    too_many_chars = set(over)  # certainly too long, whatever their cut text encodes to
    keep, cut = [], []
    for i in range(len(targets)):
        sides = [targets] if sources is None else [sources, targets]
        if i not in too_many_chars and all(len(side[i]) <= max_length for side in sides):
            keep.append(i)
            continue
        if too_long == "error":
            if i in too_many_chars:
                chars = max(len(text.targets[i]), len(text.sources[i]) if text.sources else 0)
                found = f"{chars:,} characters, more than the limit of {max_length} tokens can cover"
            else:
                found = f"{max(len(side[i]) for side in sides)} tokens, more than the limit of {max_length}"
            raise DataError(
                f"{text.origins[i]}: {found} "
                "(data.max_length or the model's max_positions); set data.too_long to truncate or skip"
            )
        cut.append(i)
        if too_long == "truncate":
            for side in sides:
                if len(side[i]) > max_length:
                    side[i] = _truncate(side[i], max_length)
            keep.append(i)
    report_length_cuts(
        cut, keep, total=len(targets), max_length=max_length, too_long=too_long, origins=text.origins
    )
    return EncodedExamples(
        targets=[targets[i] for i in keep],
        sources=[sources[i] for i in keep] if sources is not None else None,
        origins=[text.origins[i] for i in keep],
    )


def _truncate(ids: list[int], limit: int) -> list[int]:
    # Keep the closing special token (eos / [SEP]): the model still learns where sequences end.
    return [*ids[: limit - 1], ids[-1]]


def lengths(data: EncodedExamples) -> tuple[list[int], list[int]]:
    """(source lengths, target lengths); sources are all 0 for language modelling."""
    targets = [len(ids) for ids in data.targets]
    sources = [len(ids) for ids in data.sources] if data.sources is not None else [0] * len(targets)
    return sources, targets


def corpus_lines(
    texts: TextExamples | Sequence[TextExamples], *, side: Literal["source", "target", "both"]
) -> Iterator[str]:
    """Lines to train a tokenizer on: one side or both sides of the examples."""
    for text in [texts] if isinstance(texts, TextExamples) else texts:
        if side in ("source", "both") and text.sources is not None:
            yield from text.sources
        if side in ("target", "both"):
            yield from text.targets


def report_length_cuts(
    cut: Sequence[int],
    keep: Sequence[int],
    *,
    total: int,
    max_length: int,
    too_long: str,
    origins: Sequence[str],
) -> None:
    """Log how many of ``total`` examples were truncated or skipped (indices ``cut``); refuse a file that
    keeps none (``keep`` empty), naming it."""
    if cut:
        action = "truncated" if too_long == "truncate" else "skipped"
        log.warning(
            "%d of %d examples are longer than %d tokens and were %s (first: %s)",
            len(cut), total, max_length, action, origins[cut[0]],
        )  # fmt: skip
    if not keep:
        raise DataError(f"{origins[0].rsplit(':', 1)[0]}: every example is longer than {max_length} tokens")
