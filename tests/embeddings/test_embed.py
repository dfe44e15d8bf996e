"""`zoo.embed` against an independent computation: transformers' BertModel run on each text alone (no
padding, no batching), pooled by the textbook formula. Covers the folder's settings (pooling, normalisation,
max length, lowercasing), the arguments that override them, the order of the texts, and the errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from embed_support import MAX_POSITIONS, TEXTS, make_st_folder, wordpiece, write_json
from tokenizers import processors

import zoo
from zoo.embeddings import Embedder, EmbeddingConfigError, read_folder_settings
from zoo.io.tokenizer import Tokenizer

transformers = pytest.importorskip("transformers")


def by_formula(hidden: torch.Tensor, mode: str) -> torch.Tensor:
    """(T, C) token vectors of one text, unpadded -> (C,)."""
    T = hidden.shape[0]
    weights = torch.arange(1, T + 1, dtype=hidden.dtype).unsqueeze(1)
    return {
        "mean": lambda: hidden.mean(0),
        "mean_sqrt_len_tokens": lambda: hidden.sum(0) / T**0.5,
        "weightedmean": lambda: (hidden * weights).sum(0) / weights.sum(),
        "max": lambda: hidden.max(0).values,
        "cls": lambda: hidden[0],
        "lasttoken": lambda: hidden[-1],
    }[mode]()


@torch.no_grad()
def reference(
    folder: Path,
    texts: list[str],
    modes: tuple[str, ...],
    *,
    max_length: int,
    normalize: bool,
    lower: bool = False,
) -> np.ndarray:
    """Each text alone through transformers' BertModel, truncated by the tokenizers library itself."""
    model = transformers.BertModel.from_pretrained(folder).eval()
    tok = wordpiece()
    tok.enable_truncation(max_length=max_length)
    rows = []
    for text in texts:
        ids = torch.tensor([tok.encode(text.lower() if lower else text).ids])
        hidden = model(input_ids=ids).last_hidden_state[0]  # (T, C)
        vector = torch.cat([by_formula(hidden, mode) for mode in modes])
        rows.append(torch.nn.functional.normalize(vector, dim=0) if normalize else vector)
    return torch.stack(rows).numpy()


def test_a_plain_folder_gives_mean_pooling_unnormalised_cut_at_the_models_positions(hf_folder: Path) -> None:
    vectors = zoo.embed(hf_folder, TEXTS, batch_size=3)
    assert vectors.shape == (len(TEXTS), 32) and vectors.dtype == np.float32
    expected = reference(hf_folder, TEXTS, ("mean",), max_length=MAX_POSITIONS, normalize=False)
    np.testing.assert_allclose(vectors, expected, atol=1e-5, rtol=0)


def test_a_sentence_transformers_folder_sets_pooling_normalisation_length_and_case(
    sbert_folder: Path,
) -> None:
    settings = read_folder_settings(sbert_folder)
    assert settings.pooling == ("cls", "mean") and settings.normalize and settings.max_length == 8
    vectors = zoo.embed(sbert_folder, TEXTS, batch_size=2)
    expected = reference(sbert_folder, TEXTS, ("cls", "mean"), max_length=8, normalize=True, lower=True)
    assert vectors.shape == (len(TEXTS), 64)
    np.testing.assert_allclose(vectors, expected, atol=1e-5, rtol=0)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-6)
    np.testing.assert_allclose(vectors[4], vectors[0], atol=1e-6)  # "HELLO WORLD" lowercased is "hello world"


