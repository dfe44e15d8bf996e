"""`TextStream`: text emitted piece by piece joins to exactly `tokenizer.decode(all_ids)`, with word-start
spaces kept and no half characters shown, for Metaspace BPE, byte-level BPE and WordPiece tokenizers."""

from __future__ import annotations

import pytest
import torch
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

from zoo.demo import toy_corpus
from zoo.generation import TextStream
from zoo.io.tokenizer import Tokenizer, train_tokenizer

MULTI_BYTE = ["고양이 🙂 좋아요 🐈‍⬛ 🚀", "the cat 🙂 eats fish 🐟 고양이가 생선을 먹는다"]
TEXTS = [
    "the big dog will like the big mouse",
    *MULTI_BYTE,
    "🙂🙂 🐟",  # the text starts inside a multi-byte run
]


@pytest.fixture(scope="module")
def lines() -> list[str]:
    corpus = toy_corpus(seed=0, train_size=300, valid_size=10)
    return [text for pair in corpus.train for text in pair] + MULTI_BYTE * 3


def byte_level_bpe(lines: list[str]) -> Tokenizer:
    """GPT-2 style: bytes as the alphabet, a small vocabulary so emoji are split across tokens."""
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=350,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<pad>", "<s>", "</s>"],
        show_progress=False,
    )
    tok.train_from_iterator(lines, trainer=trainer)
    return Tokenizer(tok)


@pytest.fixture(scope="module", params=["metaspace-bpe", "byte-level-bpe", "wordpiece"])
def tokenizer(request: pytest.FixtureRequest, lines: list[str]) -> Tokenizer:
    if request.param == "byte-level-bpe":
        return byte_level_bpe(lines)
    return train_tokenizer(iter(lines), kind=request.param.split("-")[-1], vocab_size=500)


def streamed(tokenizer: Tokenizer, ids: list[int], **kwargs: object) -> list[str]:
    text = TextStream(tokenizer, **kwargs)
    return [text.push(i) for i in ids] + [text.flush()]


@pytest.mark.parametrize("text", TEXTS)
def test_pieces_join_to_the_decoded_text(tokenizer: Tokenizer, text: str) -> None:
    ids = tokenizer.encode(text, add_bos=True)  # bos / eos are skipped, as decode skips them
    pieces = streamed(tokenizer, ids)
    assert "".join(pieces) == tokenizer.decode(ids)
    assert not any("\ufffd" in piece for piece in pieces)  # never half a character
    assert "".join(streamed(tokenizer, ids, skip_special_tokens=False)) == tokenizer.decode(
        ids, skip_special_tokens=False
    )


def test_decoding_token_by_token_would_lose_spaces_or_characters(tokenizer: Tokenizer) -> None:
    text = "the big dog will like the big mouse 🐟"
    ids = tokenizer.encode(text, add_eos=False)
    # Metaspace / WordPiece drop word-start spaces (the README's "willlikethebigmouse"); byte-level BPE
    # shows the halves of 🐟 as two "\ufffd".
    assert "".join(tokenizer.decode([i]) for i in ids) != text
    assert "".join(streamed(tokenizer, ids)) == text


def test_an_incomplete_character_is_held_back_until_it_is_whole(lines: list[str]) -> None:
    tok = byte_level_bpe(lines)
    ids = tok.encode("🐟", add_eos=False)
    assert len(ids) > 1 and tok.decode(ids[:1]).endswith("\ufffd")  # the emoji spans tokens
    text = TextStream(tok)
    assert [text.push(i) for i in ids] == [""] * (len(ids) - 1) + ["🐟"]
    cut = TextStream(tok)
    assert cut.push(ids[:1]) == ""
    assert cut.flush() == tok.decode(ids[:1])  # at the end, what is left comes out as it decodes


def test_pushing_lists_and_tensors_gives_the_same_text(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode(TEXTS[2], add_eos=False)
    text = TextStream(tokenizer)
    pieces = [text.push(ids[:3]), text.push(torch.tensor(ids[3:5])), text.push(torch.tensor(ids[5]))]
    pieces += [text.push(ids[6:]), text.flush()]
    assert "".join(pieces) == text.text == tokenizer.decode(ids)


def test_prompt_context_keeps_the_space_before_the_continuation(tokenizer: Tokenizer) -> None:
    prompt = tokenizer.encode("the big dog", add_eos=False)
    new = tokenizer.encode(" will like the big mouse", add_eos=False)  # byte-level keeps the space
    assert tokenizer.decode(prompt + new) == "the big dog will like the big mouse"
    assert "".join(streamed(tokenizer, new, prompt_ids=prompt)) == " will like the big mouse"
    assert "".join(streamed(tokenizer, new)) == tokenizer.decode(new)  # no prompt: the start of a text
