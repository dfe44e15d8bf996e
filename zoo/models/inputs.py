"""What a model's ``forward`` (and ``encode``/``decode``) accepts, checked before any compute.

One `ValueError` names the call, the argument, what was expected and what came: ``DecoderModel.forward:
input_ids contains token id 512, outside the vocabulary [0, 512)``, instead of an index error deep in an
embedding or a mask that silently broadcasts. The rules (Hugging Face's names and conventions):

    input_ids, decoder_input_ids   (B, T) int64 or int32 token ids in [0, vocab); cached + T <= max_positions
    attention_mask & co            (B, cached + T) bool or integer, 1 = token, 0 = padding; or, where a
                                   forward takes one, a (B, T, cached + T) bool mask, True = may attend
    prefix_lengths                 (B,) integer, real tokens of each row's prefix (prefix_lm layers)
    position_ids                   (B, T) or (1, T) int64 or int32 positions in [0, max_positions)
    document_ids                   (B, T) integer: packed rows, one document id per token (no cache)
    token_type_ids                 (B, T) int64 or int32 segment ids in [0, segment_vocab_size)
    labels                         like the ids, or (B,) for a classifier: int64 class ids, or -100 (ignored)
    memory, memory_mask            the encoder output (B, S, d_model) and its (B, S) padding mask
    pixel_values                   (B, channels, H, W) floats, for an image front-end (embedding.kind:
                                   patches): H = W = image_size, or any multiples of patch_size with
                                   interpolate_pos_encoding
    logits_mask                    (B, T) bool, for a model with the token-level head it selects for
    chunked_loss                   its targets (N,) integer class ids, one per position the head scores;
                                   not with labels

Cost. Shapes and dtypes are metadata: always checked, free. Values (id ranges, 0/1 masks) are read only
where reading is free: a real tensor on the CPU. On an accelerator a read is a host sync per forward, which
the training and decoding loops are built to avoid, so values are not read there; an out-of-range id then
still stops at the embedding kernel's own bounds check (a device-side assert), while a mask value other
than 0/1 counts as "non-zero = token". Meta tensors have no values, and under ``torch.compile`` or
FakeTensor tracing a read would be data-dependent control flow: values are skipped there too.

Devices. Every tensor argument must be on the model's device (`check_devices`): a ``device="meta"`` tensor
given to a CPU model would otherwise run on uninitialised memory and return different logits every call.
Integer tensors whose values are read (masks, lengths) may not be uint16/32/64, which torch cannot min/max.
"""

from __future__ import annotations

import torch

from zoo.blocks.masks import values_readable
from zoo.losses import IGNORE_INDEX
from zoo.losses.chunked import ChunkedLoss

INDICES = (torch.int64, torch.int32)  # what nn.Embedding and a table lookup take: ids, segments, positions
CLASS_IDS = (torch.int64,)  # what cross-entropy takes as targets
# Any other integer tensor (masks, lengths, document ids): its values are read with min() and max(), which
# torch has no kernel for on uint16, uint32 and uint64.
INTEGERS = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


def model_device(model: torch.nn.Module) -> torch.device:
    """Where ``model``'s weights are (its first parameter's device; the CPU for a model without any)."""
    for tensor in model.parameters():
        return tensor.device
    return torch.device("cpu")


def check_devices(where: str, device: torch.device, **tensors: object) -> None:
    """Every tensor among ``tensors`` (argument name -> value; None and non-tensors are skipped) must be on
    the model's ``device``. A meta tensor holds no values: a CPU model would read uninitialised memory
    through it; a tensor on another device would fail deep inside torch."""
    for name, tensor in tensors.items():
        if isinstance(tensor, torch.Tensor) and tensor.device != device:
            empty = " (a meta tensor holds no values)" if tensor.is_meta else ""
            raise ValueError(
                f"{where}: {name} is on {tensor.device}{empty} but the model is on {device}; pass it on "
                f"{device} ({name}.to({str(device)!r}))"
            )


def check_tokens(
    ids: object,
    mask: object,
    *,
    where: str,
    vocab_size: int,
    max_positions: int,
    cached: int = 0,
    ids_name: str = "input_ids",
    mask_name: str = "attention_mask",
    user_masks: bool = False,
) -> tuple[int, int]:
    """`check_ids` and `check_mask` for one sequence argument and its padding mask; returns (B, T).

    ``user_masks``: the mask may also be a (B, T, cached + T) bool mask (`check_user_mask`)."""
    B, T = check_ids(
        ids, where=where, name=ids_name, vocab_size=vocab_size, max_positions=max_positions, cached=cached
    )
    if user_masks and isinstance(mask, torch.Tensor) and tuple(mask.shape) != (B, cached + T):
        check_user_mask(mask, where=where, name=mask_name, shape=(B, T, cached + T), like=ids_name)
        return B, T
    check_mask(mask, where=where, name=mask_name, shape=(B, cached + T), like=ids_name, cached=cached > 0)
    return B, T


