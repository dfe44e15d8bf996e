"""Whisper's log-mel features from a waveform, as transformers' ``WhisperFeatureExtractor`` computes them.

    waveform (N,) 16 kHz ─> pad with zeros (or refuse) to 30 s = 480,000 samples
        ─> |STFT|² (n_fft 400, hop 160, periodic Hann window, centred, reflect-padded) ─> (201, 3001)
        ─> drop the last frame ─> slaney mel filters (80 or 128, 0-8 kHz) ─> (M, 3000)
        ─> log10(max(x, 1e-10)) ─> max(x, x.max() - 8)  (an 80 dB dynamic range) ─> (x + 4) / 4

torch and numpy only (no librosa, no torchaudio). The filters follow transformers' ``mel_filter_bank`` with
``norm="slaney", mel_scale="slaney"`` (librosa's defaults): triangles between mel-spaced edges, each scaled
to unit area (2 / bandwidth in Hz). The STFT runs in float32 like the extractor's torch path.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

SAMPLE_RATE = 16_000
N_FFT = 400
HOP_LENGTH = 160
CHUNK_SECONDS = 30
N_SAMPLES = SAMPLE_RATE * CHUNK_SECONDS  # 480,000: one 30 s window, 3000 frames


def _hertz_to_mel(freq: np.ndarray) -> np.ndarray:
    """Slaney's mel scale: linear below 1 kHz (3 mels per 200 Hz), logarithmic above."""
    mels = 3.0 * freq / 200.0
    log_region = freq >= 1000.0
    logstep = 27.0 / np.log(6.4)
    mels[log_region] = 15.0 + np.log(freq[log_region] / 1000.0) * logstep
    return mels


def _mel_to_hertz(mels: np.ndarray) -> np.ndarray:
    freq = 200.0 * mels / 3.0
    log_region = mels >= 15.0
    logstep = np.log(6.4) / 27.0
    freq[log_region] = 1000.0 * np.exp(logstep * (mels[log_region] - 15.0))
    return freq


def mel_filters(num_mel_bins: int = 80, *, n_fft: int = N_FFT, sample_rate: int = SAMPLE_RATE) -> np.ndarray:
    """(1 + n_fft // 2, num_mel_bins) float64: slaney-normalised triangular filters from 0 Hz to 8 kHz."""
    fft_freqs = np.linspace(0, sample_rate // 2, 1 + n_fft // 2)  # (F,)
    edges_mel = np.linspace(
        _hertz_to_mel(np.array([0.0]))[0], _hertz_to_mel(np.array([8000.0]))[0], num_mel_bins + 2
    )
    edges = _mel_to_hertz(edges_mel)  # (M + 2,) Hz
    widths = np.diff(edges)  # (M + 1,)
    slopes = edges[None, :] - fft_freqs[:, None]  # (F, M + 2)
    down = -slopes[:, :-2] / widths[:-1]
    up = slopes[:, 2:] / widths[1:]
    filters = np.maximum(0.0, np.minimum(down, up))  # (F, M)
    return filters * (2.0 / (edges[2:] - edges[:-2]))[None, :]  # unit area ("slaney" norm)


def pad_or_refuse(waveform: np.ndarray | torch.Tensor, *, name: str = "audio") -> torch.Tensor:
    """(N,) samples -> (480000,) float32, zero-padded at the end (Whisper's silence); longer than 30 s is
    refused by name: one call transcribes one 30 s window (transformers would cut the rest off)."""
    samples = torch.as_tensor(
        np.asarray(waveform, dtype=np.float32) if not isinstance(waveform, torch.Tensor) else waveform
    )
    if samples.dim() != 1:
        raise ValueError(f"{name}: expected one channel of samples (N,), got shape {tuple(samples.shape)}")
    if samples.numel() > N_SAMPLES:
        seconds = samples.numel() / SAMPLE_RATE
        raise ValueError(
            f"{name} is {seconds:.1f} s long; Whisper reads up to {CHUNK_SECONDS} s at a time (cut it into "
            f"windows of at most {N_SAMPLES} samples)"
        )
    return torch.nn.functional.pad(samples.float(), (0, N_SAMPLES - samples.numel()))


def log_mel(
    waveform: np.ndarray | torch.Tensor, *, num_mel_bins: int = 80, name: str = "audio"
) -> torch.Tensor:
    """One 16 kHz waveform (N,), N <= 480,000, -> Whisper's input_features (num_mel_bins, 3000) float32,
    equal to ``WhisperFeatureExtractor(feature_size=num_mel_bins)(waveform, sampling_rate=16000)``."""
    samples = pad_or_refuse(waveform, name=name)  # (480000,)
    window = torch.hann_window(N_FFT)  # periodic, as Whisper's and torch's default
    stft = torch.stft(samples, N_FFT, HOP_LENGTH, window=window, return_complex=True)  # (201, 3001)
    power = stft[..., :-1].abs() ** 2  # (201, 3000)
    filters = torch.from_numpy(mel_filters(num_mel_bins)).float()  # (201, M)
    mel = filters.T @ power  # (M, 3000)
    log_spec = mel.clamp(min=1e-10).log10()
    log_spec = torch.maximum(log_spec, log_spec.max() - 8.0)  # 80 dB below the loudest bin
    return (log_spec + 4.0) / 4.0


def features(waveforms: Sequence[np.ndarray | torch.Tensor], *, num_mel_bins: int = 80) -> torch.Tensor:
    """A batch of 16 kHz waveforms -> input_features (B, num_mel_bins, 3000), each clip's own dynamic range."""
    return torch.stack(
        [log_mel(w, num_mel_bins=num_mel_bins, name=f"audio {i}") for i, w in enumerate(waveforms)]
    )


__all__ = ["N_SAMPLES", "SAMPLE_RATE", "features", "log_mel", "mel_filters", "pad_or_refuse"]
