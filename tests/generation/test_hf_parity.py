"""Parity with ``transformers``' own ``generate`` (greedy and beam search) for imported Hugging Face models.

Small random models of each family are built from configs, given lively weights, saved with
``save_pretrained`` and imported with `zoo.from_hf`. Every generation setting is passed to transformers
explicitly (saved generation configs carry defaults such as forced eos or bad words). Nothing is downloaded.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import zoo

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

V = 128
DECODER_SIZES = dict(vocab_size=V, bos_token_id=1, eos_token_id=2, pad_token_id=0)
SEQ2SEQ_SIZES = dict(
    vocab_size=V, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
    decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64,
)  # fmt: skip

HF_MODELS: dict[str, Callable[[], torch.nn.Module]] = {
    "gpt2": lambda: transformers.GPT2LMHeadModel(
        transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, n_positions=64, **DECODER_SIZES)
    ),
    "llama": lambda: transformers.LlamaForCausalLM(
        transformers.LlamaConfig(
            num_hidden_layers=2,
            hidden_size=64,
            intermediate_size=96,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=64,
            **DECODER_SIZES,
        )
    ),
    "t5": lambda: transformers.T5ForConditionalGeneration(
        transformers.T5Config(
            vocab_size=V,
            d_model=32,
            d_kv=8,
            d_ff=64,
            num_layers=2,
            num_heads=4,
            relative_attention_num_buckets=8,
            relative_attention_max_distance=20,
            pad_token_id=0,
            eos_token_id=1,
            decoder_start_token_id=0,
        )
    ),
    "bart": lambda: transformers.BartForConditionalGeneration(
        transformers.BartConfig(
            **SEQ2SEQ_SIZES, pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2
        )
    ),
    "marian": lambda: transformers.MarianMTModel(
        transformers.MarianConfig(
            **SEQ2SEQ_SIZES,
            scale_embedding=True,
            pad_token_id=V - 1,
            decoder_start_token_id=V - 1,
            eos_token_id=0,
        )
    ),
}

SEARCHES = {
    "greedy": dict(num_beams=1),
    "beam": dict(num_beams=3, length_penalty=1.0, early_stopping=False),
    "beam-early": dict(num_beams=3, length_penalty=0.6, early_stopping=True),
    "beam-never": dict(num_beams=4, length_penalty=2.0, early_stopping="never"),
}


@torch.no_grad()
def liven(model: torch.nn.Module) -> torch.nn.Module:
    """Weights large enough that the greedy path depends on the context (the default init mostly echoes)."""
    torch.manual_seed(0)
    width = model.config.hidden_size if hasattr(model.config, "hidden_size") else model.config.d_model
    for name, param in model.named_parameters():
        if not param.requires_grad:  # fixed tables (Marian's sinusoids) stay as they are
            continue
        if param.dim() >= 2:
            lookup = any(key in name for key in ("embed", "wte", "wpe", "shared", "relative_attention_bias"))
            param.normal_(0.0, 0.3 if lookup else 2.0 / math.sqrt(width))
        else:
            param.add_(torch.randn_like(param) * 0.1)
    for name, buffer in model.named_buffers():
        if name.endswith("final_logits_bias"):
            buffer.normal_(0.0, 0.5)
    return model.eval()


@pytest.fixture(scope="module", params=list(HF_MODELS))
def pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """(name, the transformers model, the same model imported into zoo)."""
    hf = liven(HF_MODELS[request.param]())
    path: Path = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(path, safe_serialization=True)
    return request.param, hf, zoo.from_hf(path)


def _inputs(hf: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    lengths = [7, 4, 5]
    ids = torch.randint(3, V - 2, (3, 7), generator=g)
    if hf.config.is_encoder_decoder:  # sources right-padded, as tokenizers do
        mask = torch.tensor([[1] * n + [0] * (7 - n) for n in lengths])
    else:  # prompts left-padded, as generation needs
        mask = torch.tensor([[0] * (7 - n) + [1] * n for n in lengths])
    return ids.masked_fill(mask == 0, hf.config.pad_token_id), mask


def _hf_generate(hf: torch.nn.Module, ids, mask, *, eos: int, max_new_tokens: int, **search) -> torch.Tensor:
    config = transformers.GenerationConfig(
        do_sample=False, max_new_tokens=max_new_tokens, min_new_tokens=0, repetition_penalty=1.0,
        no_repeat_ngram_size=0, eos_token_id=eos, pad_token_id=hf.config.pad_token_id,
        bos_token_id=getattr(hf.config, "bos_token_id", None), decoder_start_token_id=getattr(hf.config, "decoder_start_token_id", None),
        forced_bos_token_id=None, forced_eos_token_id=None, bad_words_ids=None, num_return_sequences=1,
        **{"length_penalty": 1.0, "early_stopping": False, **search},
    )  # fmt: skip
    hf.generation_config = config  # so no saved default can leak in
    with torch.no_grad():
        return hf.generate(ids, attention_mask=mask, generation_config=config)


def _after_eos_blanked(out: torch.Tensor, start: int, eos: int) -> torch.Tensor:
    """Everything after each row's first generated eos becomes -1 (fillers differ: HF beam search pads
    with eos when pad_token_id is 0)."""
    out = out.clone()
    for row in out:
        hits = (row[start:] == eos).nonzero()
        if len(hits):
            row[start + int(hits[0]) + 1 :] = -1
    return out


@pytest.mark.parametrize("search", list(SEARCHES))
def test_generate_matches_transformers(pair, search):
    name, hf, model = pair
    ids, mask = _inputs(hf)
    start = 1 if hf.config.is_encoder_decoder else ids.shape[1]
    # The configured eos rarely comes up in a random model; also make a token it does produce the eos.
    free = model.generate(ids, attention_mask=mask, max_new_tokens=10, eos_token_id=[])
    produced = int(free[0, start + 2])
    for eos in (hf.config.eos_token_id, produced):
        theirs = _hf_generate(hf, ids, mask, eos=eos, max_new_tokens=10, **SEARCHES[search])
        ours = model.generate(
            ids, attention_mask=mask, max_new_tokens=10, eos_token_id=eos, pad_token_id=hf.config.pad_token_id,
            **{"length_penalty": 1.0, "early_stopping": False, **SEARCHES[search]},
        )  # fmt: skip
        assert ours.shape == theirs.shape, (name, search, eos)
        assert torch.equal(_after_eos_blanked(ours, start, eos), _after_eos_blanked(theirs, start, eos)), (
            name, search, eos, ours, theirs,
        )  # fmt: skip
        if search == "greedy":
            assert torch.equal(
                ours, theirs
            )  # greedy pads finished rows with pad_token_id, as transformers does