def check_user_mask(
    mask: torch.Tensor, *, where: str, name: str, shape: tuple[int, int, int], like: str
) -> None:
    """A mask that is not (B, S) padding must be bool (B, T, S): query t may attend to key s where True."""
    if tuple(mask.shape) == shape and mask.dtype == torch.bool:
        return
    B, T, S = shape
    length = "cached + length" if S != T else "length"
    also = f"or a bool (batch, length, keys) = {shape} mask, True = may attend"
    if mask.dim() != 3:
        raise ValueError(
            f"{where}: {name} must have shape (batch, {length}) = {(B, S)}, like {like}; got "
            f"{_shape(mask)} ({also})"
        )
    raise ValueError(
        f"{where}: {name}: expected (batch, {length}) = {(B, S)} with 1 = token, {also}; got {mask.dtype} "
        f"of shape {_shape(mask)}"
    )


def check_prefix_lengths(
    prefix_lengths: object, *, where: str, rows: int, length: int, patterned: bool
) -> None:
    """``prefix_lengths`` must be None or (rows,) integers in [0, length], for a stack with prefix_lm layers."""
    if prefix_lengths is None:
        return
    if not patterned:
        raise ValueError(
            f"{where}: prefix_lengths is for prefix_lm attention, and no layer of this model has that pattern"
        )
    if not isinstance(prefix_lengths, torch.Tensor) or tuple(prefix_lengths.shape) != (rows,):
        raise ValueError(
            f"{where}: prefix_lengths must be a ({rows},) tensor, one prefix length per row; got "
            f"{_shape(prefix_lengths)}"
        )
    _need_integers(prefix_lengths, where=where, name="prefix_lengths", what="lengths")
    if values_readable(prefix_lengths):
        low, high = int(prefix_lengths.min()), int(prefix_lengths.max())
        if low < 0 or high > length:
            raise ValueError(
                f"{where}: prefix_lengths contains {low if low < 0 else high}, outside [0, {length}] (the row length)"
            )


def check_positions(
    position_ids: object,
    document_ids: object,
    *,
    where: str,
    shape: tuple[int, int],
    max_positions: int,
    cached: int = 0,
    documents_name: str = "document_ids",
) -> None:
    """``position_ids`` must be None or (B, T) / (1, T) integers in [0, max_positions); ``document_ids``
    (packed rows; named ``documents_name`` in messages) None or (B, T) integers, and only without a KV
    cache."""
    if position_ids is not None:
        if (
            not isinstance(position_ids, torch.Tensor)
            or position_ids.dim() != 2
            or (tuple(position_ids.shape) not in (shape, (1, shape[1])))
        ):
            raise ValueError(
                f"{where}: position_ids must have shape {shape} (or (1, {shape[1]})), like the ids; got "
                f"{_shape(position_ids)}"
            )
        _need_integers(position_ids, where=where, name="position_ids", what="positions", accepted=INDICES)
        if values_readable(position_ids):
            low, high = int(position_ids.min()), int(position_ids.max())
            if low < 0 or high >= max_positions:
                raise ValueError(
                    f"{where}: position_ids contains {low if low < 0 else high}, outside [0, {max_positions}) "
                    "(the model's max_positions)"
                )
    if document_ids is None:
        return
    if cached:
        raise ValueError(f"{where}: {documents_name} (packed training rows) cannot be used with a KV cache")
    if not isinstance(document_ids, torch.Tensor) or tuple(document_ids.shape) != shape:
        raise ValueError(
            f"{where}: {documents_name} must have shape {shape}, one document id per token; got "
            f"{_shape(document_ids)}"
        )
    _need_integers(document_ids, where=where, name=documents_name, what="document ids")


def check_ids(
    ids: object, *, where: str, name: str, vocab_size: int, max_positions: int, cached: int = 0
) -> tuple[int, int]:
    """``ids`` must be (B, T) integer token ids in [0, vocab_size), cached + T <= max_positions; -> (B, T)."""
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2:
        hint = (
            f"; for one sequence pass {name}[None]"
            if isinstance(ids, torch.Tensor) and ids.dim() == 1
            else ""
        )
        raise ValueError(
            f"{where}: {name} must be a (batch, length) tensor of token ids, got {_shape(ids)}{hint}"
        )
    _need_integers(ids, where=where, name=name, what="token ids", accepted=INDICES)
    B, T = ids.shape
    if cached + T > max_positions:
        held = f"{cached} cached + {T} new" if cached else f"{T}"
        raise ValueError(
            f"{where}: {name} has {held} positions, more than the model's max_positions ({max_positions})"
        )
    if values_readable(ids):
        low, high = int(ids.min()), int(ids.max())
        if low < 0 or high >= vocab_size:
            raise ValueError(
                f"{where}: {name} contains token id {low if low < 0 else high}, outside the vocabulary [0, {vocab_size})"
            )
    return B, T


