"""Hugging Face folders that zoo used to load with something silently dropped or misread (issue 49, item 14).

Each folder is a small random transformers model saved with ``save_pretrained``, then edited (its config or
one tensor). zoo must then compute what transformers computes on the same folder (logits to 1e-4), or refuse
in one line naming the config field or tensor and its value: where transformers fails too, or where zoo's
spec cannot say what transformers does.

    a tied config with a different stored head   transformers keeps the stored head (it unties)  refused
    a stored sinusoid table that is not one      transformers reads the stored table             refused
    gemma3_text / ModernBERT legacy rope_scaling  transformers applies it over rope_parameters    read
    Gemma 2's sliding_window_pattern              transformers ignores it (period 2)               ignored
    an invalid or contradictory rope scaling     -                                                refused
    a width, a count or a pad id out of range     transformers fails (or builds no layer)          refused
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

import zoo
from zoo.cli import main
from zoo.io.hf import HFError

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

V = 96


@torch.no_grad()
def lively(model: torch.nn.Module) -> torch.nn.Module:
    """Every weight drawn and every vector perturbed, so that a dropped tensor shows in the logits."""
    torch.manual_seed(0)
    for param in model.parameters():
        if not param.requires_grad:  # fixed tables (Pegasus's sinusoids) as they are
            continue
        if param.dim() >= 2:
            param.normal_(0.0, 0.2)
        else:
            param.add_(torch.randn_like(param) * 0.1)
    return model.eval()


def saved(path: Path, model: torch.nn.Module, **config_changes: Any) -> Path:
    """``model`` saved to ``path`` with ``config_changes`` written into its config.json (None: removed)."""
    model.save_pretrained(path)
    return edit_config(path, **config_changes)


def edit_config(path: Path, **changes: Any) -> Path:
    config = json.loads((path / "config.json").read_text())
    config |= changes
    (path / "config.json").write_text(json.dumps({k: v for k, v in config.items() if v is not None}))
    return path


def edit_tensors(path: Path, change: Callable[[dict[str, torch.Tensor]], None]) -> Path:
    tensors = load_file(path / "model.safetensors")
    change(tensors)
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    return path


def ids(vocab: int = V, length: int = 9) -> torch.Tensor:
    return torch.randint(3, vocab, (2, length), generator=torch.Generator().manual_seed(5))


@torch.no_grad()
def assert_same_logits(path: Path, auto: str = "AutoModelForCausalLM", **inputs: torch.Tensor) -> None:
    """zoo's import of ``path`` gives transformers' logits on it (no padding: every position is real)."""
    theirs = getattr(transformers, auto).from_pretrained(path).eval()(**inputs).logits
    input_ids = inputs.pop("input_ids")
    ours = zoo.from_hf(path)(input_ids, **inputs).logits
    assert theirs.abs().max() > 0.1  # a real signal
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)


def assert_transformers_fails(path: Path, auto: str = "AutoModelForCausalLM") -> None:
    """transformers cannot build or run the model of ``path`` either."""
    with pytest.raises(Exception):  # noqa: B017 (whatever transformers raises: an assertion, a ValueError...)
        model = getattr(transformers, auto).from_pretrained(path)
        model(input_ids=ids(model.config.vocab_size))


def assert_refused(path: Path, message: str, *, values: bool = False) -> None:
    """``from_hf`` and ``read_hf_spec`` refuse ``path`` in one line matching ``message`` (``values``: a
    tensor's values are wrong, which ``from_hf`` alone reads)."""
    for read in (zoo.from_hf,) if values else (zoo.from_hf, zoo.read_hf_spec):
        with pytest.raises(HFError, match=message) as error:
            read(path)
        assert len(str(error.value).splitlines()) == 1, str(error.value)


# -- a tied head with a stored head of its own -------------------------------------------------------------

LLAMA = dict(
    vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=64,
)  # fmt: skip
BERT = dict(
    vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
    max_position_embeddings=64, pad_token_id=0,
)  # fmt: skip
# model class, its config, the stored copy of the embeddings a tied config ignores
TIED_HEADS: dict[str, tuple[str, dict[str, Any], str]] = {
    "llama": ("LlamaForCausalLM", LLAMA, "lm_head.weight"),
    "gemma": ("GemmaForCausalLM", {**LLAMA, "head_dim": 8}, "lm_head.weight"),
    "gpt2": ("GPT2LMHeadModel", dict(vocab_size=V, n_embd=32, n_layer=2, n_head=4, n_positions=64), "lm_head.weight"),
    "opt": ("OPTForCausalLM", dict(vocab_size=V, hidden_size=32, ffn_dim=48, num_hidden_layers=2,
                                   num_attention_heads=4, max_position_embeddings=64, word_embed_proj_dim=32),
            "lm_head.weight"),
    "gpt_neox": ("GPTNeoXForCausalLM", dict(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                            num_attention_heads=4, max_position_embeddings=64), "embed_out.weight"),
    "bert": ("BertForMaskedLM", BERT, "cls.predictions.decoder.weight"),
    "roberta": ("RobertaForMaskedLM", {**BERT, "pad_token_id": 1}, "lm_head.decoder.weight"),
    "albert": ("AlbertForMaskedLM", {**BERT, "embedding_size": 16}, "predictions.decoder.weight"),
    "distilbert": ("DistilBertForMaskedLM", dict(vocab_size=V, dim=32, hidden_dim=48, n_layers=2, n_heads=4,
                                                 max_position_embeddings=64), "vocab_projector.weight"),
    "electra": ("ElectraForMaskedLM", {**BERT, "embedding_size": 32}, "generator_lm_head.weight"),
    "mpnet": ("MPNetForMaskedLM", {**BERT, "pad_token_id": 1}, "lm_head.decoder.weight"),
    "modernbert": ("ModernBertForMaskedLM", {**BERT, "num_hidden_layers": 3}, "decoder.weight"),
}  # fmt: skip


def _tied_head_folder(tmp_path: Path, name: str, **options: Any) -> tuple[Path, str, str]:
    cls, sizes, head = TIED_HEADS[name]
    config = transformers.AutoConfig.for_model(name, **{**sizes, **options})
    model = lively(getattr(transformers, cls)(config))
    auto = "AutoModelForCausalLM" if "Causal" in cls or "LMHead" in cls else "AutoModelForMaskedLM"
    return saved(tmp_path, model), head, auto


@pytest.mark.parametrize("name", list(TIED_HEADS))
def test_a_tied_config_beside_a_different_stored_head_is_refused_naming_the_tensor(
    tmp_path: Path, name: str
) -> None:
    """transformers 5 keeps the stored head when it differs from the embeddings (it unties them, with a
    warning); zoo dropped it and tied the head (logits off by ~15 on real weights): now it says so."""
    path, head, auto = _tied_head_folder(tmp_path, name, tie_word_embeddings=False)
    untied = getattr(transformers, auto).from_pretrained(path).eval()
    edit_config(path, tie_word_embeddings=True)
    reloaded = getattr(transformers, auto).from_pretrained(path).eval()
    with torch.no_grad():  # transformers computes the stored head, not the embeddings
        torch.testing.assert_close(reloaded(input_ids=ids()).logits, untied(input_ids=ids()).logits)
    with pytest.raises(HFError, match=rf"{head} differs from .*tie_word_embeddings") as error:
        zoo.from_hf(path)
    assert len(str(error.value).splitlines()) == 1


@pytest.mark.parametrize("name", ["llama", "bert"])
def test_a_stored_copy_equal_to_the_embeddings_is_tied_as_transformers_ties_it(
    tmp_path: Path, name: str
) -> None:
    path, head, auto = _tied_head_folder(tmp_path, name, tie_word_embeddings=True)
    embeddings = next(n for n in load_file(path / "model.safetensors") if n.endswith("embeddings.word_embeddings.weight")
                      or n.endswith("embed_tokens.weight"))  # fmt: skip
    edit_tensors(path, lambda t: t.__setitem__(head, t[embeddings].clone()))
    model = zoo.from_hf(path)
    assert model.spec.lm_head.tied if name == "llama" else model.spec.heads.mlm.tied
    assert_same_logits(path, auto, input_ids=ids())


def test_a_tied_mlm_decoder_bias_that_differs_from_the_heads_bias_is_refused(tmp_path: Path) -> None:
    """BERT ties cls.predictions.decoder.bias to cls.predictions.bias; a file holding another one is read by
    transformers (it unties), and was dropped by zoo."""
    path, _, _ = _tied_head_folder(tmp_path, "bert")
    edit_tensors(
        path, lambda t: t.__setitem__("cls.predictions.decoder.bias", t["cls.predictions.bias"] + 1.0)
    )
    with pytest.raises(HFError, match=r"cls\.predictions\.decoder\.bias differs from .*bias"):
        zoo.from_hf(path)


# -- a stored sinusoid table that is not the sinusoids -----------------------------------------------------

SEQ2SEQ = dict(
    vocab_size=V, d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
    decoder_attention_heads=4, encoder_ffn_dim=48, decoder_ffn_dim=48, max_position_embeddings=40,
)  # fmt: skip


def _seq2seq_inputs() -> dict[str, torch.Tensor]:
    return {"input_ids": ids(), "decoder_input_ids": ids(length=5)}


@pytest.mark.parametrize(
    ("cls", "options"),
    [
        ("Pegasus", dict(pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)),
        ("Marian", dict(pad_token_id=V - 1, eos_token_id=0, decoder_start_token_id=V - 1)),
    ],
)
def test_a_stored_position_table_that_is_not_the_sinusoids_is_refused(
    tmp_path: Path, cls: str, options: dict[str, Any]
) -> None:
    """transformers reads the stored table; zoo computes the sinusoids and used to ignore it (0.30 off)."""
    config = getattr(transformers, f"{cls}Config")(**SEQ2SEQ, **options)
    model = lively(
        getattr(transformers, f"{cls}MTModel" if cls == "Marian" else f"{cls}ForConditionalGeneration")(
            config
        )
    )
    path = saved(tmp_path, model)
    name = "model.encoder.embed_positions.weight"
    table = model.model.encoder.embed_positions.weight.detach()
    edit_tensors(
        path, lambda t: t.update({name: table.clone(), "model.decoder.embed_positions.weight": table.clone()})
    )
    assert_same_logits(
        path, "AutoModelForSeq2SeqLM", **_seq2seq_inputs()
    )  # the true table (Marian stores none)
    edit_tensors(path, lambda t: t.__setitem__(name, t[name] + 0.5))
    reloaded = transformers.AutoModelForSeq2SeqLM.from_pretrained(path)
    torch.testing.assert_close(
        reloaded.model.encoder.embed_positions.weight, table + 0.5
    )  # read, not computed
    assert_refused(path, rf"{name} is not the sinusoid table \(max difference 0\.5\)", values=True)


# -- legacy rope_scaling beside rope_parameters ------------------------------------------------------------

GEMMA3 = dict(
    vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
    num_key_value_heads=2, head_dim=8, max_position_embeddings=64, sliding_window=4, pad_token_id=0,
    layer_types=["sliding_attention", "full_attention", "sliding_attention"],
)  # fmt: skip


def _gemma3(tmp_path: Path, **config_changes: Any) -> Path:
    model = lively(transformers.Gemma3ForCausalLM(transformers.Gemma3TextConfig(**GEMMA3)))
    return saved(tmp_path, model, **config_changes)


def test_gemma3_applies_a_legacy_rope_scaling_over_rope_parameters_as_transformers_does(
    tmp_path: Path,
) -> None:
    path = _gemma3(tmp_path, rope_scaling={"rope_type": "linear", "factor": 2.0})
    assert zoo.read_hf_spec(path).position.scaling.factor == 2.0
    assert_same_logits(path, input_ids=ids(length=40))


def test_modernbert_applies_a_legacy_rope_scaling_over_rope_parameters_as_transformers_does(
    tmp_path: Path,
) -> None:
    """ModernBERT's rope_scaling applies to both layer types: read where they then agree, refused where the
    local layers would rotate with a scaled base of their own."""
    config = transformers.ModernBertConfig(**{**BERT, "num_hidden_layers": 3}, local_attention=4,
                                           global_attn_every_n_layers=2)  # fmt: skip
    same_theta = {"rope_type": "default", "rope_theta": 500.0}
    path = saved(tmp_path, lively(transformers.ModernBertForMaskedLM(config)),
                 rope_parameters={"full_attention": same_theta, "sliding_attention": same_theta},
                 rope_scaling={"rope_type": "linear", "factor": 2.0})  # fmt: skip
    assert zoo.read_hf_spec(path).position.scaling.factor == 2.0
    assert_same_logits(path, "AutoModelForMaskedLM", input_ids=ids(length=20))
    edit_config(path, rope_parameters={"full_attention": same_theta,
                                       "sliding_attention": {**same_theta, "rope_theta": 50.0}})  # fmt: skip
    assert_refused(path, r"rope_parameters\.sliding_attention=.*plain rotary")


def test_gemma2_ignores_a_sliding_window_pattern_as_its_config_class_does(tmp_path: Path) -> None:
    """Gemma2Config alternates sliding and full layers whatever ``sliding_window_pattern`` says (Gemma 3 reads
    it): zoo read it for both, and made layer 2 of 3 sliding."""
    sizes = {k: v for k, v in GEMMA3.items() if k != "layer_types"}
    model = lively(transformers.Gemma2ForCausalLM(transformers.Gemma2Config(**sizes)))
    path = saved(tmp_path, model, layer_types=None, sliding_window_pattern=3)
    assert_same_logits(path, input_ids=ids(length=40))


# -- invalid or contradictory rope scaling -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("scaling", "message"),
    [
        ({"type": "yarn", "factor": -2}, r"rope_scaling: type='yarn' disagrees with rope_type='default'"),
        ({"rope_type": "yarn", "factor": 2.0}, r"rope_type='yarn' is not supported"),
        ({"rope_type": "linear", "factor": -2}, r"rope_scaling factor=-2: a positive number is expected"),
        ({"rope_type": "linear", "factor": 0}, r"rope_scaling factor=0: a positive number is expected"),
    ],
)
def test_gemma3_refuses_an_invalid_or_unsupported_rope_scaling_naming_it(
    tmp_path: Path, scaling: dict[str, Any], message: str
) -> None:
    assert_refused(_gemma3(tmp_path, rope_scaling=scaling), message)


