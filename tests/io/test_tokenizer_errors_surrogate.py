"""A text holding a lone UTF-16 surrogate (JSON's "\\ud800" decodes to one) is one TokenizerError naming the
tokenizer and the text, wherever it is encoded (it was tokenizers' TextEncodeInput TypeError traceback)."""

from __future__ import annotations

import pytest

from zoo.io.tokenizer import TokenizerError, train_tokenizer


def test_a_lone_surrogate_is_one_error_naming_the_text() -> None:
    tok = train_tokenizer(iter(["hello world"] * 50), kind="bpe", vocab_size=100)
    with pytest.raises(TokenizerError, match=r"cannot encode text 1 .*lone UTF-16 surrogate at character 2"):
        tok.encode_batch(["hello", "a \ud800 b"])
    with pytest.raises(TokenizerError, match="lone UTF-16 surrogate"):
        tok.encode("\udfff")
