"""The settings of one generate call, validated before any compute.

Every check names the argument and what was expected, so a bad call fails with a `ValueError` up front
rather than a torch traceback halfway through the search (or, worse, an index past a position table).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class GenerationConfig:
    """Search settings, with Hugging Face's names and meanings (see `zoo.generation.generate`)."""

    max_new_tokens: int = 32
    min_new_tokens: int = 0
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    num_beams: int = 1
    length_penalty: float = 1.0
    early_stopping: bool | str = False
    repetition_penalty: float = 1.0
    no_repeat_ngram_size: int = 0
    eos_token_id: tuple[int, ...] = ()
    pad_token_id: int = 0
    use_cache: bool = True

    def check(self) -> None:
        """Raise ValueError for a setting outside its range."""

        def need(ok: bool, message: str) -> None:
            if not ok:
                raise ValueError(f"generate: {message}")

        need(_is_int(self.max_new_tokens) and self.max_new_tokens >= 1,
             f"max_new_tokens must be an int >= 1, got {self.max_new_tokens!r}")  # fmt: skip
        need(_is_int(self.min_new_tokens) and self.min_new_tokens >= 0,
             f"min_new_tokens must be an int >= 0, got {self.min_new_tokens!r}")  # fmt: skip
        need(_is_int(self.num_beams) and self.num_beams >= 1,
             f"num_beams must be an int >= 1, got {self.num_beams!r}")  # fmt: skip
        need(isinstance(self.temperature, int | float) and math.isfinite(self.temperature) and self.temperature > 0,
             f"temperature must be a finite number > 0, got {self.temperature!r}")  # fmt: skip
        need(self.top_k is None or (_is_int(self.top_k) and self.top_k >= 0),
             f"top_k must be None or an int >= 0 (0 = off), got {self.top_k!r}")  # fmt: skip
        need(self.top_p is None or (isinstance(self.top_p, int | float) and 0 < self.top_p <= 1),
             f"top_p must be in (0, 1], got {self.top_p!r}")  # fmt: skip
        need(isinstance(self.repetition_penalty, int | float) and self.repetition_penalty > 0,
             f"repetition_penalty must be > 0 (1.0 = off), got {self.repetition_penalty!r}")  # fmt: skip
        need(_is_int(self.no_repeat_ngram_size) and self.no_repeat_ngram_size >= 0,
             f"no_repeat_ngram_size must be an int >= 0 (0 = off), got {self.no_repeat_ngram_size!r}")  # fmt: skip
        need(isinstance(self.length_penalty, int | float) and math.isfinite(self.length_penalty),
             f"length_penalty must be a finite number, got {self.length_penalty!r}")  # fmt: skip
        need(self.early_stopping in (True, False, "never"),
             f"early_stopping must be True, False or 'never', got {self.early_stopping!r}")  # fmt: skip


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def token_ids(value: int | Sequence[int] | None, *, name: str, vocab_size: int) -> tuple[int, ...]:
    """``eos_token_id`` as a tuple of ids, each checked against the vocabulary."""
    if value is None:
        return ()
    ids = (value,) if _is_int(value) else tuple(value)  # type: ignore[arg-type]
    for token in ids:
        if not _is_int(token) or not 0 <= token < vocab_size:
            raise ValueError(f"generate: {name} ({value!r}) must be token ids in [0, {vocab_size})")
    return ids


def check_inputs(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    config: GenerationConfig,
) -> None:
    """Raise ValueError when the prompt cannot be generated from: shape, ids, mask, length."""
    spec = model.spec
    encoder_decoder = spec.family == "encoder-decoder"
    if spec.family not in ("decoder", "encoder-decoder") or getattr(model, "lm_head", None) is None:
        missing = " (this decoder has lm_head: null)" if spec.family == "decoder" else ""
        raise ValueError(
            f"generate needs a decoder or encoder-decoder model with an LM head; got family {spec.family!r}{missing}"
        )
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
        shape = tuple(input_ids.shape) if isinstance(input_ids, torch.Tensor) else type(input_ids).__name__
        raise ValueError(f"generate: input_ids must be a (batch, length) tensor, got {shape}")
    if input_ids.dtype.is_floating_point or input_ids.dtype == torch.bool:
        raise ValueError(f"generate: input_ids must hold integer token ids, got dtype {input_ids.dtype}")
    B, T = input_ids.shape
    what = "source" if encoder_decoder else "prompt"
    if B == 0 or T == 0:
        raise ValueError(f"generate: empty {what}: input_ids has shape {(B, T)}; give at least one token")
    vocab = (spec.source_vocab_size or spec.vocab_size) if encoder_decoder else spec.vocab_size
    low, high = int(input_ids.min()), int(input_ids.max())
    if low < 0 or high >= vocab:
        bad = low if low < 0 else high
        raise ValueError(f"generate: input_ids contains token id {bad}, outside the vocabulary [0, {vocab})")
    if attention_mask is not None:
        if tuple(attention_mask.shape) != (B, T):
            raise ValueError(
                f"generate: attention_mask has shape {tuple(attention_mask.shape)}, expected {(B, T)} "
                "like input_ids"
            )
        mask = attention_mask.bool()
        if not bool(mask.any(dim=1).all()):
            raise ValueError(f"generate: a {what} row of attention_mask has no tokens (all zeros)")
        if not encoder_decoder and not bool(mask[:, -1].all()):
            raise ValueError(
                "generate: decoder-only prompts must be left-padded (attention_mask ends with 0 in some row); "
                "pad on the left so every row's last token is real"
            )
    limit = spec.max_positions
    if input_ids.shape[1] > limit:
        raise ValueError(
            f"generate: the {what} has {T} tokens, more than the model's max_positions ({limit})"
        )
    generated = (1 if encoder_decoder else T) + config.max_new_tokens
    if generated > limit:
        start = "1 start token" if encoder_decoder else f"{T} prompt tokens"
        raise ValueError(
            f"generate: {start} + max_new_tokens ({config.max_new_tokens}) = {generated} exceeds the model's "
            f"max_positions ({limit})"
        )