@pytest.mark.parametrize(
    ("scaling", "message"),
    [
        ({"rope_type": "linear", "factor": -2.0}, r"rope_scaling factor=-2\.0: a positive number is expected"),
        ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 0, "high_freq_factor": 4.0},
         r"rope_scaling low_freq_factor=0: a positive number is expected"),
        ({"rope_type": "linear", "factor": "2"}, r"rope_scaling factor='2': a positive number is expected"),
        ({"type": "linear", "rope_type": "default", "factor": 2.0},
         r"rope_scaling: type='linear' disagrees with rope_type='default'"),
    ],
)  # fmt: skip
def test_llama_refuses_an_invalid_rope_scaling_in_one_line_naming_the_field(
    tmp_path: Path, scaling: dict[str, Any], message: str
) -> None:
    model = lively(transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA)))
    assert_refused(saved(tmp_path, model, rope_scaling=scaling), message)


# -- widths, counts and token ids out of range -------------------------------------------------------------


def test_umt5_without_decoder_layers_is_refused_naming_the_field(tmp_path: Path) -> None:
    """transformers builds a decoder of no layer (and leaves the stored ones unused); zoo read 0 as "as many
    as the encoder" (0.16 off)."""
    config = transformers.UMT5Config(vocab_size=V, d_model=32, d_kv=8, d_ff=48, num_layers=2, num_heads=4)
    path = saved(tmp_path, lively(transformers.UMT5ForConditionalGeneration(config)), num_decoder_layers=0)
    assert transformers.AutoModelForSeq2SeqLM.from_pretrained(path).config.num_decoder_layers == 0
    assert_refused(path, r"config\.json num_decoder_layers=0: a positive integer is expected")


