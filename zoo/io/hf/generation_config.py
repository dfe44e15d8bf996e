"""Hugging Face's ``generation_config.json`` read into zoo's generation options.

What zoo acts on, and what it becomes (`zoo.generation.GenerationConfig`):

    suppress_tokens, begin_suppress_tokens       the same fields (SuppressTokens[AtBegin] processors)
    decoder_start_token_id                       checked against the model's spec.decoder_start_token_id
    lang_to_id, task_to_id, no_timestamps_token_id, forced_decoder_ids
                                                 decoder_prompt_ids: Whisper's init tokens after the start
                                                 token (`HFGenerationSettings.prompt`, transformers'
                                                 ``_retrieve_init_tokens`` without timestamps)
    max_length                                   the longest decoder sequence (prompt included)

A multilingual Whisper (``lang_to_id``) with no language given detects it from the audio, as transformers
does (`zoo.audio.transcribe.detect_language`). Timestamps (``return_timestamps``) are not supported: the
prompt always ends with ``<|notimestamps|>`` when the config names one.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zoo.generation import GenerationConfig
from zoo.io.hf.common import HFError
from zoo.io.jsonfile import read_json_object
from zoo.io.names import GENERATION_CONFIG_NAME
from zoo.io.paths import inside


@dataclass(frozen=True)
class HFGenerationSettings:
    """The fields of a ``generation_config.json`` that zoo's generation reads (all optional)."""

    suppress_tokens: tuple[int, ...] | None = None
    begin_suppress_tokens: tuple[int, ...] | None = None
    decoder_start_token_id: int | None = None
    max_length: int | None = None
    lang_to_id: dict[str, int] = field(default_factory=dict)
    task_to_id: dict[str, int] = field(default_factory=dict)
    no_timestamps_token_id: int | None = None
    forced_decoder_ids: tuple[tuple[int, int | None], ...] = ()

    @classmethod
    def from_dict(
        cls, data: Mapping[str, Any], *, source: str = GENERATION_CONFIG_NAME
    ) -> HFGenerationSettings:
        """Each field checked for its kind; a wrong one is an HFError naming ``source`` and the field."""

        def ids(key: str) -> tuple[int, ...] | None:
            value = data.get(key)
            if value is None:
                return None
            if not isinstance(value, list) or not all(_is_id(v) for v in value):
                raise HFError(f"{source}: {key} must be a list of token ids, got {value!r:.80}")
            return tuple(value)

        def one(key: str) -> int | None:
            value = data.get(key)
            if value is not None and not _is_id(value):
                raise HFError(f"{source}: {key} must be a token id, got {value!r:.80}")
            return value

        def table(key: str) -> dict[str, int]:
            value = data.get(key) or {}
            if not isinstance(value, dict) or not all(_is_id(v) for v in value.values()):
                raise HFError(f"{source}: {key} must map names to token ids, got {value!r:.80}")
            return dict(value)

        forced = data.get("forced_decoder_ids") or []
        if not isinstance(forced, list) or not all(
            isinstance(p, list) and len(p) == 2 and _is_id(p[0]) and (p[1] is None or _is_id(p[1]))
            for p in forced
        ):
            raise HFError(
                f"{source}: forced_decoder_ids must be [index, token id or null] pairs, got {forced!r:.80}"
            )
        return cls(
            suppress_tokens=ids("suppress_tokens"),
            begin_suppress_tokens=ids("begin_suppress_tokens"),
            decoder_start_token_id=one("decoder_start_token_id"),
            max_length=one("max_length"),
            lang_to_id=table("lang_to_id"),
            task_to_id=table("task_to_id"),
            no_timestamps_token_id=one("no_timestamps_token_id"),
            forced_decoder_ids=tuple((int(i), t) for i, t in sorted(forced)),
        )

    @property
    def multilingual(self) -> bool:
        """Whether the decoder prompt names a language (then detected when none is given)."""
        return bool(self.lang_to_id)

    def language_id(self, language: str) -> int:
        """The token of ``language``: a code (``"fr"``) or the token itself (``"<|fr|>"``)."""
        token = language if language.startswith("<|") else f"<|{language.lower()}|>"
        if token not in self.lang_to_id:
            known = ", ".join(name.strip("<|>") for name in list(self.lang_to_id)[:12])
            more = ", ..." if len(self.lang_to_id) > 12 else ""
            what = f"this model's languages: {known}{more}" if known else "this model names no languages"
            raise ValueError(f"language {language!r} is not one of {what}")
        return self.lang_to_id[token]

    def prompt(
        self, *, language_id: int | None = None, task: str | None = None, language_given: bool = False
    ) -> tuple[int, ...]:
        """The decoder prompt after the start token (transformers' ``_retrieve_init_tokens``, no timestamps):
        ``forced_decoder_ids`` when neither a language nor a task is asked for, the language token put in
        or replaced, the task's (``task`` or, with a language asked for, ``transcribe``), then
        ``<|notimestamps|>``. ``language_id``: given or detected; ``language_given``: asked for by the caller."""
        tokens: list[int | None] = []
        if task is None and not language_given:
            tokens = [token for _, token in self.forced_decoder_ids]
        if language_id is not None:
            if tokens:
                tokens[0] = language_id
            else:
                tokens.append(language_id)
        tasks = set(self.task_to_id.values())
        if task is not None:
            if task not in self.task_to_id:
                raise ValueError(
                    f"task {task!r} is not one of this model's tasks: {', '.join(self.task_to_id) or 'none'}"
                )
            task_id = self.task_to_id[task]
            if any(t in tasks for t in tokens):
                tokens = [task_id if t in tasks else t for t in tokens]
            else:
                tokens.append(task_id)
        elif language_given and self.task_to_id and not any(t in tasks for t in tokens):
            tokens.append(self.task_to_id["transcribe"])
        if self.no_timestamps_token_id is not None and (
            not tokens or tokens[-1] != self.no_timestamps_token_id
        ):
            tokens.append(self.no_timestamps_token_id)
        return tuple(t for t in tokens if t is not None)

    def config(self, prompt: tuple[int, ...], **overrides: Any) -> GenerationConfig:
        """A `GenerationConfig` with these settings and ``prompt`` as ``decoder_prompt_ids``; ``overrides``
        (e.g. ``max_new_tokens``) on top."""
        return GenerationConfig(
            suppress_tokens=self.suppress_tokens,
            begin_suppress_tokens=self.begin_suppress_tokens,
            decoder_prompt_ids=prompt or None,
            **overrides,
        )


def read_generation_settings(folder: str | os.PathLike[str]) -> HFGenerationSettings | None:
    """The ``generation_config.json`` of a model folder, or None when it has none."""
    root = Path(folder).expanduser()
    path = inside(root, GENERATION_CONFIG_NAME, error=HFError)
    if not path.is_file():
        return None
    return HFGenerationSettings.from_dict(read_json_object(path, error=HFError), source=str(path))


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
