"""Whisper's log-mel features equal transformers' WhisperFeatureExtractor (torch and numpy only), on real
speech and on generated signals; WAV files are read with the standard library as soundfile would read them.

``data/speech.wav`` is real synthesised speech: espeak-ng ("Hello, this is a short test of speech.",
voice en, 165 words a minute) at 22,050 Hz, resampled to 16 kHz with scipy's ``resample_poly(x, 160,
441)``, silence trimmed, 16-bit mono (1.17 s, 37 KB). It is committed so that the tests need no espeak.
"""

from __future__ import annotations

import wave
from pathlib import Path

import numpy as np
import pytest

from zoo.audio import features, log_mel, mel_filters, read_wav

transformers = pytest.importorskip("transformers")
SPEECH = Path(__file__).parent / "data" / "speech.wav"


def extractor(mels: int = 80) -> transformers.WhisperFeatureExtractor:
    return transformers.WhisperFeatureExtractor(feature_size=mels)


def reference(samples: np.ndarray, mels: int = 80) -> np.ndarray:
    return extractor(mels)(samples, sampling_rate=16000, return_tensors="np").input_features[0]


def write_wav(path: Path, pcm: np.ndarray, *, rate: int = 16000, width: int = 2) -> Path:
    with wave.open(str(path), "wb") as file:
        file.setnchannels(1 if pcm.ndim == 1 else pcm.shape[1])
        file.setsampwidth(width)
        file.setframerate(rate)
        file.writeframes(pcm.astype("<i2" if width == 2 else "u1").tobytes())
    return path


@pytest.mark.parametrize("mels", [80, 128])
def test_the_mel_filters_are_transformers_slaney_filters(mels: int) -> None:
    assert np.abs(mel_filters(mels) - extractor(mels).mel_filters).max() < 1e-12


def test_real_speech_features_equal_the_feature_extractor() -> None:
    samples = read_wav(SPEECH)
    assert 0.5 < len(samples) / 16000 <= 2.0 and np.abs(samples).max() > 0.1  # speech, not silence
    got = log_mel(samples).numpy()
    assert got.shape == (80, 3000)
    assert np.abs(got - reference(samples)).max() < 1e-4


@pytest.mark.parametrize("mels", [80, 128])
def test_generated_signal_features_equal_the_feature_extractor(mels: int) -> None:
    # a chirp from 100 Hz to 6 kHz, a click train and noise: every mel band and the dynamic-range floor
    t = np.arange(int(16000 * 3.3)) / 16000
    chirp = 0.4 * np.sin(2 * np.pi * (100 * t + (6000 - 100) / (2 * 3.3) * t**2))
    clicks = (np.arange(len(t)) % 1600 == 0) * 0.9
    noise = 0.01 * np.random.default_rng(0).standard_normal(len(t))
    samples = (chirp + clicks + noise).astype(np.float32)
    assert np.abs(log_mel(samples, num_mel_bins=mels).numpy() - reference(samples, mels)).max() < 1e-4


def test_a_batch_keeps_each_clips_own_dynamic_range() -> None:
    loud, quiet = read_wav(SPEECH), read_wav(SPEECH) * 0.01
    batch = features([loud, quiet]).numpy()
    expected = extractor()([loud, quiet], sampling_rate=16000, return_tensors="np").input_features
    assert batch.shape == (2, 80, 3000) and np.abs(batch - expected).max() < 1e-4


def test_more_than_30_seconds_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"^long\.wav is 31\.0 s long; Whisper reads up to 30 s at a time"):
        log_mel(np.zeros(16000 * 31, dtype=np.float32), name="long.wav")


def test_stereo_is_averaged_and_16_bit_is_scaled_like_soundfile(tmp_path: Path) -> None:
    left = np.array([1000, -2000, 32767, -32768], dtype=np.int16)
    right = np.array([3000, 2000, 32767, -32768], dtype=np.int16)
    path = write_wav(tmp_path / "stereo.wav", np.stack([left, right], axis=1))
    assert read_wav(path).tolist() == pytest.approx([2000 / 32768, 0.0, 32767 / 32768, -1.0])


def test_other_rates_and_widths_are_refused_by_name(tmp_path: Path) -> None:
    path = write_wav(tmp_path / "cd.wav", np.zeros(100, dtype=np.int16), rate=44100)
    with pytest.raises(
        ValueError, match=r"cd\.wav: sample rate 44100 Hz; 16000 Hz is needed and zoo does not resample"
    ):
        read_wav(path)
    path = write_wav(tmp_path / "eight.wav", np.full(100, 128), width=1)
    with pytest.raises(ValueError, match=r"eight\.wav: 8-bit samples; zoo reads 16-bit PCM WAV"):
        read_wav(path)
    (tmp_path / "text.wav").write_text("not audio")
    with pytest.raises(ValueError, match=r"text\.wav: not a PCM WAV file"):
        read_wav(tmp_path / "text.wav")
