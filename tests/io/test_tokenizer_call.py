"""`Tokenizer.__call__`, the batch interface of transformers: padding, truncation, tensors, special tokens,
and the same ids as `transformers.AutoTokenizer` for foreign files (stored padding and truncation ignored)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, normalizers, pre_tokenizers, processors, trainers

from zoo.demo import toy_corpus
from zoo.io.tokenizer import Tokenizer, train_tokenizer

transformers = pytest.importorskip("transformers")

TEXTS = [
    "A man is playing a guitar.",
    "hello world!",
    "the man is playing the guitar and the world says hello to the man " * 2,
    "unknown words: zebra quokka",
]
WORDS = [
    *("the", "a", "man", "is", "play", "##ing", "guitar", ".", "hello", "world", "!", "and", "says", "to"),
    *("un", "##known", "words", ":", "ze", "##bra"),
]
# Each row of the parity test: the arguments given to both tokenizers.
CALLS: list[dict[str, Any]] = [
    {},
    {"padding": True},
    {"padding": "longest", "padding_side": "left"},
    {"padding": "max_length", "max_length": 20},
    {"truncation": True},
    {"truncation": True, "max_length": 6, "padding": True},
    {"max_length": 5},  # truncates: transformers' default when there is no padding
    {"add_special_tokens": False, "padding": True},
    {"padding": True, "return_tensors": "pt"},
]


@pytest.fixture(scope="module")
def zoo_bpe() -> Tokenizer:
    corpus = toy_corpus(seed=0, train_size=300, valid_size=10)
    return train_tokenizer(iter([t for pair in corpus.train for t in pair]), kind="bpe", vocab_size=400)


def bert_like(*, pad_to: int, cut_at: int) -> HFTokenizer:
    """A small BERT-style WordPiece: [CLS] … [SEP] template, padding and truncation stored in the file."""
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    vocab = {token: i for i, token in enumerate([*specials, *WORDS])}
    tok = HFTokenizer(models.WordPiece(vocab=vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", 2), ("[SEP]", 3)],
    )
    tok.add_special_tokens(specials)
    tok.enable_padding(length=pad_to, pad_id=0, pad_token="[PAD]")  # as sentence-transformers ships them
    tok.enable_truncation(max_length=cut_at)
    return tok


def byte_level() -> HFTokenizer:
    """A GPT-2-style byte-level BPE (its post-processor adds no special tokens)."""
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<|endoftext|>"],
        show_progress=False,
    )
    tok.train_from_iterator(TEXTS * 3, trainer=trainer)
    return tok


def write_folder(folder: Path, tok: HFTokenizer, config: dict[str, Any]) -> Path:
    folder.mkdir()
    tok.save(str(folder / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", **config}
    (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def bert_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # The file pads to 16 and cuts at 16; transformers' limit comes from tokenizer_config.json (24).
    config = {"pad_token": "[PAD]", "cls_token": "[CLS]", "sep_token": "[SEP]", "model_max_length": 24}
    return write_folder(tmp_path_factory.mktemp("bert") / "tok", bert_like(pad_to=16, cut_at=16), config)


@pytest.fixture(scope="module")
def gpt2_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    eot = "<|endoftext|>"
    config = {"bos_token": eot, "eos_token": eot, "pad_token": eot, "model_max_length": 12}
    return write_folder(tmp_path_factory.mktemp("gpt2") / "tok", byte_level(), config)


def as_lists(encoded: Any) -> tuple[list, list]:
    ids, mask = encoded["input_ids"], encoded["attention_mask"]
    if isinstance(ids, torch.Tensor):
        assert ids.dtype == mask.dtype == torch.int64
        return ids.tolist(), mask.tolist()
    return list(ids), list(mask)


# --- parity with transformers -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs", CALLS, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()) or "plain"
)
@pytest.mark.parametrize("which", ["bert_folder", "gpt2_folder"])
def test_call_gives_the_ids_of_transformers_auto_tokenizer(
    which: str, kwargs: dict[str, Any], request: pytest.FixtureRequest
) -> None:
    folder = request.getfixturevalue(which)
    theirs = transformers.AutoTokenizer.from_pretrained(folder)
    ours = Tokenizer.from_file(folder)
    assert as_lists(ours(TEXTS, **kwargs)) == as_lists(theirs(TEXTS, **kwargs))
    assert as_lists(ours(TEXTS[1], **kwargs)) == as_lists(theirs(TEXTS[1], **kwargs))  # one string


def test_stored_padding_and_truncation_are_dropped_on_load(bert_folder: Path) -> None:
    tok = Tokenizer.from_file(bert_folder)
    hf = transformers.PreTrainedTokenizerFast(tokenizer_file=str(bert_folder / "tokenizer.json"))
    expected = hf(TEXTS)["input_ids"]
    assert len(expected[2]) > 16  # the long text is longer than the stored padding / truncation length
    # encode frames with [CLS] / [SEP] itself: the same ids as transformers, no pads, [SEP] right after the text
    assert [tok.encode(text, add_bos=True) for text in TEXTS] == expected
    assert tok.encode_batch(TEXTS, add_bos=True) == expected
    assert tok(TEXTS)["input_ids"] == expected


def test_wrapping_leaves_the_callers_tokenizer_as_it_was() -> None:
    hf = bert_like(pad_to=16, cut_at=16)
    tok = Tokenizer(hf)
    assert hf.padding is not None and hf.truncation is not None
    assert tok.hf.padding is None and tok.hf.truncation is None
    assert tok.pad_id == 0


def test_tokenizer_config_names_the_pad_token(gpt2_folder: Path, tmp_path: Path) -> None:
    assert Tokenizer.from_file(gpt2_folder).pad_id == 0  # "<|endoftext|>", as tokenizer_config.json says
    bare = tmp_path / "tokenizer.json"
    byte_level().save(str(bare))
    with pytest.raises(ValueError, match="padding=True needs a pad token"):
        Tokenizer.from_file(bare)(TEXTS, padding=True)


# --- zoo's own tokenizers ---------------------------------------------------------------------------------
def test_call_frames_like_encode_for_a_zoo_tokenizer(zoo_bpe: Tokenizer) -> None:
    out = zoo_bpe(TEXTS)
    assert out["input_ids"] == zoo_bpe.encode_batch(TEXTS)  # [*ids, eos]
    assert out["attention_mask"] == [[1] * len(row) for row in out["input_ids"]]
    assert zoo_bpe(TEXTS, add_special_tokens=False)["input_ids"] == zoo_bpe.encode_batch(TEXTS, add_eos=False)
    assert zoo_bpe(TEXTS[0]) == {
        "input_ids": zoo_bpe.encode(TEXTS[0]),
        "attention_mask": out["attention_mask"][0],
    }


def test_padding_right_and_left_fills_with_the_pad_id(zoo_bpe: Tokenizer) -> None:
    rows = zoo_bpe.encode_batch(TEXTS[:2])
    width = max(map(len, rows))
    right = zoo_bpe(TEXTS[:2], padding=True, return_tensors="pt")
    left = zoo_bpe(TEXTS[:2], padding="longest", padding_side="left", return_tensors="pt")
    assert right["input_ids"].shape == left["input_ids"].shape == (2, width)
    for i, row in enumerate(rows):
        pads = [zoo_bpe.pad_id] * (width - len(row))
        assert right["input_ids"][i].tolist() == row + pads
        assert left["input_ids"][i].tolist() == pads + row
        assert right["attention_mask"][i].tolist() == [1] * len(row) + [0] * len(pads)
        assert left["attention_mask"][i].tolist() == [0] * len(pads) + [1] * len(row)


def test_one_string_gives_a_batch_of_one_as_tensors(zoo_bpe: Tokenizer) -> None:
    out = zoo_bpe("hello world", return_tensors="pt")
    assert out["input_ids"].shape == (1, len(zoo_bpe.encode("hello world")))
    empty = zoo_bpe([], padding=True, return_tensors="pt")
    assert empty["input_ids"].shape == (0, 0)


def test_truncation_counts_the_special_tokens(zoo_bpe: Tokenizer) -> None:
    body = zoo_bpe.encode(TEXTS[2], add_eos=False)
    assert zoo_bpe(TEXTS[2], truncation=True, max_length=4)["input_ids"] == [*body[:3], zoo_bpe.eos_id]
    assert zoo_bpe(TEXTS[2], max_length=4)["input_ids"] == [*body[:3], zoo_bpe.eos_id]  # None: truncate
    assert zoo_bpe(TEXTS[2], truncation=False, max_length=4)["input_ids"] == [*body, zoo_bpe.eos_id]
    kept = zoo_bpe(TEXTS[:2], padding="max_length", max_length=8)["input_ids"]  # padding alone never cuts
    assert [len(row) for row in kept] == [max(8, len(row)) for row in zoo_bpe.encode_batch(TEXTS[:2])]


def test_max_length_defaults_to_model_max_length(zoo_bpe: Tokenizer) -> None:
    tok = Tokenizer(zoo_bpe.hf, model_max_length=5)
    assert [len(row) for row in tok(TEXTS, truncation=True)["input_ids"]] == [5, 5, 5, 5]
    assert tok(["a"], padding="max_length")["attention_mask"] == [[1, 1, 0, 0, 0]]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"padding": "yes"}, "padding must be False, True, 'longest'"),
        ({"truncation": "sideways"}, "truncation must be None, True, False"),
        ({"max_length": 0}, "max_length must be an int >= 1"),
        ({"max_length": True}, "max_length must be an int >= 1"),
        ({"padding_side": "middle"}, "padding_side must be 'right' or 'left'"),
        ({"return_tensors": "np"}, "return_tensors must be None"),
        ({"add_special_tokens": "yes"}, "add_special_tokens must be True or False"),
        ({"truncation": True}, r"truncation=True needs max_length"),
        ({"padding": "max_length"}, "padding='max_length' needs max_length"),
        ({"truncation": True, "max_length": 1}, r"max_length \(1\) is shorter than the 2 special tokens"),
        ({"return_tensors": "pt"}, "return_tensors='pt' needs rows of one length.*padding=True"),
    ],
)
def test_bad_arguments_name_the_argument(kwargs: dict[str, Any], message: str) -> None:
    tok = Tokenizer(bert_like(pad_to=16, cut_at=16))  # no model_max_length
    with pytest.raises(ValueError, match=message):
        tok(TEXTS, **kwargs)


@pytest.mark.parametrize("text", [5, ["fine", 3], None])
def test_text_must_be_strings(zoo_bpe: Tokenizer, text: Any) -> None:
    with pytest.raises(ValueError, match="text must be a str or a list of str"):
        zoo_bpe(text)


def test_padding_without_a_pad_token_is_an_error() -> None:
    hf = HFTokenizer(models.WordLevel(vocab={"<unk>": 0, "hi": 1}, unk_token="<unk>"))
    hf.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = Tokenizer(hf)
    assert tok(["hi", "hi hi"], add_special_tokens=True)["input_ids"] == [[1], [1, 1]]  # no eos: no framing
    with pytest.raises(ValueError, match=r"padding='longest' needs a pad token.*pass padding=False"):
        tok(["hi"], padding="longest")