def check_mask(
    mask: object, *, where: str, name: str, shape: tuple[int, int], like: str, cached: bool = False
) -> None:
    """``mask`` must be None or a bool/integer tensor of ``shape`` holding 0s and 1s (1 = token)."""
    if mask is None:
        return
    length = "cached + length" if cached else "length"
    if not isinstance(mask, torch.Tensor) or tuple(mask.shape) != shape:
        raise ValueError(
            f"{where}: {name} must have shape (batch, {length}) = {shape}, like {like}; got {_shape(mask)}"
        )
    if mask.dtype.is_floating_point or mask.dtype.is_complex:
        raise ValueError(
            f"{where}: {name} must be bool or integer (1 = token, 0 = padding), got dtype {mask.dtype}; "
            "an additive float mask (0 / -inf) is another convention"
        )
    if mask.dtype != torch.bool:
        _need_integers(mask, where=where, name=name, what="values, 1 = token and 0 = padding")
    if mask.dtype != torch.bool and values_readable(mask):
        low, high = int(mask.min()), int(mask.max())
        if low < 0 or high > 1:
            raise ValueError(
                f"{where}: {name} must hold only 0 (padding) and 1 (token), got {low if low < 0 else high}"
            )


def check_token_types(
    token_type_ids: object, *, where: str, shape: tuple[int, int], segment_vocab_size: int
) -> None:
    """``token_type_ids`` must be None or (B, T) integer segment ids in [0, segment_vocab_size).

    A model without segment embeddings ignores them (Hugging Face tokenizers return them anyway): then only
    their shape and dtype are checked.
    """
    if token_type_ids is None:
        return
    if not isinstance(token_type_ids, torch.Tensor) or tuple(token_type_ids.shape) != shape:
        raise ValueError(
            f"{where}: token_type_ids must have shape {shape}, like input_ids; got {_shape(token_type_ids)}"
        )
    _need_integers(token_type_ids, where=where, name="token_type_ids", what="segment ids", accepted=INDICES)
    if segment_vocab_size and values_readable(token_type_ids):
        low, high = int(token_type_ids.min()), int(token_type_ids.max())
        if low < 0 or high >= segment_vocab_size:
            raise ValueError(
                f"{where}: token_type_ids contains segment id {low if low < 0 else high}, outside "
                f"[0, {segment_vocab_size})"
            )


def check_labels(
    labels: object, *, where: str, shape: tuple[int | None, ...], num_classes: int, like: str
) -> None:
    """``labels`` must be None or an integer tensor of ``shape`` (None: any size there) holding class ids
    in [0, num_classes) or -100 (ignored by the loss)."""
    if labels is None:
        return
    wanted = (
        "(" + ", ".join("length" if n is None else str(n) for n in shape) + ("," * (len(shape) == 1)) + ")"
    )
    if (
        not isinstance(labels, torch.Tensor)
        or labels.dim() != len(shape)
        or any(want is not None and have != want for have, want in zip(labels.shape, shape))
    ):
        raise ValueError(f"{where}: labels must have shape {wanted}, like {like}; got {_shape(labels)}")
    _need_integers(labels, where=where, name="labels", what="class ids", accepted=CLASS_IDS)
    if values_readable(labels):
        real = labels[labels != IGNORE_INDEX]
        low, high = (int(real.min()), int(real.max())) if real.numel() else (0, 0)
        if low < 0 or high >= num_classes:
            raise ValueError(
                f"{where}: labels contains {low if low < 0 else high}, outside [0, {num_classes}) "
                f"and not {IGNORE_INDEX} (ignored)"
            )