def test_arguments_override_the_folder(sbert_folder: Path) -> None:
    vectors = zoo.embed(sbert_folder, TEXTS, pooling="max", normalize=False, max_length=5)
    expected = reference(sbert_folder, TEXTS, ("max",), max_length=5, normalize=False, lower=True)
    np.testing.assert_allclose(vectors, expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("mode", ["mean", "cls", "max", "lasttoken", "mean_sqrt_len_tokens", "weightedmean"])
def test_each_pooling_mode_equals_its_formula_on_unpadded_texts(hf_folder: Path, mode: str) -> None:
    vectors = zoo.embed(hf_folder, TEXTS, pooling=mode, max_length=12, batch_size=4)
    expected = reference(hf_folder, TEXTS, (mode,), max_length=12, normalize=False)
    np.testing.assert_allclose(vectors, expected, atol=1e-5, rtol=0)


def test_the_order_of_the_texts_is_kept_whatever_the_batch_size(hf_folder: Path) -> None:
    embedder = Embedder.load(hf_folder)
    texts = [*TEXTS, *reversed(TEXTS)]
    whole = embedder(texts, batch_size=64)
    np.testing.assert_allclose(whole[: len(TEXTS)], whole[len(TEXTS) :][::-1], atol=1e-6)
    for size in (1, 3):
        np.testing.assert_allclose(embedder(texts, batch_size=size), whole, atol=1e-5)
    seen: list[int] = []
    embedder(texts, batch_size=4, on_batch=seen.append)
    assert seen == [4, 4, 4, 2]
    assert embedder([]).shape == (0, 32)


def test_a_loaded_model_reads_the_folder_it_came_from(sbert_folder: Path) -> None:
    model = zoo.from_hf(sbert_folder)
    np.testing.assert_array_equal(zoo.embed(model, TEXTS), zoo.embed(sbert_folder, TEXTS))


def test_a_prompt_left_out_of_the_pooling(hf_folder: Path, tmp_path: Path) -> None:
    """``default_prompt_name`` puts its prompt first; ``include_prompt: false`` pools only after it."""
    folder = make_st_folder(
        hf_folder,
        tmp_path / "prompted",
        pooling={"pooling_mode": "mean", "include_prompt": False},
        max_seq_length=None,
        lowercase=False,
    )
    write_json(
        folder / "config_sentence_transformers.json",
        {"prompts": {"q": "the man : "}, "default_prompt_name": "q"},
    )
    vectors = zoo.embed(folder, ["hello world", "a guitar"])
    model = transformers.BertModel.from_pretrained(folder).eval()
    tok = wordpiece()
    skip = len(tok.encode("the man : ").ids) - 1  # [CLS] and the prompt's tokens; its [SEP] is not there
    for vector, text in zip(vectors, ["hello world", "a guitar"]):
        with torch.no_grad():
            hidden = model(input_ids=torch.tensor([tok.encode("the man : " + text).ids])).last_hidden_state[0]
        expected = torch.nn.functional.normalize(hidden[skip:].mean(0), dim=0)
        np.testing.assert_allclose(vector, expected.numpy(), atol=1e-5)


def test_a_decoder_embeds_with_its_last_token(tmp_path: Path) -> None:
    """A causal model, right-padded in batches: each text's last real token, as if it ran alone."""
    model = zoo.build("llama-tiny").eval()
    tok = Tokenizer(wordpiece())
    vectors = Embedder(model, tok, pooling=("lasttoken",))(TEXTS, batch_size=3)
    for vector, text in zip(vectors, TEXTS):
        ids = torch.tensor([tok([text])["input_ids"][0]])
        with torch.no_grad():
            expected = model(ids).last_hidden_state[0, -1]
        np.testing.assert_allclose(vector, expected.numpy(), atol=1e-5)


def test_bad_input_is_one_clear_error(hf_folder: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="wrap it in a list"):
        zoo.embed(hf_folder, "one text")
    with pytest.raises(ValueError, match="pooling must be one of"):
        zoo.embed(hf_folder, TEXTS, pooling="median")
    with pytest.raises(ValueError, match=r"max_length \(41\) is longer than the model's 40 positions"):
        zoo.embed(hf_folder, TEXTS, max_length=41)
    with pytest.raises(ValueError, match="pass tokenizer="):
        zoo.embed(zoo.build("llama-tiny"), TEXTS)
    bare = wordpiece()
    bare.post_processor = processors.ByteLevel(trim_offsets=False)  # frames nothing: "" has no token
    with pytest.raises(ValueError, match=r"texts\[1\] \(''\) has no tokens"):
        Embedder(zoo.from_hf(hf_folder), Tokenizer(bare))(["a man", ""])
    dense = tmp_path / "dense"
    shutil.copytree(hf_folder, dense)
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"},
    ]
    (dense / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(
        EmbeddingConfigError, match=r"modules.json: module 2 is 'sentence_transformers.models.Dense'"
    ):
        zoo.embed(dense, TEXTS)
    (dense / "modules.json").write_text(json.dumps([modules[0], {**modules[1], "path": "../x"}]))
    with pytest.raises(EmbeddingConfigError, match="must be a folder inside"):
        zoo.embed(dense, TEXTS)


def test_texts_of_a_batch_share_rows_when_packed() -> None:
    """The docstring's picture: lengths 9, 5, 4, 3 -> three rows of 9 (a | b c | d), pads in d's document."""
    from zoo.embeddings import packing

    layout = packing.packed(torch.tensor([9, 5, 4, 3]))
    assert (layout.rows, layout.width) == (3, 9)
    ids, mask, documents = packing.model_inputs(layout, torch.arange(1, 22), pad_id=0, documents=True)
    assert ids.tolist() == [list(range(1, 10)), list(range(10, 19)), [19, 20, 21, 0, 0, 0, 0, 0, 0]]
    assert mask.tolist() == [[1] * 9, [1] * 9, [1] * 3 + [0] * 6]
    assert documents is not None and documents.tolist() == [[0] * 9, [1] * 5 + [2] * 4, [3] * 9]


def test_packed_and_padded_batches_give_the_same_vectors(hf_folder: Path) -> None:
    for model in (zoo.from_hf(hf_folder), zoo.build("llama-tiny")):
        embedder = Embedder(model, Tokenizer(wordpiece()), pooling=("mean", "lasttoken"), max_length=32)
        assert embedder.packable
        packed = embedder(TEXTS, batch_size=8)
        embedder.packable = False
        np.testing.assert_allclose(packed, embedder(TEXTS, batch_size=8), atol=1e-5)
