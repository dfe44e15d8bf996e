"""zoo's special tokens, and the names looked up to find them in a tokenizer zoo did not train."""

from __future__ import annotations

# Trained tokenizers give these ids 0-4, in this order.
SPECIAL_TOKENS: dict[str, str] = {
    "pad": "<pad>",
    "bos": "<s>",
    "eos": "</s>",
    "unk": "<unk>",
    "mask": "<mask>",
}

# Names looked up, in order, to find each special token in a tokenizer we did not train.
SPECIAL_TOKEN_ALIASES: dict[str, tuple[str, ...]] = {
    "pad": ("<pad>", "[PAD]", "<|pad|>"),
    "bos": ("<s>", "[CLS]", "<bos>", "<|begin_of_text|>", "<|endoftext|>"),
    "eos": ("</s>", "[SEP]", "<eos>", "<|end_of_text|>", "<|endoftext|>"),
    "unk": ("<unk>", "[UNK]"),
    "mask": ("<mask>", "[MASK]"),
}


def looked_for(name: str) -> str:
    """The aliases of special token ``name`` as an error message lists them: ``"<pad>, [PAD], <|pad|>"``."""
    return ", ".join(SPECIAL_TOKEN_ALIASES[name])