@pytest.mark.parametrize(
    ("cls", "sizes", "changes", "message"),
    [
        ("GemmaForCausalLM", {**LLAMA, "head_dim": 8}, {"head_dim": 0}, r"head_dim=0: a positive integer"),
        ("LlamaForCausalLM", LLAMA, {"num_key_value_heads": 0}, r"num_key_value_heads=0: a positive integer"),
        ("LlamaForCausalLM", LLAMA, {"pad_token_id": V}, rf"pad_token_id={V} is outside the vocabulary"),
        ("GPT2LMHeadModel", dict(vocab_size=V, n_embd=32, n_layer=2, n_head=4, n_positions=64, n_inner=64),
         {"n_inner": 0}, r"n_inner=0: a positive integer"),
        ("XLMRobertaForMaskedLM", {**BERT, "pad_token_id": 1}, {"pad_token_id": 10**9},
         r"pad_token_id=1000000000 is outside the vocabulary"),
        ("XLMRobertaForMaskedLM", {**BERT, "pad_token_id": 1}, {"pad_token_id": None},
         r"pad_token_id=None: xlm-roberta counts positions from pad_token_id \+ 1"),
        ("XLMRobertaForMaskedLM", {**BERT, "pad_token_id": 1}, {"pad_token_id": -V - 1},
         rf"pad_token_id={-V - 1} is outside the vocabulary"),
    ],
)  # fmt: skip
def test_a_config_transformers_cannot_build_is_refused_naming_the_field(
    tmp_path: Path, cls: str, sizes: dict[str, Any], changes: dict[str, Any], message: str
) -> None:
    model_type = {"Gemma": "gemma", "Llama": "llama", "GPT2": "gpt2", "XLMRoberta": "xlm-roberta"}
    config = transformers.AutoConfig.for_model(
        next(v for k, v in model_type.items() if cls.startswith(k)), **sizes
    )
    path = saved(tmp_path, lively(getattr(transformers, cls)(config)))
    config_json = json.loads((path / "config.json").read_text()) | changes
    (path / "config.json").write_text(json.dumps(config_json))
    auto = "AutoModelForMaskedLM" if "Masked" in cls else "AutoModelForCausalLM"
    assert_transformers_fails(path, auto)
    assert_refused(path, message)


