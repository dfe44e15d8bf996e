"""Read a WAV file with the standard library's ``wave`` module and numpy: 16-bit PCM, mono or stereo.

Stereo (or more channels) is averaged to one channel; samples are scaled to [-1, 1) by 1/32768, as
soundfile and librosa read 16-bit PCM. zoo does not resample: a file at another rate than the model needs
is refused by name, with the command that converts it (resampling filters differ from tool to tool, and the
features must match what the model was trained on).
"""

from __future__ import annotations

import os
import wave
from pathlib import Path

import numpy as np


def read_wav(path: str | os.PathLike[str], *, sample_rate: int | None = 16_000) -> np.ndarray:
    """The samples of a 16-bit PCM WAV file, (N,) float32 in [-1, 1), channels averaged to one.

    ``sample_rate``: the rate the file must have (None: any; `wav_rate` tells it). One-line errors name the
    file and what was expected: not a WAV file, another sample width, another rate."""
    samples, rate = read_wav_any_rate(path)
    if sample_rate is not None and rate != sample_rate:
        raise ValueError(
            f"{path}: sample rate {rate} Hz; {sample_rate} Hz is needed and zoo does not resample (convert it "
            f"first, e.g. ffmpeg -i {Path(path).name} -ar {sample_rate} -ac 1 out.wav)"
        )
    return samples


def read_wav_any_rate(path: str | os.PathLike[str]) -> tuple[np.ndarray, int]:
    """(samples (N,) float32, sample rate in Hz) of a 16-bit PCM WAV file, channels averaged."""
    try:
        with wave.open(os.fspath(path), "rb") as file:
            channels, width, rate = file.getnchannels(), file.getsampwidth(), file.getframerate()
            frames = file.readframes(file.getnframes())
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no such file") from None
    except (wave.Error, EOFError) as error:
        raise ValueError(f"{path}: not a PCM WAV file ({error})") from None
    if width != 2:
        raise ValueError(
            f"{path}: {8 * width}-bit samples; zoo reads 16-bit PCM WAV (convert it, e.g. ffmpeg -i "
            f"{Path(path).name} -c:a pcm_s16le out.wav)"
        )
    pcm = np.frombuffer(frames, dtype="<i2").reshape(-1, channels)  # (N, channels)
    return (pcm.astype(np.float32) / 32768.0).mean(axis=1, dtype=np.float32), rate