def check_pixels(
    pixel_values: object,
    *,
    where: str,
    channels: int,
    image_size: int,
    patch_size: int,
    interpolate: bool,
) -> tuple[int, int]:
    """``pixel_values`` must be a (B, channels, H, W) float tensor with H = W = image_size, or (with
    ``interpolate``) H and W any positive multiples of patch_size; returns (B, patches per image)."""
    if not isinstance(pixel_values, torch.Tensor) or pixel_values.dim() != 4:
        hint = (
            "; for one image pass pixel_values[None]"
            if isinstance(pixel_values, torch.Tensor) and pixel_values.dim() == 3
            else ""
        )
        raise ValueError(
            f"{where}: pixel_values must be a (batch, channels, height, width) tensor, got "
            f"{_shape(pixel_values)}{hint}"
        )
    if not pixel_values.dtype.is_floating_point:
        raise ValueError(
            f"{where}: pixel_values must be floats (an image processor's rescaled, normalised output), got "
            f"dtype {pixel_values.dtype}"
        )
    B, C, H, W = pixel_values.shape
    if channels != C:
        raise ValueError(
            f"{where}: pixel_values has {C} channels (dim 1 of {_shape(pixel_values)}), the model takes "
            f"{channels} (embedding.channels)"
        )
    if not interpolate and (image_size, image_size) != (H, W):
        raise ValueError(
            f"{where}: pixel_values are {H}x{W} images, the model takes {image_size}x{image_size} "
            "(embedding.image_size); resize them, or pass interpolate_pos_encoding=True"
        )
    if H % patch_size or W % patch_size or not H or not W:
        raise ValueError(
            f"{where}: pixel_values are {H}x{W} images; height and width must be positive multiples of "
            f"patch_size ({patch_size})"
        )
    return B, (H // patch_size) * (W // patch_size)


def check_memory(memory: object, *, where: str, rows: int, d_model: int) -> int:
    """``memory`` must be an encoder output (rows, S, d_model); returns S."""
    if (
        not isinstance(memory, torch.Tensor)
        or memory.dim() != 3
        or memory.shape[0] != rows
        or memory.shape[2] != d_model
    ):
        raise ValueError(
            f"{where}: memory must be the encoder output, ({rows}, source length, {d_model}) for {rows} "
            f"target rows; got {_shape(memory)}"
        )
    return memory.shape[1]


def check_logits_mask(
    logits_mask: object, ids: torch.Tensor, *, where: str, head: str, has_head: bool = True
) -> None:
    """``logits_mask`` must be None or bool and shaped like the (B, T) ids the head scores, and the model
    must have the token-level ``head`` it selects positions for."""
    if logits_mask is None:
        return
    if not has_head:
        raise ValueError(f"{where}: logits_mask selects positions for the {head}; this model has none")
    if (
        not isinstance(logits_mask, torch.Tensor)
        or logits_mask.dtype != torch.bool
        or tuple(logits_mask.shape) != tuple(ids.shape)
    ):
        dtype = logits_mask.dtype if isinstance(logits_mask, torch.Tensor) else type(logits_mask).__name__
        raise ValueError(
            f"{where}: logits_mask must be a bool tensor of shape {tuple(ids.shape)} (batch, positions) for "
            f"the {head}; got {dtype} of shape {_shape(logits_mask)}"
        )


def check_chunked_loss(
    loss: object,
    *,
    where: str,
    device: torch.device,
    positions: int | torch.Tensor,
    labels: object,
    has_head: bool,
) -> None:
    """``chunked_loss`` must be None or a `ChunkedLoss` for a model with an LM head, without ``labels``, its
    targets one integer per scored position: ``positions``, B * T, or the (B, T) ``logits_mask`` whose
    True count is read where reading is free (a CPU tensor)."""
    if loss is None:
        return
    if not isinstance(loss, ChunkedLoss):
        raise ValueError(
            f"{where}: chunked_loss must be a zoo.losses.chunked.ChunkedLoss, got {type(loss).__name__}"
        )
    if not has_head:
        raise ValueError(f"{where}: chunked_loss is computed through the LM head; this model has none")
    if labels is not None:
        raise ValueError(f"{where}: pass labels (a mean loss beside the logits) or chunked_loss, not both")
    targets = loss.targets
    check_devices(where, device, **{"chunked_loss.targets": targets})
    _need_integers(targets, where=where, name="chunked_loss.targets", what="class ids", accepted=CLASS_IDS)
    if isinstance(positions, torch.Tensor):
        positions = int(positions.sum()) if values_readable(positions) else targets.shape[0]
    if targets.dim() != 1 or targets.shape[0] != positions:
        raise ValueError(
            f"{where}: chunked_loss.targets must have shape ({positions},), one per position the LM head "
            f"scores; got {_shape(targets)}"
        )


def _need_integers(
    tensor: torch.Tensor, *, where: str, name: str, what: str, accepted: tuple[torch.dtype, ...] = INTEGERS
) -> None:
    dtype = tensor.dtype
    if dtype not in accepted:
        raise ValueError(
            f"{where}: {name} must hold integer {what}, got dtype {dtype}; accepted: {_names(accepted)}"
        )


def _names(dtypes: tuple[torch.dtype, ...]) -> str:
    return ", ".join(str(dtype) for dtype in dtypes)


def _shape(value: object) -> str:
    return str(tuple(value.shape)) if isinstance(value, torch.Tensor) else type(value).__name__
