"""Tokenizer <-> spec wiring: the vocabulary comes from the tokenizer; disagreeing special ids are errors."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models, pre_tokenizers

from zoo.io.tokenizer import Tokenizer, train_tokenizer
from zoo.training import setup
from zoo.training.config import ConfigError, TrainConfig


def _wire(config: TrainConfig) -> tuple[setup.Tokenizers, object]:
    spec = setup.base_spec(config)
    task = setup.resolve_task(config, spec)
    tokenizers = setup.load_or_train_tokenizers(config, task=task)
    return tokenizers, setup.wire_spec(spec, tokenizers, config, task=task)


def test_trained_tokenizer_sets_vocab_size_and_special_ids(make_config: Callable[..., TrainConfig]) -> None:
    tokenizers, spec = _wire(make_config())
    assert spec.vocab_size == tokenizers.target.vocab_size < 9000  # the preset's 9000 was a placeholder
    assert (spec.pad_token_id, spec.bos_token_id, spec.eos_token_id) == (0, 1, 2)
    assert spec.source_vocab_size is None


def test_separate_vocabularies_give_the_source_its_own_size(make_config: Callable[..., TrainConfig]) -> None:
    tokenizers, spec = _wire(make_config(**{"tokenizer.shared": False}))
    assert tokenizers.source is not None
    assert spec.source_vocab_size == tokenizers.source.vocab_size
    assert spec.vocab_size == tokenizers.target.vocab_size
    assert tokenizers.source.token_to_id("▁cat") is not None and tokenizers.target.token_to_id("▁cat") is None


def _foreign_tokenizer(path: Path, words: list[str]) -> Path:
    """A word-level tokenizer whose specials are BERT's, at other ids than zoo's 0-4."""
    vocab = {w: i for i, w in enumerate(["the", "[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]", *words])}
    tok = HFTokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    Tokenizer(tok).save(path)
    return path


def test_tokenizer_whose_special_tokens_differ_from_the_spec_is_refused(
    make_config: Callable[..., TrainConfig], tmp_path: Path
) -> None:
    path = _foreign_tokenizer(tmp_path / "bert.json", ["cat", "dog"])
    with pytest.raises(
        ValueError, match=r"pad token '\[PAD\]' has id 4 in the tokenizer but pad_token_id is 0"
    ):
        _wire(make_config(**{"tokenizer.path": str(path)}))
    # Saying the tokenizer's ids in the spec makes them agree.
    ids = {"pad_token_id": 4, "bos_token_id": 2, "eos_token_id": 3}
    _, spec = _wire(make_config(**{"tokenizer.path": str(path), "model.overrides": ids}))
    assert (spec.pad_token_id, spec.eos_token_id, spec.vocab_size) == (4, 3, 8)


def test_overridden_vocab_size_smaller_than_the_tokenizer_is_refused(
    make_config: Callable[..., TrainConfig],
) -> None:
    with pytest.raises(ValueError, match="larger ids would index past the embedding"):
        _wire(make_config(**{"model.overrides": {"vocab_size": 50}}))


def test_task_must_fit_the_model_family(make_config: Callable[..., TrainConfig]) -> None:
    with pytest.raises(
        ConfigError, match="task causal_lm needs a decoder model, but the model is encoder-decoder"
    ):
        _wire(make_config(task="causal_lm"))


def test_data_max_length_cannot_exceed_max_positions(make_config: Callable[..., TrainConfig]) -> None:
    config = make_config(**{"data.max_length": 65})
    with pytest.raises(ConfigError, match=r"data.max_length \(65\) exceeds the model's max_positions \(64\)"):
        setup.max_length(config, setup.base_spec(config))


def test_missing_tokenizer_file_is_file_not_found(
    make_config: Callable[..., TrainConfig], tmp_path: Path
) -> None:
    with pytest.raises(FileNotFoundError, match="tokenizer file not found"):
        _wire(make_config(**{"tokenizer.path": str(tmp_path / "none.json")}))


def test_training_needs_the_tokens_its_task_uses(
    make_config: Callable[..., TrainConfig], tmp_path: Path
) -> None:
    lm = tmp_path / "lm.txt"
    lm.write_text("the cat sees the dog\n" * 20, encoding="utf-8")
    tokenizer = train_tokenizer([lm], kind="bpe", vocab_size=50)
    assert tokenizer.mask_id == 4  # ours always has one; a foreign one without [MASK] cannot do MLM
    path = _foreign_tokenizer(tmp_path / "nomask.json", ["cat"])
    raw = HFTokenizer.from_file(str(path))
    vocab = {k: v for k, v in raw.get_vocab().items() if k != "[MASK]"}
    HFTokenizer(models.WordLevel(vocab, unk_token="[UNK]")).save(str(path))
    config = make_config(
        model={"preset": "bert-tiny", "overrides": {"heads.mlm": {}, "pad_token_id": 4}},
        data={"train": str(lm)},
        task=None,  # the model's own: masked_lm
        **{"tokenizer.path": str(path)},
    )
    with pytest.raises(ConfigError, match=r"training needs a mask token"):
        _wire(config)
