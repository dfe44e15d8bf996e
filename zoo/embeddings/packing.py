"""One batch of texts laid out for the model: padded rows, or several texts packed into each row.

A sorted batch still holds texts of different lengths (its first text is the longest), and a padded row
computes its pads like tokens. Packed, the texts share rows of the batch's longest length — first fit,
longest first — and a document id per token keeps each text's attention inside itself, its positions
restarting at 0 (`zoo.stacks`): every text's token vectors are the ones it gets alone, and the batch runs
fewer rows of the same width, so fewer positions and no more attention per row than padded.

    texts (lengths 9, 5, 4, 3)         padded: 4 rows × 9          packed: 3 rows × 9
    a a a a a a a a a                  a a a a a a a a a           a a a a a a a a a
    b b b b b                          b b b b b · · · ·           b b b b b c c c c
    c c c c                            c c c c · · · · ·           d d d · · · · · ·   (pads: d's document,
    d d d                              d d d · · · · · ·                                masked as keys)

Only where attention depends on relative positions alone (`PACKABLE`): BigBird's block-sparse blocks are laid
out by absolute position in the row, so a packed text would see other blocks than alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# Attention patterns a text sees the same way at any offset in a row, once positions restart there.
PACKABLE = frozenset({"full", "causal", "sliding_window"})


@dataclass(frozen=True)
class Layout:
    """Where each token of a batch goes: text ``text[n]``'s token ``position[n]`` sits at
    ``(row[n], column[n])`` of the (rows, width) model input. N = the batch's real tokens."""

    text: torch.Tensor  # (N,)
    position: torch.Tensor  # (N,)
    row: torch.Tensor  # (N,)
    column: torch.Tensor  # (N,)
    rows: int
    width: int


def padded(lengths: torch.Tensor) -> Layout:
    """One text a row, on the left: (B, longest)."""
    text, position = _tokens(lengths)
    return Layout(text, position, text, position, rows=len(lengths), width=int(lengths.max()))


def packed(lengths: torch.Tensor) -> Layout:
    """Texts (longest first) first-fit into rows as long as the longest: (R <= B, longest)."""
    width = int(lengths.max())
    room: list[int] = []  # free positions left in each row
    row_of, start_of = [], []
    for n in lengths.tolist():  # a loop over texts (a batch's few dozen), never over tokens
        r = next((i for i, free in enumerate(room) if free >= n), len(room))
        if r == len(room):
            room.append(width)
        row_of.append(r)
        start_of.append(width - room[r])
        room[r] -= n
    text, position = _tokens(lengths)
    row = torch.tensor(row_of)[text]
    column = torch.tensor(start_of)[text] + position
    return Layout(text, position, row, column, rows=len(room), width=width)


def model_inputs(
    layout: Layout, ids: torch.Tensor, *, pad_id: int, documents: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(rows, width) ids, mask (1 = a token) and, for packed rows, document ids, from ``ids`` (N,): the
    batch's tokens text by text. A pad gets the document of the text before it in its row, so that no
    query sees only masked keys."""
    shape = (layout.rows, layout.width)
    input_ids = torch.full(shape, pad_id, dtype=torch.long)
    input_ids[layout.row, layout.column] = ids
    mask = torch.zeros(shape, dtype=torch.long)
    mask[layout.row, layout.column] = 1
    if not documents:
        return input_ids, mask, None
    last = torch.zeros(layout.rows, dtype=torch.long).scatter_reduce(0, layout.row, layout.text, "amax")
    document_ids = last.unsqueeze(1).expand(shape).clone()  # (rows, width): pads after the row's last text
    document_ids[layout.row, layout.column] = layout.text
    return input_ids, mask, document_ids


def per_text(layout: Layout, hidden: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """(rows, width, C) model output -> (B, longest, C), each text's vectors on the left (zeros after)."""
    if layout.row is layout.text:  # padded: already one text a row
        return hidden
    out = hidden.new_zeros(len(lengths), layout.width, hidden.shape[-1])  # (B, T, C)
    where = [index.to(hidden.device) for index in (layout.text, layout.position, layout.row, layout.column)]
    out[where[0], where[1]] = hidden[where[2], where[3]]
    return out


def _tokens(lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(N,) the text of each token, text by text, and its position in its text."""
    text = torch.repeat_interleave(torch.arange(len(lengths)), lengths)
    starts = torch.cumsum(lengths, 0) - lengths  # (B,) each text's first token in the flat (N,) order
    return text, torch.arange(len(text)) - starts[text]