@pytest.mark.parametrize(
    ("cls", "sizes", "pad"),
    [
        ("LlamaForCausalLM", LLAMA, -1),  # the embedding's last row (only its gradient is kept at 0)
        ("GPT2LMHeadModel", dict(vocab_size=V, n_embd=32, n_layer=2, n_head=4, n_positions=64), 10**9),  # no padding_idx
    ],
)  # fmt: skip
def test_a_pad_id_transformers_runs_with_is_still_dropped(
    tmp_path: Path, cls: str, sizes: dict[str, Any], pad: int
) -> None:
    """An id naming no row zoo could use, where transformers computes the same function anyway: no pad id."""
    config = transformers.AutoConfig.for_model("llama" if cls.startswith("Llama") else "gpt2", **sizes)
    path = saved(tmp_path, lively(getattr(transformers, cls)(config)), pad_token_id=pad)
    assert zoo.read_hf_spec(path).pad_token_id is None
    assert_same_logits(path, input_ids=ids())


def test_a_gemma3_window_pattern_of_zero_is_one_line_in_from_hf_and_zoo_convert(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """transformers divides by it (ZeroDivisionError); so did zoo, in a traceback."""
    path = _gemma3(tmp_path / "hf", sliding_window_pattern=0, layer_types=None)
    assert_refused(path, r"sliding_window_pattern=0: a positive integer is expected")
    capsys.readouterr()  # what saving printed
    code = main(["convert", "--from-hf", str(path), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code != 0 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "sliding_window_pattern=0" in err
