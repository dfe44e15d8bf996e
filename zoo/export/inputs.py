"""What an exported graph takes: input names per family, a made-up example batch, and its dynamic dims.

    family            inputs (int64, 1 = token / 0 = padding in the masks)        dynamic dims
    encoder           input_ids, attention_mask (, token_type_ids: segments)     batch, length
    decoder           input_ids, attention_mask                                    batch, length
    encoder-decoder   input_ids, attention_mask (B, S),                            batch, source_length,
                      decoder_input_ids, decoder_attention_mask (B, T)            target_length

The example is right-padded (row i holds ``length - i`` real tokens, at least one), so the traced forward
builds and applies the padding masks: an all-ones mask would be traced the same way (zoo never reads mask
values while exporting, `zoo.blocks.masks.values_readable`), but a missing one would trace the mask-free
shortcut. Batch and lengths are at least 2: torch.export specialises a dimension whose example size is 1.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch.export import Dim

from zoo.export.errors import ExportError
from zoo.models.base import ZooModel

# Every input an exported forward may take, per family, in the order the graph takes them.
INPUT_NAMES: dict[str, tuple[str, ...]] = {
    "encoder": ("input_ids", "attention_mask", "token_type_ids"),
    "decoder": ("input_ids", "attention_mask"),
    "encoder-decoder": ("input_ids", "attention_mask", "decoder_input_ids", "decoder_attention_mask"),
}
# The inputs an exported forward cannot do without.
REQUIRED: dict[str, tuple[str, ...]] = {
    "encoder": ("input_ids",),
    "decoder": ("input_ids",),
    "encoder-decoder": ("input_ids", "decoder_input_ids"),
}
MIN_DYNAMIC = 2  # the smallest example size of a dynamic dimension (a size of 1 is specialised)


def input_names(model: ZooModel) -> tuple[str, ...]:
    """The inputs `example_inputs` makes for ``model``: every name of its family, ``token_type_ids`` only
    where the model has segment embeddings."""
    names = INPUT_NAMES[_exported_family(model)]
    if not model.spec.embedding.segment_vocab_size:
        names = tuple(name for name in names if name != "token_type_ids")
    return names


def _exported_family(model: ZooModel) -> str:
    """The model's family, or `ExportError` for one this exporter does not trace yet (a dual encoder)."""
    family = model.spec.family
    if family not in INPUT_NAMES:
        raise ExportError(
            f"zoo.export: a {family} model (CLIP, SigLIP) is not exported yet; zoo.to_hf writes its Hugging Face checkpoint"
        )
    return family


def example_inputs(
    model: ZooModel,
    *,
    batch: int = 2,
    length: int = 8,
    target_length: int | None = None,
    seed: int = 0,
) -> dict[str, torch.Tensor]:
    """A padded example batch for ``model`` on its device: ids (B, T) drawn from the vocabulary with a
    seeded generator, right padding (row i holds ``length - i`` real tokens) in every attention mask.

    ``target_length`` (encoder-decoder): the decoder's length, default ``length``.
    """
    spec = model.spec
    target_length = length if target_length is None else target_length
    for name, value in (("batch", batch), ("length", length), ("target_length", target_length)):
        if value < 1:
            raise ExportError(f"example {name} must be at least 1, got {value}")
    if max(length, target_length) > spec.max_positions:
        raise ExportError(
            f"example length {max(length, target_length)} is more than the model's max_positions "
            f"({spec.max_positions})"
        )
    device = _device(model)
    generator = torch.Generator().manual_seed(seed)
    pad = spec.pad_token_id or 0

    def tokens(vocab_size: int, T: int) -> tuple[torch.Tensor, torch.Tensor]:
        mask = (torch.arange(T)[None] < (T - torch.arange(batch)).clamp(min=1)[:, None]).long()  # (B, T)
        low = min(3, vocab_size - 1)  # past the usual special ids, where the vocabulary allows
        ids = torch.randint(low, vocab_size, (batch, T), generator=generator)
        ids = ids.masked_fill(mask == 0, pad)
        return ids.to(device), mask.to(device)

    source_vocab = getattr(model, "input_vocab_size", spec.vocab_size)
    ids, mask = tokens(source_vocab, length)
    example = {"input_ids": ids, "attention_mask": mask}
    if spec.family == "encoder-decoder":
        target, target_mask = tokens(spec.vocab_size, target_length)
        example |= {"decoder_input_ids": target, "decoder_attention_mask": target_mask}
    if "token_type_ids" in input_names(model):
        example["token_type_ids"] = torch.zeros_like(ids)
    return example


def check_example(model: ZooModel, example: Mapping[str, object], *, dynamic: bool) -> None:
    """``example`` must hold tensors under names ``model``'s family exports, the required ones included,
    each (B, length) (a 3-D attention mask: (B, length, length)); with ``dynamic``, sizes of at least 2."""
    family = _exported_family(model)
    allowed, required = INPUT_NAMES[family], REQUIRED[family]
    unknown = sorted(set(example) - set(allowed))
    if unknown:
        raise ExportError(
            f"example: {', '.join(unknown)} cannot be an input of an exported {family} forward; it takes "
            f"{', '.join(allowed)}"
        )
    missing = [name for name in required if name not in example]
    if missing:
        raise ExportError(f"example: an exported {family} forward needs {', '.join(missing)}")
    for name, value in example.items():
        if (
            not isinstance(value, torch.Tensor)
            or value.dim() not in (2, 3)
            or (value.dim() == 3 and "attention_mask" not in name)
        ):
            shape = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
            raise ExportError(f"example: {name} must be a (batch, length) tensor, got {shape}")
        small = [size for size in value.shape if size < MIN_DYNAMIC]
        if dynamic and small:
            raise ExportError(
                f"example: {name} has shape {tuple(value.shape)}; a dynamic export needs every batch and "
                f"length of at least {MIN_DYNAMIC} (torch.export fixes a dimension whose example size is 1)"
            )


def dynamic_shapes(model: ZooModel, example: Mapping[str, torch.Tensor]) -> dict[str, dict[int, Dim]]:
    """``torch.export`` dynamic shapes for ``example``: one ``batch`` Dim shared by every input, and the
    lengths (``length``; ``source_length`` and ``target_length`` for an encoder-decoder), each from 1 to the
    model's ``max_positions`` (the longest sequence its forward accepts)."""
    encoder_decoder = model.spec.family == "encoder-decoder"
    top = model.spec.max_positions
    batch = Dim("batch", min=1)
    source = Dim("source_length" if encoder_decoder else "length", min=1, max=top)
    target = Dim("target_length", min=1, max=top) if encoder_decoder else source
    shapes = {}
    for name, value in example.items():
        length = target if name.startswith("decoder_") else source
        shapes[name] = {0: batch, 1: length} | ({2: length} if value.dim() == 3 else {})
    return shapes


def _device(model: ZooModel) -> torch.device:
    for tensor in model.parameters():
        return tensor.device
    return torch.device("cpu")
