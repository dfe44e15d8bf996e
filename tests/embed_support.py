"""Folders for the embedding tests (`tests/embeddings`): a tiny random BERT saved as a Hugging Face folder,
and the same model as a sentence-transformers folder written by hand (modules.json, 1_Pooling/config.json,
sentence_bert_config.json).

The tokenizer is a small WordPiece with BERT's [CLS] … [SEP] template and no lowercasing of its own, so that
``do_lower_case`` visibly matters.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, normalizers, pre_tokenizers, processors

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = [
    *("the", "a", "man", "is", "play", "##ing", "guitar", ".", "hello", "world", "!", "and", "says", "to"),
    *("un", "##known", "words", ":", "ze", "##bra", "HELLO", "WORLD"),
]
MAX_POSITIONS = 40
TEXTS = [
    "hello world",
    "the man is playing the guitar and the world says hello to the man " * 3,  # 50 tokens framed
    "a man.",
    "",
    "HELLO WORLD",
    "unknown words: zebra and zebra",
    "the guitar",
]


def wordpiece() -> HFTokenizer:
    vocab = {token: i for i, token in enumerate([*SPECIALS, *WORDS])}
    tok = HFTokenizer(models.WordPiece(vocab=vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=False)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", 2), ("[SEP]", 3)],
    )
    tok.add_special_tokens(SPECIALS)
    return tok


def write_json(path: Path, data: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data), encoding="utf-8")


def make_hf_folder(folder: Path) -> Path:
    """A random 2-layer BERT (width 32) with its tokenizer, saved by transformers: a plain HF folder."""
    import transformers

    config = transformers.BertConfig(
        vocab_size=len(SPECIALS) + len(WORDS),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=48,
        max_position_embeddings=MAX_POSITIONS,
    )
    torch.manual_seed(3)
    model = transformers.BertModel(config)
    with torch.no_grad():  # off the default init: biases and norm weights not 0 and 1
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.05)
    model.save_pretrained(folder, safe_serialization=True)
    wordpiece().save(str(folder / "tokenizer.json"))
    write_json(folder / "tokenizer_config.json", {"model_max_length": 512, "pad_token": "[PAD]"})
    return folder


def make_st_folder(
    hf_folder: Path, target: Path, *, pooling: dict[str, Any], max_seq_length: int | None, lowercase: bool
) -> Path:
    """``hf_folder`` as a sentence-transformers folder: Transformer, Pooling (``pooling``: its config),
    Normalize."""
    shutil.copytree(hf_folder, target)
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]
    write_json(target / "modules.json", modules)
    write_json(target / "1_Pooling" / "config.json", {"word_embedding_dimension": 32, **pooling})
    write_json(
        target / "sentence_bert_config.json", {"max_seq_length": max_seq_length, "do_lower_case": lowercase}
    )
    return target
