"""``zoo translate DIR -``: translate stdin, a sentence a line, one translation a line on stdout.

    zoo translate runs/demo - < sentences.txt > translations.txt
    head -n 1000000 corpus.en | zoo translate runs/demo - --beams 4 | head

Lines are read as they come and translated `LINES_PER_BATCH` at a time (as a padded batch, as
`zoo.training.evaluate.translate` does): memory stays bounded and the first translations are printed
while the rest of stdin is still being read; typed at a terminal, each line is translated when entered.
An empty line is an error naming its line number, as is a line that is not UTF-8 or longer than the
model's positions; the lines before it are translated and printed first. With ``--num-return-sequences N`` each line gets N numbered lines (``[1]`` best first); a
``--decoder-prompt`` begins every translation.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterable, Iterator
from typing import Any, BinaryIO

from zoo.cli.sanitize import clean

LINES_PER_BATCH = 32


def stdin_lines(stream: BinaryIO, *, what: str = "stdin") -> Iterator[tuple[int, str]]:
    """``(line number, text)`` for each line of ``stream``, read one line at a time. A line that is empty
    (or only spaces) or not UTF-8 is a ValueError naming its number; an empty stream is one too."""
    number = 0
    for number, raw in enumerate(stream, start=1):
        try:
            text = raw.decode("utf-8").rstrip("\r\n")
        except UnicodeDecodeError as error:
            raise ValueError(
                f"{what} line {number} is not UTF-8 (byte 0x{raw[error.start]:02x} at byte {error.start})"
            ) from None
        if not text.strip():
            raise ValueError(f"{what} line {number} is empty; give one sentence a line")
        yield number, text
    if number == 0:
        raise ValueError(f"{what} is empty; give one sentence a line")


def batches(lines: Iterable[tuple[int, str]], size: int) -> Iterator[list[tuple[int, str]]]:
    """``lines`` in lists of ``size`` (the last one shorter), each taken only when the previous one is done.
    A line that is an error (`stdin_lines`) raises once the lines before it have been handed on."""
    batch: list[tuple[int, str]] = []
    try:
        for line in lines:
            batch.append(line)
            if len(batch) == size:
                yield batch
                batch = []
    except ValueError:
        if batch:
            yield batch
        raise
    if batch:
        yield batch


def translate_lines(
    model: Any,
    tokenizer: Any,
    args: argparse.Namespace,
    *,
    decoder_prompt: list[int] | None,
    stream: BinaryIO | None = None,
) -> int:
    """Translate every line of ``stream`` (stdin) and print one translation a line (N numbered lines with
    ``--num-return-sequences N``); a summary goes to stderr."""
    from zoo.cli import console, err_console

    stream = sys.stdin.buffer if stream is None else stream
    sentences = 0
    start = time.perf_counter()
    # Typed at a terminal, each line is translated as soon as it is entered; piped, a batch at a time.
    size = 1 if _is_terminal(stream) else LINES_PER_BATCH
    for batch in batches(stdin_lines(stream), size):
        for rows in _translate(model, tokenizer, batch, args, decoder_prompt=decoder_prompt):
            for number, (text, score) in enumerate(rows, start=1):
                if len(rows) > 1:  # "[2] (-1.2345) text", as for one sentence
                    label = f"[{number}]" + (f" ({score:.4f})" if score is not None else "")
                    console.out(label, end=" ", highlight=False, style="dim")
                console.out(clean((args.decoder_prompt or "") + text), highlight=False)
        sentences += len(batch)
        sys.stdout.flush()  # a pipe sees each batch as soon as it is done
    seconds = time.perf_counter() - start
    err_console.print(
        f"[dim]{sentences} sentences in {seconds:.2f} s ({sentences / max(seconds, 1e-9):.1f} sentences/s)[/]",
        highlight=False,
    )
    return 0


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty (a test's iterator), or a closed stream
        return False


def _translate(
    model: Any,
    tokenizer: Any,
    batch: list[tuple[int, str]],
    args: argparse.Namespace,
    *,
    decoder_prompt: list[int] | None,
) -> list[list[tuple[str, float | None]]]:
    """The translations of one batch of lines: for each line, its ``num_return_sequences`` texts (with
    beam scores when searching with beams)."""
    import torch

    from zoo.cli.search import nan_logits, new_tokens, search_settings
    from zoo.generation import TextStream, generate

    spec = model.spec
    device = next(model.parameters()).device
    eos = tokenizer.eos_id
    encoded = []
    for number, text in batch:
        ids = tokenizer.encode(text, add_eos=eos is not None)
        if len(ids) > spec.max_positions:
            raise ValueError(
                f"stdin line {number} is {len(ids)} tokens long; the model takes at most {spec.max_positions}"
            )
        encoded.append(ids)
    width = max(map(len, encoded))
    input_ids = torch.full((len(encoded), width), spec.pad_token_id or 0, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)  # (B, S) 1 = token, 0 = padding on the right
    for row, ids in enumerate(encoded):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        attention_mask[row, : len(ids)] = 1
    settings = search_settings(args, tokenizer)
    context = decoder_prompt or []
    used = 1 + len(context)  # the start token and the decoder prompt
    if settings["max_new_tokens"] is None:  # as for one sentence: room for a longer target, within limits
        settings["max_new_tokens"] = max(1, min(spec.max_positions - used, 2 * width + 10))
    if decoder_prompt is not None:
        settings["decoder_input_ids"] = torch.tensor([decoder_prompt] * len(encoded), device=device)
    skip = len(context) + (0 if context[:1] == [spec.start_token_id] else 1)
    with nan_logits(None):
        out = generate(
            model,
            input_ids.to(device),
            attention_mask=attention_mask.to(device),
            return_scores=True,
            **settings,
        )
    rows = new_tokens(out.sequences, skip, spec.eos_token_id)
    scores = out.scores.tolist() if out.scores is not None else [None] * len(rows)
    texts = []
    for ids in rows:
        decoded = TextStream(tokenizer, prompt_ids=context)  # the text of the new tokens, spaces kept
        texts.append(decoded.push(ids) + decoded.flush())
    per_line = len(rows) // len(encoded)  # num_return_sequences rows per line, together
    return [
        list(zip(texts[i : i + per_line], scores[i : i + per_line])) for i in range(0, len(rows), per_line)
    ]
