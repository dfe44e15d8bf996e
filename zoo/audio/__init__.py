"""Audio in: WAV files (`read_wav`), Whisper's log-mel features (`log_mel`) and `transcribe`."""

from zoo.audio.features import features, log_mel, mel_filters
from zoo.audio.transcribe import Transcription, detect_language, transcribe
from zoo.audio.wav import read_wav

__all__ = ["Transcription", "detect_language", "features", "log_mel", "mel_filters", "read_wav", "transcribe"]
