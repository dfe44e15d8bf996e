"""The arguments and the output of :meth:`Tokenizer.__call__`, transformers' batch interface.

Everything here is independent of the vocabulary: the checks of the call's arguments (each error names its
argument, and all run before anything is encoded), padding rows in place, and the ``"pt"`` tensors.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, TypeGuard

if TYPE_CHECKING:
    import torch

Padding = bool | Literal["longest", "max_length", "do_not_pad"]
Truncation = bool | Literal["longest_first", "only_first", "do_not_truncate"] | None
PadTo = Literal["longest", "max_length"] | None


def is_int(value: object) -> TypeGuard[int]:
    """Whether ``value`` is an int; ``True`` and ``False`` are not."""
    return isinstance(value, int) and not isinstance(value, bool)


def check_length(name: str, value: object) -> None:
    """Raise ``ValueError`` unless ``value`` (a length limit called ``name``) is an int >= 1 or None."""
    if value is not None and (not is_int(value) or value < 1):
        raise ValueError(f"{name} must be an int >= 1 or None, got {value!r}")


def check_call_args(
    text: object,
    *,
    padding: object,
    truncation: object,
    max_length: object,
    padding_side: object,
    return_tensors: object,
    add_special_tokens: object,
) -> tuple[list[str], bool, PadTo, bool]:
    """The arguments of ``__call__`` that need no vocabulary, checked in order of the signature.

    Returns the texts as a list, whether ``text`` was a single string, the padding asked for (None for
    none) and whether to truncate.
    """
    texts, single = _texts_arg(text)
    pad_to = _padding_arg(padding)
    truncate = _truncation_arg(truncation, max_length=max_length, padding=pad_to)
    check_length("max_length", max_length)
    if padding_side not in ("right", "left"):
        raise ValueError(f"padding_side must be 'right' or 'left', got {padding_side!r}")
    if return_tensors not in (None, "pt"):
        raise ValueError(
            f"return_tensors must be None (lists) or 'pt' (torch tensors), got {return_tensors!r}"
        )
    if not isinstance(add_special_tokens, bool):
        raise ValueError(f"add_special_tokens must be True or False, got {add_special_tokens!r}")
    return texts, single, pad_to, truncate


def _texts_arg(text: object) -> tuple[list[str], bool]:
    """``text`` as a list of strings, and whether it was a single string."""
    if isinstance(text, str):
        return [text], True
    if isinstance(text, (list, tuple)):
        for i, item in enumerate(text):
            if not isinstance(item, str):
                raise ValueError(f"text must be a str or a list of str; text[{i}] is {type(item).__name__}")
        return list(text), False
    raise ValueError(f"text must be a str or a list of str, got {type(text).__name__}")


def _padding_arg(padding: object) -> PadTo:
    if padding is True or padding == "longest":
        return "longest"
    if padding == "max_length":
        return "max_length"
    if padding is False or padding == "do_not_pad":
        return None
    raise ValueError(f"padding must be False, True, 'longest', 'max_length' or 'do_not_pad', got {padding!r}")


def _truncation_arg(truncation: object, *, max_length: object, padding: PadTo) -> bool:
    if truncation is None:  # transformers' default: a max_length without padding means "truncate"
        return max_length is not None and padding is None
    if truncation is True or truncation in ("longest_first", "only_first"):
        return True
    if truncation is False or truncation == "do_not_truncate":
        return False
    raise ValueError(
        f"truncation must be None, True, False, 'longest_first', 'only_first' or 'do_not_truncate', "
        f"got {truncation!r}"
    )


def pad_rows(
    rows: list[list[int]],
    masks: list[list[int]],
    *,
    width: int,
    pad_id: int,
    side: Literal["right", "left"],
) -> None:
    """Pad each row with ``pad_id`` (and its mask with 0) to ``width``, in place, on ``side``."""
    for row, mask in zip(rows, masks):
        fill = max(width - len(row), 0)  # rows longer than max_length stay as they are
        at = 0 if side == "left" else len(row)
        row[at:at] = [pad_id] * fill
        mask[at:at] = [0] * fill


def as_tensors(rows: list[list[int]], masks: list[list[int]]) -> dict[str, torch.Tensor]:
    """(B, T) int64 tensors of equal-length rows."""
    import torch  # here, so that tokenizing without tensors does not import torch

    lengths = sorted({len(row) for row in rows})
    if len(lengths) > 1:
        raise ValueError(
            f"return_tensors='pt' needs rows of one length, but they have {lengths[0]} to {lengths[-1]} "
            "tokens; pass padding=True (or padding='max_length' with truncation=True)"
        )
    width = lengths[0] if lengths else 0
    ids = torch.tensor(rows, dtype=torch.int64).view(len(rows), width)  # (B, T), also for B == 0
    mask = torch.tensor(masks, dtype=torch.int64).view(len(rows), width)  # (B, T)
    return {"input_ids": ids, "attention_mask": mask}
