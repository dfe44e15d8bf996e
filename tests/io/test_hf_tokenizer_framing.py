"""A Hugging Face export frames text as zoo feeds the model: transformers' ``AutoTokenizer`` on the folder
``zoo convert --to-hf`` writes gives the ids zoo's own paths give, per family (a decoder's prompt is ``bos text``,
as ``zoo generate``, ``zoo serve`` and zoo's lm-eval adapter feed it; an encoder's text ``bos text eos``, as
masked LM and classification train on it; a seq2seq source ``text eos``), so ``generate`` continues alike."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

import zoo
from zoo.cli import main
from zoo.io.tokenizer import Tokenizer, train_tokenizer

transformers = pytest.importorskip("transformers")

WORDS = ["the", "cat", "dog", "sat", "on", "mat", "a", "big", "small", "red", "house", "tree", "ran", "seven"]
TEXTS = ["the cat", "a big red house", "seven dogs ran over the mat", "cat"]


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    rng = random.Random(0)
    lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12))) for _ in range(300)]
    return train_tokenizer(iter(lines), kind="bpe", vocab_size=150)  # no post-processor: zoo's own


def _export(preset: str, tok: Tokenizer, folder: Path) -> tuple[zoo.ZooModel, Path]:
    """A model built from ``preset`` for ``tok``, saved with it by zoo.save, exported by ``zoo convert``."""
    ids = {f"{name}_token_id": tok.special_ids()[name] for name in ("pad", "bos", "eos")}
    torch.manual_seed(0)
    model = zoo.build(zoo.preset(preset, vocab_size=tok.vocab_size, **ids)).eval()
    zoo.save(model, folder / "zoo", tokenizer=tok)
    assert main(["convert", "--to-hf", str(folder / "zoo"), "--out", str(folder / "hf")]) == 0
    return model, folder / "hf"


def test_an_exported_causal_lm_frames_prompts_as_zoo_and_generates_the_same_tokens(
    tok: Tokenizer, tmp_path: Path
) -> None:
    model, hf = _export("llama-tiny", tok, tmp_path)
    theirs = transformers.AutoTokenizer.from_pretrained(hf)
    for text in TEXTS:  # `zoo generate`'s prompt: bos first, no eos (zoo serve and ZooLM frame it so too)
        assert theirs(text).input_ids == tok.encode(text, add_bos=True, add_eos=False), text
    config = json.loads((hf / "tokenizer_config.json").read_text())
    assert (config["add_bos_token"], config["add_eos_token"]) == (True, False)
    assert zoo.load_tokenizer(hf)("the cat")["input_ids"] == theirs("the cat").input_ids  # zoo reads it back

    hf_model = transformers.AutoModelForCausalLM.from_pretrained(hf).eval()
    settings = dict(max_new_tokens=8, eos_token_id=tok.eos_id, pad_token_id=tok.pad_id)
    generation = transformers.GenerationConfig(do_sample=False, num_beams=1, **settings)
    for text in TEXTS:
        with torch.no_grad():
            expected = hf_model.generate(**theirs(text, return_tensors="pt"), generation_config=generation)
        ours = torch.tensor([tok.encode(text, add_bos=True, add_eos=False)])
        assert model.generate(ours, **settings).tolist() == expected.tolist(), text


@pytest.mark.parametrize(
    ("preset", "bos", "eos"),
    [
        ("bert-tiny", True, True),  # masked LM trains on `bos text eos` (classification too)
        ("bart-tiny", False, True),  # a seq2seq source is `text eos` (`zoo translate`, training)
    ],
)
def test_an_exported_tokenizer_frames_text_as_the_models_family_is_trained(
    preset: str, bos: bool, eos: bool, tok: Tokenizer, tmp_path: Path
) -> None:
    _, hf = _export(preset, tok, tmp_path)
    theirs = transformers.AutoTokenizer.from_pretrained(hf)
    for text in TEXTS:
        assert theirs(text).input_ids == tok.encode(text, add_bos=bos, add_eos=eos), text
