"""`zoo.transcribe` and ``zoo transcribe`` give the tokens of transformers' Whisper ``generate`` on the same
random weights and the same speech: the folder's generation_config.json prompt (a given language, or the one
detected from the audio), its suppressed tokens, and the text its tokenizer.json decodes. The settings travel
with the model: a converted zoo folder and its export give the same tokens; a model without them is refused."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

import zoo
from zoo.audio import read_wav, transcribe
from zoo.cli import main
from zoo.io.generation_file import set_generation_file
from zoo.io.hf.generation_config import HFGenerationSettings

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")
transformers.logging.set_verbosity_error()

SPEECH = Path(__file__).parent / "data" / "speech.wav"
V, EOS, START = 120, 100, 114
SPECIALS = {EOS: "<|endoftext|>", START: "<|startoftranscript|>", 115: "<|en|>", 116: "<|fr|>",
            117: "<|transcribe|>", 118: "<|translate|>", 119: "<|notimestamps|>"}  # fmt: skip


def tokenizer() -> tokenizers.Tokenizer:
    """Words w0 .. w119, the special tokens above at their ids (a WordLevel vocabulary)."""
    vocab = {SPECIALS.get(i, f"w{i}"): i for i in range(V)}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="w0"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens([tokenizers.AddedToken(t, special=True) for t in SPECIALS.values()])
    return tok


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    """A random Whisper of real input size (80 mel bins x 3000 frames), saved with its tokenizer and a
    multilingual generation config whose forced prompt leaves the language open (as openai's)."""
    config = transformers.WhisperConfig(
        vocab_size=V, num_mel_bins=80, d_model=32, encoder_layers=1, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=48, max_source_positions=1500,
        max_target_positions=32, pad_token_id=EOS, bos_token_id=EOS, eos_token_id=EOS, decoder_start_token_id=START,
    )  # fmt: skip
    hf = transformers.WhisperForConditionalGeneration(config)
    torch.manual_seed(0)
    with torch.no_grad():
        for name, param in hf.named_parameters():
            if "encoder.embed_positions" in name:
                continue
            if param.dim() >= 2:
                param.normal_(0.0, 0.5 if "embed" in name else 2.0 / math.sqrt(param[0].numel()))
            else:
                param.add_(torch.randn_like(param) * 0.1)
    hf.generation_config = transformers.GenerationConfig(
        decoder_start_token_id=START, eos_token_id=EOS, pad_token_id=EOS, bos_token_id=EOS, max_length=32,
        lang_to_id={"<|en|>": 115, "<|fr|>": 116}, task_to_id={"transcribe": 117, "translate": 118},
        no_timestamps_token_id=119, is_multilingual=True, forced_decoder_ids=[[1, None], [2, 117], [3, 119]],
        suppress_tokens=[1, 2, 3, 60], begin_suppress_tokens=[EOS, 5],
    )  # fmt: skip
    path = tmp_path_factory.mktemp("whisper")
    hf.eval().save_pretrained(path)
    tokenizer().save(str(path / "tokenizer.json"))
    return path, hf


def reference(hf: torch.nn.Module, **kwargs: object) -> list[int]:
    """transformers' greedy tokens after the prompt, up to the end-of-text token."""
    fe = transformers.WhisperFeatureExtractor()
    x = torch.from_numpy(fe(read_wav(SPEECH), sampling_rate=16000, return_tensors="np").input_features)
    with torch.no_grad():
        ids = hf.generate(input_features=x, return_dict_in_generate=True, **kwargs).sequences[0, 4:].tolist()
    return ids[: ids.index(EOS)] if EOS in ids else ids


def test_a_given_language_gives_transformers_tokens(folder: tuple[Path, torch.nn.Module]) -> None:
    path, hf = folder
    result = transcribe(path, SPEECH, language="fr", task="translate")
    assert result.tokens == reference(hf, language="fr", task="translate")
    assert result.language == "fr"
    assert result.text == " ".join(f"w{t}" for t in result.tokens)  # tokenizer.json, specials skipped


def test_the_detected_language_is_transformers(folder: tuple[Path, torch.nn.Module]) -> None:
    path, hf = folder
    result = transcribe(str(path), read_wav(SPEECH))  # samples instead of a file
    assert result.tokens == reference(hf)
    fe = transformers.WhisperFeatureExtractor()
    x = torch.from_numpy(fe(read_wav(SPEECH), sampling_rate=16000, return_tensors="np").input_features)
    detected = int(hf.detect_language(input_features=x)[0])
    assert result.language == {115: "en", 116: "fr"}[detected]


def test_the_cli_prints_the_text(
    folder: tuple[Path, torch.nn.Module], capsys: pytest.CaptureFixture[str]
) -> None:
    path, _ = folder
    assert (
        main(["transcribe", str(path), str(SPEECH), "--language", "en", "--tokens", "--device", "cpu"]) == 0
    )
    text, tokens = capsys.readouterr().out.splitlines()
    expected = transcribe(path, SPEECH, language="en")
    assert text == expected.text and tokens.split() == [str(t) for t in expected.tokens]


def test_a_text_model_is_refused_in_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    zoo.save(zoo.build("bart-tiny"), tmp_path / "bart", tokenizer=zoo.Tokenizer(tokenizer()))
    assert main(["transcribe", str(tmp_path / "bart"), str(SPEECH)]) == 2
    assert "transcribe needs an audio model" in capsys.readouterr().err


def test_serve_refuses_an_audio_model_in_one_line(
    folder: tuple[Path, torch.nn.Module], capsys: pytest.CaptureFixture[str]
) -> None:
    path, _ = folder
    assert main(["serve", str(path), "--device", "cpu", "--port", "0"]) == 2
    assert "an audio model (it reads input_features); zoo serve has no /v1/audio/transcriptions" in (
        capsys.readouterr().err
    )


# -- the generation settings travel with the model: zoo.save, zoo.load, zoo.to_hf ----------------------------


def converted(path: Path, out: Path) -> Path:
    """The Hugging Face folder as a zoo checkpoint, as ``zoo convert --from-hf`` makes it."""
    assert main(["convert", "--from-hf", str(path), "--out", str(out)]) == 0
    return out


def test_a_converted_folder_transcribes_as_the_hugging_face_folder(
    folder: tuple[Path, torch.nn.Module], tmp_path: Path
) -> None:
    path, hf = folder
    out = converted(path, tmp_path / "zoo")
    assert (out / "generation_config.json").is_file() and not (out / "config.json").exists()
    saved = zoo.save(zoo.from_hf(path), tmp_path / "saved", tokenizer=zoo.load_tokenizer(path))
    for zoo_folder in (out, saved):
        assert transcribe(zoo_folder, SPEECH).tokens == transcribe(path, SPEECH).tokens == reference(hf)
        fr = transcribe(zoo_folder, SPEECH, language="fr", task="translate")
        assert fr.tokens == reference(hf, language="fr", task="translate") and fr.language == "fr"
    # without the prompt and the suppressed tokens the tokens differ: the comparison above can fail
    bare = transcribe(zoo.load(out), SPEECH, settings=HFGenerationSettings())
    assert bare.tokens != reference(hf)


def test_an_export_of_a_converted_folder_generates_transformers_tokens(
    folder: tuple[Path, torch.nn.Module], tmp_path: Path
) -> None:
    path, hf = folder
    zoo.to_hf(zoo.load(converted(path, tmp_path / "zoo")), tmp_path / "hf")
    back = transformers.WhisperForConditionalGeneration.from_pretrained(tmp_path / "hf").eval()
    assert back.generation_config.suppress_tokens == hf.generation_config.suppress_tokens
    assert back.generation_config.lang_to_id == hf.generation_config.lang_to_id
    assert reference(back) == reference(hf)
    assert reference(back, language="fr", task="translate") == reference(hf, language="fr", task="translate")


def test_a_model_without_generation_settings_is_refused_in_one_line(
    folder: tuple[Path, torch.nn.Module], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, _ = folder
    out = converted(path, tmp_path / "zoo")
    model = zoo.load(out)
    set_generation_file(model, None)  # as a model built or trained from scratch carries none
    zoo.save(model, out)
    assert not (out / "generation_config.json").exists()  # the earlier save's settings are not this model's
    assert main(["transcribe", str(out), str(SPEECH)]) == 2
    err = capsys.readouterr().err
    assert "no generation_config.json (Whisper's language/task prompt and suppressed tokens)" in err
    assert len(err.strip().splitlines()) == 1
    with pytest.raises(ValueError, match=r"no generation_config\.json"):
        transcribe(zoo.load(out), SPEECH)
    # {} asks for no prompt and no suppressed tokens, explicitly
    (out / "generation_config.json").write_text("{}")
    plain = transcribe(out, SPEECH)
    assert plain.tokens == transcribe(model, SPEECH, settings=HFGenerationSettings()).tokens
    assert plain.language is None
