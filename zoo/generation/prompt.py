"""An encoder-decoder's decoder prompt (``decoder_input_ids``): checked, and begun with the start token.

Shapes: B batch, P prompt length as given, P' = P or P + 1 once the start token is in front.

As in transformers' ``generate`` (``_prepare_decoder_input_ids_for_generation``), the decoder continues
``decoder_input_ids``, which must begin with the decoder start token; when no row begins with it, it is put in
front of every row. zoo asks the same of each row's first *real* token, so ragged prompts work (left-padded,
with ``decoder_attention_mask``), and refuses a batch where some rows begin with it and some do not
(transformers would leave such a batch unchanged, the rows without the token then decoding from a state the
model never saw in training). The start token goes right before each row's first real token, so a padded
row is still left-padded and, its positions counting real tokens only, decodes as it would alone.
"""

from __future__ import annotations

import torch

from zoo.generation.protocol import GenerativeModel

Prompt = tuple[torch.Tensor, torch.Tensor | None]  # ids (B, P'), mask (B, P') or None when nothing is padded


def decoder_prompt(
    model: GenerativeModel,
    decoder_input_ids: torch.Tensor | None,
    decoder_attention_mask: torch.Tensor | None,
    *,
    batch_size: int,
    max_new_tokens: int,
) -> Prompt | None:
    """The checked decoder prompt (ids (B, P'), mask (B, P') or None), or None when none was given.

    Raises ValueError, before any compute, when the prompt cannot be decoded from: a decoder-only model (its
    prompt is ``input_ids``), a shape or dtype that is not (B, P) integer ids, ids outside the vocabulary, a
    mask that is not left padding, rows that disagree about the start token, or too long a result. A row
    with no real token at all (its mask all zeros) starts from the start token alone.
    """
    if decoder_input_ids is None:
        if decoder_attention_mask is not None:
            raise ValueError("generate: decoder_attention_mask was given without decoder_input_ids")
        return None
    start = model.decoder_start_token_id
    if model.continues_input or start is None:
        raise ValueError(
            "generate: decoder_input_ids is a prompt for an encoder-decoder's decoder; a decoder-only model "
            "continues input_ids itself"
        )
    ids = _check_ids(decoder_input_ids, batch_size=batch_size, vocab_size=model.spec.vocab_size)
    B, P = ids.shape
    mask = _check_mask(decoder_attention_mask, shape=(B, P))
    pads = (
        (~mask).sum(dim=1) if mask is not None else torch.zeros(B, dtype=torch.long, device=ids.device)
    )  # (B,)
    first = ids.gather(1, pads.clamp(max=P - 1)[:, None]).squeeze(1)  # (B,) each row's first real token
    starts = (first == start) & (pads < P)  # an empty row does not start with it
    prepend = not bool(starts.any())
    if not prepend and not bool(starts.all()):
        raise ValueError(
            f"generate: some rows of decoder_input_ids begin with the decoder start token ({start}) and some "
            "do not; begin every row with it, or none (it is then put in front of each)"
        )
    length = P + prepend
    if length + max_new_tokens > model.spec.max_positions:
        raise ValueError(
            f"generate: the decoder prompt of {length} tokens (start token included) + max_new_tokens "
            f"({max_new_tokens}) = {length + max_new_tokens} exceeds the model's max_positions "
            f"({model.spec.max_positions})"
        )
    if prepend:
        ids, mask = _with_start(ids, mask, pads, start)
    if mask is not None and bool(mask.all()):
        mask = None  # nothing padded: the decoder's unmasked fast path
    return ids.long(), mask


def _with_start(ids: torch.Tensor, mask: torch.Tensor | None, pads: torch.Tensor, start: int) -> Prompt:
    """Put ``start`` right before each row's first real token: (B, P) -> (B, P + 1)."""
    B = ids.shape[0]
    column = torch.full((B, 1), start, dtype=ids.dtype, device=ids.device)
    if mask is None:
        return torch.cat([column, ids], dim=1), None
    ids = torch.cat([column, ids], dim=1)  # (B, P + 1): a row with k pads gets its start at column k
    mask = torch.cat([torch.zeros_like(mask[:, :1]), mask], dim=1)
    ids.scatter_(1, pads[:, None], start)
    mask.scatter_(1, pads[:, None], True)
    return ids, mask


def _check_ids(ids: object, *, batch_size: int, vocab_size: int) -> torch.Tensor:
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2:
        shape = tuple(ids.shape) if isinstance(ids, torch.Tensor) else type(ids).__name__
        raise ValueError(f"generate: decoder_input_ids must be a (batch, length) tensor, got {shape}")
    if ids.dtype.is_floating_point or ids.dtype == torch.bool:
        raise ValueError(f"generate: decoder_input_ids must hold integer token ids, got dtype {ids.dtype}")
    if ids.shape[0] != batch_size or ids.shape[1] == 0:
        raise ValueError(
            f"generate: decoder_input_ids has shape {tuple(ids.shape)}; expected ({batch_size}, length >= 1): "
            "one decoder prompt per row of input_ids"
        )
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or high >= vocab_size:
        bad = low if low < 0 else high
        raise ValueError(
            f"generate: decoder_input_ids contains token id {bad}, outside the vocabulary [0, {vocab_size})"
        )
    return ids


def _check_mask(mask: object, *, shape: tuple[int, int]) -> torch.Tensor | None:
    if mask is None:
        return None
    if not isinstance(mask, torch.Tensor) or tuple(mask.shape) != shape:
        got = tuple(mask.shape) if isinstance(mask, torch.Tensor) else type(mask).__name__
        raise ValueError(
            f"generate: decoder_attention_mask has shape {got}, expected {shape} like decoder_input_ids"
        )
    if mask.dtype.is_floating_point:
        raise ValueError(
            "generate: decoder_attention_mask must hold 1 (token) / 0 (padding) as int or bool, "
            f"got dtype {mask.dtype}"
        )
    valid = mask.bool()
    if not bool((valid[:, 1:] >= valid[:, :-1]).all()):  # no token followed by padding
        raise ValueError(
            "generate: decoder prompts must be left-padded (decoder_attention_mask has a 0 after a 1 in some "
            "row); pad on the left so every row's real tokens come last"
        )
    return valid
