"""Shared by the decoder families' parity tests (tests/io/test_hf_{llama_family,gemma,neox_phi3,moe}.py):
livened transformers models, left-padded batches with the position ids transformers' generate passes, the
logits comparison at real positions, and reloading an export with nothing missing."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch

import zoo

LENGTHS = [40, 34, 12]  # left-padded: the longest rows pass position 32 and a window of 8


@torch.no_grad()
def liven(model: torch.nn.Module) -> torch.nn.Module:
    """Weights large enough that greedy decoding (and routing) depend on the context; every vector perturbed."""
    torch.manual_seed(0)
    for name, param in model.named_parameters():
        if param.dim() >= 2:
            param.normal_(0.0, 0.3 if "embed" in name else 2.0 / math.sqrt(model.config.hidden_size))
        else:
            param.add_(torch.randn_like(param) * 0.1)
    return model.eval()


def left_padded(lengths: list[int], vocab: int = 128) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ids, mask, the position ids transformers' generate passes: cumsum - 1, padding at 1)."""
    g = torch.Generator().manual_seed(3)
    T = max(lengths)
    mask = torch.tensor([[0] * (T - n) + [1] * n for n in lengths])
    ids = torch.randint(3, vocab, (len(lengths), T), generator=g).masked_fill(mask == 0, 0)
    positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)
    return ids, mask, positions


@torch.no_grad()
def assert_logits_match(
    model: zoo.ZooModel,
    hf: torch.nn.Module,
    lengths: list[int] = LENGTHS,
    *,
    signal: float = 1e-1,
    **hf_kwargs: Any,
) -> tuple[Any, Any]:
    """zoo's and transformers' logits equal to 1e-4 at the real positions of a left-padded batch, transformers'
    at least ``signal`` somewhere (a real signal); returns both outputs for further checks."""
    ids, mask, positions = left_padded(lengths)
    ours = model(ids, attention_mask=mask)
    theirs = hf(input_ids=ids, attention_mask=mask, position_ids=positions, **hf_kwargs)
    real = mask.bool()
    assert theirs.logits[real].abs().max() > signal
    torch.testing.assert_close(ours.logits[real], theirs.logits[real], atol=1e-4, rtol=1e-4)
    return ours, theirs


def reload_hf(path: Path) -> torch.nn.Module:
    import transformers

    model, info = transformers.AutoModelForCausalLM.from_pretrained(path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    return model.eval()


def assert_greedy_generate_matches(
    hf: torch.nn.Module, model: torch.nn.Module, lengths: list[int], new_tokens: int = 10
) -> None:
    """zoo's greedy ``generate`` on a left-padded batch of ``lengths`` equals transformers' token for token (eos
    2, pad 0), with a generation config set outright so that no saved default can leak in."""
    import transformers

    ids, mask, _ = left_padded(lengths)
    settings = dict(max_new_tokens=new_tokens, eos_token_id=2, pad_token_id=0)
    config = transformers.GenerationConfig(
        do_sample=False, num_beams=1, min_new_tokens=0, repetition_penalty=1.0, no_repeat_ngram_size=0,
        bos_token_id=1, forced_bos_token_id=None, forced_eos_token_id=None, bad_words_ids=None, **settings,
    )  # fmt: skip
    hf.generation_config = config
    with torch.no_grad():
        theirs = hf.generate(ids, attention_mask=mask, generation_config=config)
    ours = model.generate(ids, attention_mask=mask, **settings)
    assert torch.equal(ours, theirs), (ours, theirs)


def export_and_reload(model: Any, hf: torch.nn.Module, source: Path, out: Path) -> torch.nn.Module:
    """``zoo.to_hf(model, out)`` checked: the ``model_type`` of the folder it was imported from (``source``),
    loaded by transformers as ``hf``'s class with no missing or unexpected keys, and read back by zoo as the
    same spec. Returns transformers' model, for the caller's logits comparison."""
    zoo.to_hf(model, out)
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == json.loads((source / "config.json").read_text())["model_type"]
    reloaded = reload_hf(out)
    assert type(reloaded) is type(hf)
    assert zoo.from_hf(out).spec.override(name=None, source=None) == model.spec.override(
        name=None, source=None
    )
    return reloaded
