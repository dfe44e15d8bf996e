"""`zoo.load_pretrained`: a zoo checkpoint or a Hugging Face folder, each with its tokenizer, by one call."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import zoo
from zoo.io.checkpoint import CheckpointNotFoundError
from zoo.io.tokenizer import train_tokenizer

LINES = [f"the cat number {i} sat on the mat {i * 7}" for i in range(200)]


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, torch.nn.Module]:
    tok = train_tokenizer(iter(LINES), kind="bpe", vocab_size=300)
    ids = {f"{name}_token_id": tok.special_ids()[name] for name in ("pad", "bos", "eos")}
    model = zoo.build(zoo.preset("llama-tiny", dropout=0.0, vocab_size=tok.vocab_size, **ids))
    root = tmp_path_factory.mktemp("pretrained")
    zoo.save(model, root / "zoo", tokenizer=tok)
    zoo.to_hf(model, root / "hf")
    tok.save_pretrained(root / "hf")
    return root / "zoo", root / "hf", model


def test_a_zoo_checkpoint_and_a_hugging_face_folder_load_alike(
    saved: tuple[Path, Path, torch.nn.Module],
) -> None:
    zoo_dir, hf_dir, model = saved
    ids = torch.tensor([[5, 6, 7, 8]])
    expected = model.eval()(ids).logits
    for folder, kind in ((zoo_dir, "zoo"), (hf_dir, "hf")):
        loaded = zoo.load_pretrained(folder)
        assert loaded.kind == kind
        assert loaded.tokenizer.decode(loaded.tokenizer.encode("the cat sat", add_eos=False)) == "the cat sat"
        torch.testing.assert_close(loaded.model(ids).logits, expected, atol=1e-5, rtol=1e-5)


def test_a_folder_that_is_neither_is_one_error(
    tmp_path: Path, saved: tuple[Path, Path, torch.nn.Module]
) -> None:
    with pytest.raises(CheckpointNotFoundError, match="no such folder"):
        zoo.load_pretrained(tmp_path / "missing")
    with pytest.raises(CheckpointNotFoundError, match=r"no tokenizer\.json"):
        zoo.load_pretrained(tmp_path)
    (tmp_path / "tokenizer.json").write_bytes((saved[0] / "tokenizer.json").read_bytes())
    with pytest.raises(CheckpointNotFoundError, match=r"neither a zoo checkpoint \(spec.json\)"):
        zoo.load_pretrained(tmp_path)
