"""Tokenizers that can spell JSON (trained on JSON lines as well as words), in both kinds a grammar engine
reads differently: zoo's ``▁``-marked BPE (read by zoo) and a byte-level BPE (read by llguidance itself); a
tiny decoder with an end token; and bounded schemas, so that a random model's text completes in a few dozen
tokens (its strings and numbers are short by the schema, not by luck)."""

from __future__ import annotations

import json
from typing import Any

import torch
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

import zoo
from tests.generation.conftest import liven
from tests.serving.conftest import LINES
from zoo.io.tokenizer import Tokenizer, train_tokenizer

JSON_LINES = [
    json.dumps({"name": f"cat{i}", "age": i, "tags": ["a", "b"], "ok": i % 2 == 0, "x": None})
    for i in range(60)
]

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
        "ok": {"type": "boolean"},
    },
    "required": ["name", "age", "tags", "ok"],
    "additionalProperties": False,
}


def metaspace_tokenizer() -> Tokenizer:
    """zoo's trained BPE (``▁`` word marks; eos id 2)."""
    return train_tokenizer(iter(LINES + JSON_LINES), kind="bpe", vocab_size=320)


def byte_level_tokenizer() -> Tokenizer:
    """A GPT-2-style byte-level BPE (every byte a token; ``<|end|>`` id 0 its end token)."""
    hf = HFTokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=420, special_tokens=["<|end|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    hf.train_from_iterator(LINES + JSON_LINES, trainer)
    return Tokenizer(hf, special_tokens={"eos": "<|end|>"})


def decoder_for(tokenizer: Tokenizer, **override: Any) -> zoo.ZooModel:
    """The tiny random decoder over ``tokenizer``'s vocabulary (padded to a multiple of 64: ids the
    tokenizer lacks), ending on its eos."""
    torch.manual_seed(0)
    size = -(-tokenizer.vocab_size // 64) * 64
    settings: dict[str, Any] = {"eos_token_id": tokenizer.eos_id, **override}
    spec = zoo.preset("llama-tiny", dropout=0.0, vocab_size=size, **settings)
    return liven(zoo.build(spec)).eval()


def prompt(tokenizer: Tokenizer, text: str = "the cat sat") -> torch.Tensor:
    return torch.tensor([tokenizer.encode(text, add_eos=False)])
