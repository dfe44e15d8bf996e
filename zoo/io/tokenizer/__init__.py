"""A thin wrapper over Hugging Face ``tokenizers``: train BPE / WordPiece / Unigram, load any ``tokenizer.json``.

    tok = train_tokenizer(["train.txt"], kind="bpe", vocab_size=8000)   # ids 0-4: pad, bos, eos, unk, mask
    ids = tok.encode("a sentence")                                       # [..., eos]
    batch = tok(["a", "b c"], padding=True, return_tensors="pt")         # transformers' batch interface
    tok.save_pretrained("out")                                           # a folder AutoTokenizer reads
    tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True)  # prompt ids

The package, one job a module:

    specials.py    zoo's special tokens and the aliases looked up in foreign tokenizers
    core.py        `Tokenizer`: loading, encode / decode, the batch call, named special ids
    batch.py       the batch call's argument checks, padding and tensors
    pretrained.py  the transformers folder: tokenizer_config.json read and written, the eos template
    chat.py        chat templates rendered as transformers renders them (`ChatTemplateError`)
    training.py    `train_tokenizer` and the text it reads
    lengths.py     cutting a text before encoding to what a token limit can keep
    errors.py      the `tokenizers` library's encoding errors as one line naming the file (`TokenizerError`)
    checks.py      `check_special_tokens`: does a tokenizer agree with a model spec
"""

from __future__ import annotations

from zoo.io.tokenizer.batch import Padding, Truncation
from zoo.io.tokenizer.chat import ChatTemplateError
from zoo.io.tokenizer.checks import check_special_tokens
from zoo.io.tokenizer.core import PathLike, Tokenizer
from zoo.io.tokenizer.errors import TokenizerError
from zoo.io.tokenizer.specials import SPECIAL_TOKEN_ALIASES, SPECIAL_TOKENS
from zoo.io.tokenizer.training import TokenizerKind, train_tokenizer

__all__ = [
    "SPECIAL_TOKENS",
    "SPECIAL_TOKEN_ALIASES",
    "ChatTemplateError",
    "Padding",
    "PathLike",
    "Tokenizer",
    "TokenizerError",
    "TokenizerKind",
    "Truncation",
    "check_special_tokens",
    "train_tokenizer",
]
