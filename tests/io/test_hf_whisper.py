"""Hugging Face interop for Whisper: decoder logits equal to transformers' both ways, greedy ``generate``
token-equal to ``WhisperForConditionalGeneration.generate`` with its forced prompt and suppressed tokens,
exports that transformers reloads with no missing or unexpected keys, and one-line errors for bad features.

Small random Whisper models (every parameter but the fixed sinusoids perturbed) are saved with
``save_pretrained`` and imported with `zoo.from_hf`. Nothing is downloaded.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

import zoo
from zoo.io.hf import HFError

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

V, EOS, START = 120, 100, 114
LANGUAGES, TASKS, NO_TIMESTAMPS = {"<|en|>": 115, "<|fr|>": 116}, {"transcribe": 117, "translate": 118}, 119
MELS, FRAMES = 8, 32
SIZES = dict(
    vocab_size=V, num_mel_bins=MELS, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
    decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=48, max_source_positions=FRAMES // 2,
    max_target_positions=40, pad_token_id=EOS, bos_token_id=EOS, eos_token_id=EOS, decoder_start_token_id=START,
)  # fmt: skip
SUPPRESS, BEGIN_SUPPRESS = [1, 2, 3, 7, 50], [5, EOS]


@torch.no_grad()
def lively(model: torch.nn.Module) -> torch.nn.Module:
    """Weights large enough that outputs depend on the audio; norms and biases off their 1s and 0s. The
    encoder's sinusoids stay as transformers made them (a fixed table), and the end-of-text row is lifted so
    that some rows of a greedy search end early."""
    torch.manual_seed(0)
    for name, param in model.named_parameters():
        if "encoder.embed_positions" in name:
            continue
        if param.dim() >= 2:
            param.normal_(0.0, 0.3 if "embed" in name else 2.0 / math.sqrt(param.shape[1]))
        else:
            param.add_(torch.randn_like(param) * 0.1)
    model.get_decoder().embed_tokens.weight[EOS] *= 1.6
    return model.eval()


def generation_config() -> transformers.GenerationConfig:
    return transformers.GenerationConfig(
        decoder_start_token_id=START, eos_token_id=EOS, pad_token_id=EOS, bos_token_id=EOS,
        lang_to_id=LANGUAGES, task_to_id=TASKS, no_timestamps_token_id=NO_TIMESTAMPS, is_multilingual=True,
        suppress_tokens=SUPPRESS, begin_suppress_tokens=BEGIN_SUPPRESS, max_length=40,
    )  # fmt: skip


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[torch.nn.Module, zoo.ZooModel]:
    """(transformers' WhisperForConditionalGeneration, the same model imported into zoo)."""
    hf = lively(transformers.WhisperForConditionalGeneration(transformers.WhisperConfig(**SIZES)))
    hf.generation_config = generation_config()
    path = tmp_path_factory.mktemp("whisper")
    hf.save_pretrained(path)
    return hf, zoo.from_hf(path)


def features(rows: int = 2, seed: int = 1) -> torch.Tensor:
    return torch.randn(rows, MELS, FRAMES, generator=torch.Generator().manual_seed(seed))


def test_decoder_logits_match_transformers(pair: tuple[torch.nn.Module, zoo.ZooModel]) -> None:
    hf, model = pair
    assert type(model).__name__ == "AudioEncoderDecoderModel"
    assert model.num_parameters() == hf.num_parameters()
    x = features()
    ids = torch.tensor([[START, 115, 117, NO_TIMESTAMPS, 11, 12, 13], [START, 116, 118, 40, 41, 42, 43]])
    with torch.no_grad():
        expected = hf(input_features=x, decoder_input_ids=ids)
        got = model(x, decoder_input_ids=ids)
    assert (got.logits - expected.logits).abs().max() < 1e-4
    assert (got.encoder_last_hidden_state - expected.encoder_last_hidden_state).abs().max() < 1e-4
    labels = ids[:, 1:]
    with torch.no_grad():
        loss = hf(input_features=x, labels=labels).loss
    assert abs(model(x, labels=labels).loss.item() - loss.item()) < 1e-5  # shifted behind the start token


def test_a_headless_whisper_model_imports_too(tmp_path: Path) -> None:
    hf = lively(transformers.WhisperModel(transformers.WhisperConfig(**SIZES)))
    hf.save_pretrained(tmp_path)
    model = zoo.from_hf(tmp_path)
    x, ids = features(1), torch.tensor([[START, 115, 117, 20, 21]])
    with torch.no_grad():
        expected = hf(input_features=x, decoder_input_ids=ids).last_hidden_state
        got = model(x, decoder_input_ids=ids).last_hidden_state
    assert (got - expected).abs().max() < 1e-4


def test_an_export_reloads_with_no_missing_or_unexpected_keys(
    pair: tuple[torch.nn.Module, zoo.ZooModel], tmp_path: Path
) -> None:
    hf, model = pair
    zoo.to_hf(model, tmp_path)
    back, info = transformers.WhisperForConditionalGeneration.from_pretrained(
        tmp_path, output_loading_info=True
    )
    assert info["missing_keys"] == set() and info["unexpected_keys"] == set()
    x, ids = features(), torch.tensor([[START, 115, 117, NO_TIMESTAMPS, 3], [START, 116, 118, 9, 8]])
    with torch.no_grad():
        assert (back(input_features=x, decoder_input_ids=ids).logits - hf(input_features=x, decoder_input_ids=ids).logits).abs().max() < 1e-6  # fmt: skip
    assert zoo.from_hf(tmp_path).spec.model_dump(exclude={"name", "source"}) == model.spec.model_dump(
        exclude={"name", "source"}
    )


def test_greedy_generate_is_token_equal_to_transformers(pair: tuple[torch.nn.Module, zoo.ZooModel]) -> None:
    hf, model = pair
    x = features(4, seed=3)
    with torch.no_grad():
        expected = hf.generate(
            input_features=x, language="fr", task="translate", max_new_tokens=24, return_dict_in_generate=True
        ).sequences  # (B, 4 + new): the prompt [start, <|fr|>, translate, notimestamps], then the tokens
    got = model.generate(
        x,
        max_new_tokens=24,
        decoder_prompt_ids=[LANGUAGES["<|fr|>"], TASKS["translate"], NO_TIMESTAMPS],
        suppress_tokens=SUPPRESS,
        begin_suppress_tokens=BEGIN_SUPPRESS,
    )
    assert got.tolist() == expected.tolist()
    assert (got[:, 4:] == EOS).any(), "no row ended: the test would not see end-of-text handling"
    assert not torch.isin(got[:, 4:], torch.tensor(SUPPRESS)).any()
    assert not torch.isin(got[:, 4], torch.tensor(BEGIN_SUPPRESS)).any()


def test_features_of_another_shape_are_one_line_errors(pair: tuple[torch.nn.Module, zoo.ZooModel]) -> None:
    _, model = pair
    ids = torch.tensor([[START]])
    wanted = rf"input_features must be log-mel features of shape \(batch, {MELS}, {FRAMES}\)"
    with pytest.raises(
        ValueError, match=r"^AudioEncoderDecoderModel.forward: " + wanted + r".*got \(1, 8, 30\)$"
    ):
        model(torch.randn(1, MELS, 30), decoder_input_ids=ids)
    with pytest.raises(ValueError, match=r"^generate: " + wanted):
        model.generate(torch.randint(0, 5, (1, 7)))
    with pytest.raises(ValueError, match="take no attention_mask"):
        model(features(1), attention_mask=torch.ones(1, FRAMES), decoder_input_ids=ids)


def test_the_fixed_positions_are_whispers_sinusoids() -> None:
    from transformers.models.whisper.modeling_whisper import sinusoids

    spec = zoo.preset("whisper-tiny").override(**{"encoder.embedding.max_positions": 64, "max_positions": 8})
    table = zoo.build(spec, device="cpu").source_embed.positions
    assert not table.requires_grad
    assert (table - sinusoids(64, 384)).abs().max() < 1e-5


def test_a_model_without_the_audio_front_end_is_refused_as_whisper() -> None:
    with pytest.raises(HFError, match="whisper cannot express"):
        zoo.to_hf(zoo.build("bart-tiny"), "unused", model_type="whisper")


def test_a_saved_model_loads_with_its_table_still_frozen(
    pair: tuple[torch.nn.Module, zoo.ZooModel], tmp_path: Path
) -> None:
    _, model = pair
    assert not model.source_embed.positions.requires_grad  # from_hf keeps it frozen
    zoo.save(model, tmp_path / "saved")
    back = zoo.load(tmp_path / "saved")
    assert not back.source_embed.positions.requires_grad
    assert back.num_parameters(trainable_only=True) == model.num_parameters() - FRAMES // 2 * 32
    x, ids = features(1), torch.tensor([[START, 115, 117]])
    with torch.no_grad():
        assert torch.equal(back(x, decoder_input_ids=ids).logits, model(x, decoder_input_ids=ids).logits)
