"""`Tokenizer.save_pretrained`: a folder that `transformers.AutoTokenizer` loads to give zoo's ids."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models, pre_tokenizers, processors

import zoo
from zoo.demo import toy_corpus
from zoo.io.tokenizer import Tokenizer, train_tokenizer

transformers = pytest.importorskip("transformers")

TEXTS = [
    "the big dog chased three cats in the park",
    "고양이가 생선을 먹는다",
    "a cat",
    "the dog , the cat .",
]
CALLS: list[dict[str, Any]] = [
    {},
    {"padding": True, "return_tensors": "pt"},
    {"padding": "max_length", "max_length": 16, "padding_side": "left"},
    {"truncation": True, "max_length": 4, "padding": True},
    {"truncation": True},  # max_length: the model_max_length written to tokenizer_config.json
    {"add_special_tokens": False},
]


@pytest.fixture(scope="module")
def corpus_lines() -> list[str]:
    corpus = toy_corpus(seed=0, train_size=400, valid_size=10)
    return [text for pair in corpus.train for text in pair]


@pytest.fixture(scope="module", params=["bpe", "wordpiece", "unigram"])
def exported(
    request: pytest.FixtureRequest, corpus_lines: list[str], tmp_path_factory: pytest.TempPathFactory
) -> tuple[Tokenizer, Path]:
    tok = train_tokenizer(iter(corpus_lines), kind=request.param, vocab_size=400)
    folder = tmp_path_factory.mktemp(request.param) / "hf"
    folder.mkdir()
    # A model folder: without tokenizer_config.json transformers would pick GPT-2's tokenizer from this.
    (folder / "config.json").write_text(json.dumps({"model_type": "gpt2"}), encoding="utf-8")
    assert tok.save_pretrained(folder, model_max_length=6) == folder
    return tok, folder


def as_lists(encoded: Any) -> tuple[list, list]:
    ids, mask = encoded["input_ids"], encoded["attention_mask"]
    if isinstance(ids, torch.Tensor):
        return ids.tolist(), mask.tolist()
    return ids, mask


@pytest.mark.parametrize(
    "kwargs", CALLS, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()) or "plain"
)
def test_auto_tokenizer_on_the_export_gives_zoos_ids(exported, kwargs: dict[str, Any]) -> None:
    tok, folder = exported
    theirs = transformers.AutoTokenizer.from_pretrained(folder)
    ours = Tokenizer.from_file(folder)  # as a user loads the folder: model_max_length comes along
    assert as_lists(theirs(TEXTS, **kwargs)) == as_lists(ours(TEXTS, **kwargs))
    if kwargs != {"truncation": True}:
        assert as_lists(tok(TEXTS, **kwargs)) == as_lists(ours(TEXTS, **kwargs))
    assert sorted(theirs(TEXTS[0])) == ["attention_mask", "input_ids"]  # no token_type_ids for zoo models


def test_export_frames_with_eos_and_decodes_the_same(exported) -> None:
    tok, folder = exported
    theirs = transformers.AutoTokenizer.from_pretrained(folder)
    assert theirs(TEXTS)["input_ids"] == tok.encode_batch(TEXTS)  # zoo's [*ids, eos]
    assert (theirs.pad_token_id, theirs.bos_token_id, theirs.eos_token_id) == (
        tok.pad_id,
        tok.bos_id,
        tok.eos_id,
    )
    assert (theirs.unk_token_id, theirs.mask_token_id, theirs.model_max_length) == (
        tok.unk_id,
        tok.mask_id,
        6,
    )
    for text in TEXTS:
        ids = tok.encode(text)
        assert theirs.decode(ids, skip_special_tokens=True) == tok.decode(ids)
    assert tok.decode(tok.encode(TEXTS[1])) == TEXTS[1]  # (the toy corpus has no "," or ".": those are unk)


def test_export_writes_the_three_files_and_reloads_in_zoo(exported) -> None:
    tok, folder = exported
    assert sorted(p.name for p in folder.iterdir()) == [
        "config.json",
        "special_tokens_map.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ]  # no temporary file left behind
    config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast" and config["model_max_length"] == 6
    specials = {"pad_token": "<pad>", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
    specials["mask_token"] = "<mask>"
    assert json.loads((folder / "special_tokens_map.json").read_text(encoding="utf-8")) == specials
    assert {k: config[k] for k in specials} == specials
    reloaded = Tokenizer.from_file(folder)
    assert reloaded.model_max_length == 6
    assert reloaded(TEXTS, padding=True) == tok(TEXTS, padding=True)
    assert reloaded.encode_batch(TEXTS, add_bos=True) == tok.encode_batch(TEXTS, add_bos=True)


def test_a_failed_write_keeps_the_previous_file_and_leaves_no_temporary(
    exported, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tok, _ = exported
    tok.save_pretrained(tmp_path)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}

    def fail(src: str, dst: str) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError, match="disk full"):
        tok.save_pretrained(tmp_path, model_max_length=99)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_foreign_post_processor_and_segment_ids_are_kept(tmp_path: Path) -> None:
    vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "hello", "world"])}
    hf = HFTokenizer(models.WordPiece(vocab=vocab, unk_token="[UNK]"))
    hf.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    hf.post_processor = processors.BertProcessing(("[SEP]", 3), ("[CLS]", 2))
    hf.add_special_tokens(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
    tok = Tokenizer(hf)
    tok.save_pretrained(tmp_path)
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path)
    assert (
        theirs(["hello world", "world"])["input_ids"]
        == [[2, 5, 6, 3], [2, 6, 3]]
        == tok(["hello world", "world"])["input_ids"]
    )
    assert "token_type_ids" in theirs("hello")  # BERT-style segments: the model reads them


def test_bad_model_max_length_is_rejected(exported, tmp_path: Path) -> None:
    tok, _ = exported
    with pytest.raises(ValueError, match="model_max_length must be an int >= 1 or None, got 0"):
        tok.save_pretrained(tmp_path, model_max_length=0)


def test_exported_gpt2_runs_in_transformers_on_the_auto_tokenizer_batch(corpus_lines, tmp_path: Path) -> None:
    tok = train_tokenizer(iter(corpus_lines), kind="bpe", vocab_size=400)
    torch.manual_seed(0)
    model = zoo.build("gpt2-tiny").eval()
    zoo.to_hf(model, tmp_path, tokenizer=tok)  # weights, config and tokenizer files in one call
    assert json.loads((tmp_path / "tokenizer_config.json").read_text())["model_max_length"] == 128
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path)
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    batch = theirs(TEXTS, padding=True, return_tensors="pt")
    ours = zoo.load_tokenizer(tmp_path)(
        TEXTS, padding=True, return_tensors="pt"
    )  # zoo reads the framing back
    assert torch.equal(batch["input_ids"], ours["input_ids"])
    first = batch["input_ids"][0][batch["attention_mask"][0].bool()].tolist()
    assert first == tok.encode(TEXTS[0], add_bos=True, add_eos=False)  # a decoder's prompt, as zoo generates
    with torch.no_grad():
        expected = hf(**batch).logits  # everything the tokenizer returns goes in, as users write it
        got = model(ours["input_ids"], attention_mask=ours["attention_mask"]).logits
    real = ours["attention_mask"].bool()
    torch.testing.assert_close(got[real], expected[real], atol=1e-4, rtol=1e-4)
