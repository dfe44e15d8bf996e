"""`transcribe`: speech to text with an audio encoder-decoder (Whisper), one 30 s clip per call.

    audio.wav ─(`read_wav`: 16-bit PCM, 16 kHz, channels averaged)─> samples (N,)
      ─(`log_mel`: WhisperFeatureExtractor's features)─> input_features (1, M, 3000)
      ─> the language (given, or detected from the first decoder step as transformers does)
      ─> generate from [start, language, task, notimestamps] with the generation_config.json the model
         was read with (suppressed tokens, `zoo.io.hf.generation_config`; none: refused, not guessed)
      ─> tokens ─> tokenizer.json decode (specials skipped)

Greedy search only (transformers' short-form default); no timestamps, no long-form (> 30 s is refused).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from zoo.audio.features import log_mel
from zoo.audio.wav import read_wav
from zoo.io.generation_file import generation_file_of
from zoo.io.hf.generation_config import HFGenerationSettings
from zoo.io.names import GENERATION_CONFIG_NAME
from zoo.io.pretrained import load_pretrained
from zoo.io.tokenizer import Tokenizer
from zoo.models.audio import AudioEncoderDecoderModel
from zoo.models.base import ZooModel

Audio = str | os.PathLike[str] | np.ndarray | torch.Tensor


@dataclass(frozen=True)
class Transcription:
    """What `transcribe` returns: the text, the generated token ids (prompt left out, up to and without the
    end-of-text token) and the language token's code (``"en"``) when the model names languages."""

    text: str
    tokens: list[int]
    language: str | None


def transcribe(
    model: str | os.PathLike[str] | ZooModel,
    audio: Audio,
    *,
    tokenizer: Tokenizer | None = None,
    language: str | None = None,
    task: str | None = None,
    max_new_tokens: int | None = None,
    settings: HFGenerationSettings | None = None,
    device: torch.device | str | None = None,
) -> Transcription:
    """Transcribe (or, ``task="translate"``, translate to English) one clip of at most 30 s.

    ``model``: a model folder (zoo or Hugging Face, with its ``tokenizer.json``), or a loaded audio model
    (then ``tokenizer`` for the text). The prompt and the suppressed tokens come from ``settings``, else
    from the ``generation_config.json`` the model was read with (`zoo.from_hf` and `zoo.load` read it,
    `zoo.save` writes it); a model with neither is refused (a `ValueError` saying so), never decoded
    without its prompt. ``settings=HFGenerationSettings()`` decodes from the start token alone.
    ``audio``: a 16-bit PCM WAV file at 16 kHz, or the samples (N,) at 16 kHz as floats in [-1, 1].
    ``language``: a code (``"fr"``) or token (``"<|fr|>"``); None: the config's, else detected.
    ``max_new_tokens``: default, as many as the decoder's positions allow after the prompt.

    >>> zoo.transcribe("whisper-tiny/", "speech.wav").text
    """
    if isinstance(model, ZooModel):
        folder = getattr(model, "name_or_path", None)
    else:
        folder = os.fspath(model)
        loaded = load_pretrained(folder, device=device)
        model, tokenizer = loaded.model, tokenizer or loaded.tokenizer
    if not isinstance(model, AudioEncoderDecoderModel):
        raise ValueError(
            f"transcribe needs an audio model (encoder.embedding: {{kind: audio}}, e.g. Whisper), got a "
            f"{model.spec.family} model{f' ({model.spec.name})' if model.spec.name else ''}"
        )
    settings = settings if settings is not None else _carried_settings(model, folder)
    samples = read_wav(audio) if isinstance(audio, str | os.PathLike) else audio
    parameter = next(model.parameters())
    name = os.fspath(audio) if isinstance(audio, str | os.PathLike) else "audio"
    features = log_mel(samples, num_mel_bins=model.front_end.num_mel_bins, name=name)[None]  # (1, M, 3000)
    features = features.to(parameter.device, parameter.dtype)
    language_id = settings.language_id(language) if language is not None else None
    if language_id is None and settings.multilingual and _language_open(settings):
        language_id = int(detect_language(model, features, list(settings.lang_to_id.values()))[0])
    prompt = settings.prompt(language_id=language_id, task=task, language_given=language is not None)
    budget = model.spec.max_positions - 1 - len(prompt)
    if settings.max_length is not None:
        budget = min(budget, settings.max_length - 1 - len(prompt))
    ids = model.generate(features, config=settings.config(prompt, max_new_tokens=max_new_tokens or budget))
    tokens = _until_end(ids[0, 1 + len(prompt) :].tolist(), model.spec.eos_token_id)
    text = tokenizer.decode(tokens, skip_special_tokens=True).strip() if tokenizer is not None else ""
    codes = {token_id: name.strip("<|>") for name, token_id in settings.lang_to_id.items()}
    spoken = next((codes[t] for t in prompt if t in codes), None)
    return Transcription(text=text, tokens=tokens, language=spoken)


def _carried_settings(model: ZooModel, folder: str | None) -> HFGenerationSettings:
    """The settings of the ``generation_config.json`` the model was read with (`zoo.io.generation_file`); a
    model without one is refused in one line: decoding with no prompt would be silently different text."""
    data = generation_file_of(model)
    if data is None:
        where = folder or model.spec.name or "the model"
        raise ValueError(
            f"{where}: no {GENERATION_CONFIG_NAME} (Whisper's language/task prompt and suppressed tokens): "
            f"copy the Hugging Face model's beside the weights, or write {{}} there to decode from the start "
            "token alone (in Python: settings=HFGenerationSettings())"
        )
    return HFGenerationSettings.from_dict(data, source=f"{folder or 'the model'}: {GENERATION_CONFIG_NAME}")


@torch.no_grad()
def detect_language(
    model: AudioEncoderDecoderModel, features: torch.Tensor, language_ids: Sequence[int]
) -> torch.Tensor:
    """(B,) the most likely language token of each clip: the first decoder step after the start token,
    restricted to ``language_ids`` (transformers' ``WhisperForConditionalGeneration.detect_language``)."""
    was_training = model.training
    model.eval()
    try:
        start = torch.full((features.shape[0], 1), model.decoder_start_token_id, device=features.device)
        logits = model(features, decoder_input_ids=start).logits[:, -1]  # (B, V)
    finally:
        model.train(was_training)
    candidates = torch.tensor(language_ids, device=logits.device)
    return candidates[logits[:, candidates].argmax(dim=-1)]


def _language_open(settings: HFGenerationSettings) -> bool:
    """Whether the configured prompt leaves the language to the audio (transformers detects it then)."""
    forced = [token for _, token in settings.forced_decoder_ids]
    return not forced or forced[0] is None or forced[0] not in settings.lang_to_id.values()


def _until_end(tokens: list[int], eos: int | None) -> list[int]:
    """The generated tokens up to (without) the first end-of-text token and the padding after it."""
    return tokens[: tokens.index(eos)] if eos is not None and eos in tokens else tokens
