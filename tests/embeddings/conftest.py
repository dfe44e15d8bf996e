"""The embedding tests' folders (`embed_support`), made once per session."""

from __future__ import annotations

from pathlib import Path

import pytest
from embed_support import make_hf_folder, make_st_folder

pytest.importorskip("transformers")


@pytest.fixture(scope="session")
def hf_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A plain Hugging Face folder: a random 2-layer BERT of width 32 and its WordPiece tokenizer."""
    return make_hf_folder(tmp_path_factory.mktemp("embed") / "hf")


@pytest.fixture(scope="session")
def sbert_folder(hf_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same model as a sentence-transformers folder: CLS and mean pooling concatenated (the older
    config's switches), normalised, 8 tokens, lowercased."""
    pooling = {"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": True}
    target = tmp_path_factory.mktemp("embed") / "sbert"
    return make_st_folder(hf_folder, target, pooling=pooling, max_seq_length=8, lowercase=True)
