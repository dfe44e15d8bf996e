"""The settings of one generate call, validated before any compute.

`GenerationConfig` is a frozen pydantic model like every other config in zoo: each field's check names
the field and what was expected, so a bad call fails with a `ValueError` up front rather than a torch
traceback halfway through the search (or, worse, an index past a position table). `check_inputs` does the
same for the prompt itself, which needs the model.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from typing import Any, Literal, TypeGuard, cast

import torch
from pydantic import (
    ConfigDict,
    StrictInt,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from zoo.generation.protocol import GenerativeModel
from zoo.spec.errors import CleanModel, short_repr

MAX_BEAMS = 1024
"""The most beams a search may keep. Each beam is a full copy of the sequence and of the KV cache, and every
step sorts ``num_beams * vocab_size`` scores per sentence: 100,000 beams of a small model take gigabytes
and minutes before the first token. Published systems use 4 to 16 (Vaswani et al. 2017: 4)."""


class GenerationConfig(CleanModel):
    """Search settings, with Hugging Face's names and meanings (see `zoo.generation.generate`).

    >>> config = GenerationConfig(do_sample=True, top_p=0.9, seed=0)
    >>> model.generate(prompt, config=config, max_new_tokens=40)   # keyword overrides are validated too

    max_new_tokens / min_new_tokens: bounds on the new tokens (eos is blocked before the minimum).
    do_sample, temperature, top_k, top_p: sample from the (warped) distribution instead of argmax.
        temperature 0 is greedy search, as in the OpenAI API and vLLM (``do_sample=True, temperature=0``
        takes the argmax). temperature, top_k or top_p set without ``do_sample=True`` change nothing: as in
        transformers, a UserWarning names them (see `validated`).
    num_beams, length_penalty, early_stopping: beam search; a finished hypothesis scores
        sum(log p) / generated_length ** length_penalty.
    num_return_sequences: n outputs per input, rows grouped per input (its n in a row): the n best
        hypotheses of beam search, best first (n <= num_beams), or n independent samples.
    repetition_penalty, no_repeat_ngram_size: discourage / forbid repeats (1.0 and 0 are off).
    bad_words_ids: token-id sequences never to produce: a single token is banned at every step, a longer
        sequence's last token whenever the sequence so far ends with the rest (an eos id alone is skipped).
    forced_bos_token_id: the first generated token when the decoder starts from one token (M2M-100 and
        mBART's target language); forced_eos_token_id: an id or a list, forced at the last step.
    eos_token_id: an id or a list (None: ``spec.eos_token_id``; ``[]`` for none); pad_token_id fills
        finished rows (None: ``spec.pad_token_id``, else the first eos id). Both are checked against
        the vocabulary once a model is at hand.
    suppress_tokens: ids never produced (transformers' SuppressTokensLogitsProcessor); begin_suppress_tokens:
        ids not produced as the first new token (SuppressTokensAtBeginLogitsProcessor). Whisper's
        generation_config.json sets both (`zoo.io.hf.generation_config`).
    decoder_prompt_ids: an encoder-decoder's decoder starts from the start token followed by these, for
        every row (Whisper's language, task and notimestamps tokens), as transformers' Whisper ``generate``
        starts from its ``init_tokens``; returned with the output, as a ``decoder_input_ids`` prompt is.
    seed: sampling draws from ``torch.Generator().manual_seed(seed)``, so runs are reproducible.
    use_cache: False recomputes the whole sequence every step (the reference for the cached path).
    prompt_lookup_num_tokens: speculative decoding whose drafts are the tokens that followed the last
        n-gram (n = max_matching_ngram_size down to 1) where it occurred before in the prompt and output;
        num_assistant_tokens / num_assistant_tokens_schedule: the draft length of an ``assistant_model``
        ("heuristic": +2 after a fully accepted draft, -1 otherwise, as transformers); see
        `zoo.generation.speculative`. assistant_confidence_threshold: the assistant's draft stops after a
        token it gave a probability below this (0, the default: off; transformers starts at 0.4); it stops at
        eos either way.

    Numbers are checked before pydantic's coercion, so ``"5"`` or ``True`` is not an int here. A bad value
    is a `zoo.spec.errors.SpecValidationError` (a pydantic ValidationError and a ValueError) listing one
    ``field: problem`` line each, without pydantic's input reprs and links.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    max_new_tokens: int = 32
    min_new_tokens: int = 0
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    num_beams: int = 1
    length_penalty: float = 1.0
    early_stopping: bool | Literal["never"] = False
    num_return_sequences: int = 1
    repetition_penalty: float = 1.0
    no_repeat_ngram_size: int = 0
    bad_words_ids: tuple[tuple[int, ...], ...] | None = None
    forced_bos_token_id: StrictInt | None = None
    forced_eos_token_id: int | list[int] | tuple[int, ...] | None = None
    eos_token_id: int | list[int] | tuple[int, ...] | None = None
    pad_token_id: StrictInt | None = None
    seed: StrictInt | None = None
    use_cache: bool = True
    prompt_lookup_num_tokens: int | None = None
    num_assistant_tokens: int = 20
    num_assistant_tokens_schedule: Literal["constant", "heuristic"] = "constant"
    assistant_confidence_threshold: float = 0.0
    max_matching_ngram_size: int = 2
    suppress_tokens: tuple[int, ...] | None = None
    begin_suppress_tokens: tuple[int, ...] | None = None
    decoder_prompt_ids: tuple[int, ...] | None = None

    @field_validator("suppress_tokens", "begin_suppress_tokens", "decoder_prompt_ids", mode="before")
    @classmethod
    def _token_list(cls, value: Any, info: ValidationInfo) -> Any:
        ok = value is None or (isinstance(value, list | tuple) and all(_is_int(t) and t >= 0 for t in value))
        return _need(value, ok, f"{info.field_name} must be None or a list of token ids (ints >= 0)")

    @field_validator("num_assistant_tokens", "max_matching_ngram_size", mode="before")
    @classmethod
    def _draft_length(cls, value: Any, info: ValidationInfo) -> Any:
        return _need(value, _is_int(value) and value >= 1, f"{info.field_name} must be an int >= 1")

    @field_validator("prompt_lookup_num_tokens", mode="before")
    @classmethod
    def _lookup_length(cls, value: Any) -> Any:
        ok = value is None or (_is_int(value) and value >= 1)
        return _need(value, ok, "prompt_lookup_num_tokens must be None or an int >= 1")

    @field_validator("max_new_tokens", "num_beams", "num_return_sequences", mode="before")
    @classmethod
    def _at_least_one(cls, value: Any, info: ValidationInfo) -> Any:
        return _need(value, _is_int(value) and value >= 1, f"{info.field_name} must be an int >= 1")

    @field_validator("num_beams", "num_return_sequences")
    @classmethod
    def _rows_bounded(cls, value: int, info: ValidationInfo) -> int:
        if value > MAX_BEAMS:
            what = "beam" if info.field_name == "num_beams" else "returned sequence"
            raise ValueError(
                f"{info.field_name} ({value}) is over the limit of {MAX_BEAMS}: each {what} copies the sequence "
                "and its KV cache, and each step of beam search sorts num_beams x vocab_size scores per sentence"
            )
        return value

    @field_validator("seed", mode="before")
    @classmethod
    def _seed(cls, value: Any) -> Any:
        ok = value is None or (_is_int(value) and 0 <= value < 2**64)  # torch.Generator's range
        return _need(value, ok, "seed must be None or an int in [0, 2**64)")

    @field_validator("min_new_tokens", mode="before")
    @classmethod
    def _not_negative(cls, value: Any, info: ValidationInfo) -> Any:
        return _need(value, _is_int(value) and value >= 0, f"{info.field_name} must be an int >= 0")

    @field_validator("top_k", mode="before")
    @classmethod
    def _top_k(cls, value: Any) -> Any:
        ok = value is None or (_is_int(value) and value >= 0)
        return _need(value, ok, "top_k must be None or an int >= 0 (0 = off)")

    @field_validator("no_repeat_ngram_size", mode="before")
    @classmethod
    def _ngram_size(cls, value: Any) -> Any:
        return _need(
            value, _is_int(value) and value >= 0, "no_repeat_ngram_size must be an int >= 0 (0 = off)"
        )

    @field_validator("temperature", mode="before")
    @classmethod
    def _temperature(cls, value: Any) -> Any:
        ok = _is_number(value) and math.isfinite(value) and value >= 0
        return _need(value, ok, "temperature must be a finite number >= 0 (0: greedy search)")

    @field_validator("assistant_confidence_threshold", mode="before")
    @classmethod
    def _confidence(cls, value: Any) -> Any:
        ok = _is_number(value) and 0 <= value <= 1
        return _need(value, ok, "assistant_confidence_threshold must be a number in [0, 1] (0 = off)")

    @field_validator("top_p", mode="before")
    @classmethod
    def _top_p(cls, value: Any) -> Any:
        return _need(
            value, value is None or (_is_number(value) and 0 < value <= 1), "top_p must be in (0, 1]"
        )

    @field_validator("repetition_penalty", mode="before")
    @classmethod
    def _repetition_penalty(cls, value: Any) -> Any:
        return _need(value, _is_number(value) and value > 0, "repetition_penalty must be > 0 (1.0 = off)")

    @field_validator("length_penalty", mode="before")
    @classmethod
    def _length_penalty(cls, value: Any) -> Any:
        return _need(
            value, _is_number(value) and math.isfinite(value), "length_penalty must be a finite number"
        )

    @field_validator("eos_token_id", "forced_eos_token_id", mode="before")
    @classmethod
    def _eos_token_id(cls, value: Any, info: ValidationInfo) -> Any:
        ok = value is None or _is_int(value) or (isinstance(value, list | tuple) and all(map(_is_int, value)))
        return _need(value, ok, f"{info.field_name} must be a token id, a list of them, or None")

    @field_validator("forced_bos_token_id", mode="before")
    @classmethod
    def _forced_bos_token_id(cls, value: Any) -> Any:
        ok = value is None or (_is_int(value) and value >= 0)
        return _need(value, ok, "forced_bos_token_id must be None or a token id (an int >= 0)")

    @field_validator("bad_words_ids", mode="before")
    @classmethod
    def _bad_words_ids(cls, value: Any) -> Any:
        ok = value is None or (
            isinstance(value, list | tuple)
            and len(value) > 0
            and all(
                isinstance(word, list | tuple) and len(word) > 0 and all(_is_int(t) and t >= 0 for t in word)
                for word in value
            )
        )
        return _need(
            value,
            ok,
            "bad_words_ids must be None or a non-empty list of non-empty lists of token ids (ints >= 0)",
        )

    @model_validator(mode="after")
    def _return_sequences(self) -> GenerationConfig:
        n, beams = self.num_return_sequences, self.num_beams
        if n > 1 and beams == 1 and not self.sampling:
            raise ValueError(
                f"num_return_sequences ({n}) > 1 needs beam search (num_beams >= {n}) or sampling "
                "(do_sample=True, temperature > 0): greedy search has one answer per input"
            )
        if beams > 1 and n > beams:
            raise ValueError(
                f"num_return_sequences ({n}) must be <= num_beams ({beams}): beam search returns the best "
                "of its beams"
            )
        return self

    @field_validator("early_stopping", mode="before")
    @classmethod
    def _early_stopping(cls, value: Any) -> Any:
        return _need(value, value in (True, False, "never"), "early_stopping must be True, False or 'never'")

    @property
    def sampling(self) -> bool:
        """Whether tokens are drawn at random: ``do_sample`` with a temperature above 0 (0 is greedy search)."""
        return self.do_sample and self.temperature > 0

    def unused_sampling_settings(self) -> list[str]:
        """``name=value`` of each sampling setting that changes nothing: temperature, top_k and top_p without
        ``do_sample``, top_k and top_p at temperature 0 (greedy search). Their "off" values are not listed."""
        warpers = [
            f"{name}={value}"
            for name, value, off in (("top_k", self.top_k, (None, 0)), ("top_p", self.top_p, (None, 1.0)))
            if value not in off
        ]
        if self.do_sample:
            return warpers if self.temperature == 0 else []
        return ([f"temperature={self.temperature}"] if self.temperature not in (0, 1.0) else []) + warpers

    @property
    def rows_per_input(self) -> int:
        """Decoder rows per input: the beams, or (sampling) the independent samples of each input."""
        return max(self.num_beams, self.num_return_sequences)


def _need(value: Any, ok: bool, message: str) -> Any:
    if not ok:
        raise ValueError(f"{message}, got {short_repr(value)}")  # bounded: the value may be anything
    return value


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float)  # bool included, as Python's own numbers do


def validated(config: GenerationConfig | None, overrides: Mapping[str, Any]) -> GenerationConfig:
    """``config`` (default: all defaults) with keyword ``overrides`` merged on top and validated.

    Unknown names are a TypeError, as for any function; a bad value is a ValueError whose message is
    pydantic's, one line per field, without its boilerplate. Sampling settings that would change nothing
    (`GenerationConfig.unused_sampling_settings`) are a UserWarning naming them, as transformers warns.
    """
    unknown = sorted(set(overrides) - set(GenerationConfig.model_fields))
    if unknown:
        raise TypeError(f"generate got unexpected arguments: {', '.join(unknown)}")
    if config is not None and not isinstance(config, GenerationConfig):
        raise TypeError(f"generate: config must be a GenerationConfig, got {type(config).__name__}")
    base = config if config is not None else GenerationConfig()
    merged = base
    if overrides:
        try:
            merged = GenerationConfig(**{**base.model_dump(), **overrides})
        except ValidationError as error:
            raise ValueError(f"generate: {_messages(error)}") from None
    unused = merged.unused_sampling_settings()
    if unused:
        why = (
            "temperature 0 is greedy search"
            if merged.do_sample
            else "do_sample is False (greedy or beam search); pass do_sample=True to sample"
        )
        verb = "has" if len(unused) == 1 else "have"
        warnings.warn(f"generate: {', '.join(unused)} {verb} no effect: {why}", UserWarning, stacklevel=3)
    return merged


def _messages(error: ValidationError) -> str:
    return "; ".join(
        item["msg"].removeprefix("Value error, ")
        if item["type"] == "value_error"
        else f"{'.'.join(str(part) for part in item['loc'])}: {item['msg']}"
        for item in error.errors()
    )


def token_ids(value: int | Sequence[int] | None, *, name: str, vocab_size: int) -> tuple[int, ...]:
    """``eos_token_id`` as a tuple of ids, each checked against the vocabulary."""
    if value is None:
        return ()
    # `_is_int` narrows only where it holds (a bool is an int but no token id): the cast names the other case.
    ids: tuple[int, ...] = (value,) if _is_int(value) else tuple(cast("Sequence[int]", value))
    for token in ids:
        if not _is_int(token) or not 0 <= token < vocab_size:
            raise ValueError(f"generate: {name} ({value!r}) must be token ids in [0, {vocab_size})")
    return ids


def check_beams(config: GenerationConfig, *, vocab_size: int) -> None:
    """Raise ValueError when ``num_beams`` exceeds the distinct continuations the search can hold.

    All beams start from the same prompt, so after t steps there are at most ``vocab_size ** t`` different
    hypotheses: beams beyond ``vocab_size ** max_new_tokens`` can never be filled, only computed.
    """
    beams, steps = config.num_beams, config.max_new_tokens
    if beams == 1:
        return
    # vocab_size ** steps without a huge int: stop once it reaches num_beams (a vocabulary of 2 or more
    # gets there within num_beams.bit_length() steps).
    continuations = 1
    for _ in range(min(steps, beams.bit_length())):
        continuations *= vocab_size
        if continuations >= beams:
            return
    raise ValueError(
        f"generate: num_beams ({beams}) is more than the vocab_size ** max_new_tokens = "
        f"{vocab_size} ** {steps} = {continuations} different continuations the search can hold"
    )


def check_model(model: object) -> GenerativeModel:
    """Raise ValueError unless ``model`` implements `GenerativeModel` and has an LM head."""
    spec = getattr(model, "spec", None)
    if spec is None:
        raise ValueError(f"generate needs a zoo model (with .spec), got {type(model).__name__}")
    if isinstance(model, GenerativeModel) and spec.lm_head is not None:
        return model
    missing = f" (this {spec.family} has lm_head: null)" if isinstance(model, GenerativeModel) else ""
    raise ValueError(
        f"generate needs a decoder or encoder-decoder model with an LM head; got family {spec.family!r}{missing}"
    )


# Prompt ids are cast to int64 once; uint16/32/64 are not among these because torch cannot min/max them.
_ID_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


def check_devices(device: torch.device, **tensors: object) -> None:
    """Refuse a model on the meta device (no weights), and a meta tensor among ``tensors`` (no values: it
    cannot be moved to the model's device, as generate moves the others)."""
    if device.type == "meta":
        raise ValueError(
            "generate: the model is on the meta device (no weights); load it, or build it on a real device"
        )
    for name, tensor in tensors.items():
        if isinstance(tensor, torch.Tensor) and tensor.is_meta:
            raise ValueError(
                f"generate: {name} is on the meta device (a meta tensor holds no values); pass it on {device}"
            )


def check_inputs(
    model: GenerativeModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    config: GenerationConfig,
) -> None:
    """Raise ValueError when the prompt cannot be generated from: shape, ids, mask, length.

    A model whose source is not token ids (an audio encoder's ``input_features``) checks it itself, with its
    ``check_source(source, attention_mask, where=...)`` (`zoo.models.audio`)."""
    check_source = getattr(model, "check_source", None)
    if check_source is not None:
        check_source(input_ids, attention_mask, where="generate")
        _check_decoder_length(model, 0, config)
        return
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
        shape = tuple(input_ids.shape) if isinstance(input_ids, torch.Tensor) else type(input_ids).__name__
        raise ValueError(f"generate: input_ids must be a (batch, length) tensor, got {shape}")
    if input_ids.dtype not in _ID_DTYPES:
        accepted = ", ".join(map(str, _ID_DTYPES))
        raise ValueError(
            f"generate: input_ids must hold integer token ids, got dtype {input_ids.dtype}; accepted: {accepted}"
        )
    B, T = input_ids.shape
    what = "prompt" if model.continues_input else "source"
    if B == 0 or T == 0:
        raise ValueError(f"generate: empty {what}: input_ids has shape {(B, T)}; give at least one token")
    vocab = model.input_vocab_size
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
        if attention_mask.dtype.is_floating_point:  # as forward: an additive 0/-inf mask would read inverted
            raise ValueError(
                f"generate: attention_mask must hold 1 (token) / 0 (padding) as int or bool, "
                f"got dtype {attention_mask.dtype}"
            )
        mask = attention_mask.bool()
        if not bool(mask.any(dim=1).all()):
            raise ValueError(f"generate: a {what} row of attention_mask has no tokens (all zeros)")
        if model.continues_input and not bool(mask[:, -1].all()):
            raise ValueError(
                "generate: decoder-only prompts must be left-padded (attention_mask ends with 0 in some row); "
                "pad on the left so every row's last token is real"
            )
    limit = model.spec.max_positions
    if input_ids.shape[1] > limit:
        raise ValueError(
            f"generate: the {what} has {T} tokens, more than the model's max_positions ({limit})"
        )
    _check_decoder_length(model, T, config)


def _check_decoder_length(model: GenerativeModel, T: int, config: GenerationConfig) -> None:
    """The decoder's positions must fit: the prompt (T tokens) and the new ones, or one start token and the
    new ones (a decoder prompt's length is checked with it, `zoo.generation.prompt`)."""
    limit = model.spec.max_positions
    generated = (T if model.continues_input else 1) + config.max_new_tokens
    if generated > limit:
        start = f"{T} prompt tokens" if model.continues_input else "1 start token"
        raise ValueError(
            f"generate: {start} + max_new_tokens ({config.max_new_tokens}) = {generated} exceeds the model's "
            f"max_positions ({limit})"
        )
