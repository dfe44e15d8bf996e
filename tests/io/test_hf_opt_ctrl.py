"""Hugging Face interop for OPT and CTRL: parity with transformers both ways, and greedy generation.

Reference models are built from tiny configs with lively random weights (no downloads), saved with
``save_pretrained``, imported with `zoo.from_hf`, exported with `zoo.to_hf` and reloaded by transformers.
Logits are compared at real positions on right- and left-padded batches: OPT derives positions from the
attention mask itself; CTRL counts 0, 1, ... unless given ``position_ids``, so its left-padded forward gets
the mask-counted ids that transformers' ``generate`` passes (see `zoo.io.hf.ctrl`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import zoo
from zoo.io.hf import HFError
from zoo.spec import parameter_count

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

V = 128
OPT = dict(
    vocab_size=V, hidden_size=32, num_hidden_layers=2, ffn_dim=64, num_attention_heads=4,
    max_position_embeddings=32, pad_token_id=1, bos_token_id=2, eos_token_id=2,
)  # fmt: skip
OPT_VARIANTS = {
    "125m-wiring": {},  # pre-norm, final norm, tied
    "350m-wiring": dict(do_layer_norm_before=False, word_embed_proj_dim=16),  # post-norm, projected
    "unbiased-untied-no-final-norm": dict(enable_bias=False, tie_word_embeddings=False, _remove_final_layer_norm=True),
}  # fmt: skip
CTRL = dict(vocab_size=V, n_embd=32, n_layer=2, n_head=4, dff=64, n_positions=32, pad_token_id=0)


@torch.no_grad()
def liven(model: torch.nn.Module) -> torch.nn.Module:
    """Weights large enough that greedy tokens depend on the context, every bias and norm off its default."""
    torch.manual_seed(0)
    width = model.config.hidden_size
    for name, param in model.named_parameters():
        if param.dim() >= 2:
            lookup = "embed" in name or name.endswith(".w.weight") or name == "w.weight"
            param.normal_(0.0, 0.3 if lookup else 2.0 / math.sqrt(width))
        else:
            param.add_(torch.randn_like(param) * 0.1)
    return model.eval()


def saved(model: torch.nn.Module, path: Path) -> Path:
    model.save_pretrained(path, safe_serialization=True)
    return path


def reload_hf(cls: type, path: Path) -> torch.nn.Module:
    """transformers' from_pretrained on ``path``, asserting it found exactly the tensors it needed."""
    model, info = cls.from_pretrained(path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    return model.eval()


def batch(*, left: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(3, 7) ids and mask, padded on the left (prompts for generation) or the right; pad id 0 or 1."""
    lengths, T = [7, 4, 5], 7
    ids = torch.randint(3, V, (3, T), generator=torch.Generator().manual_seed(3))
    rows = [[0] * (T - n) + [1] * n if left else [1] * n + [0] * (T - n) for n in lengths]
    mask = torch.tensor(rows)
    return ids.masked_fill(mask == 0, 1), mask


def mask_positions(mask: torch.Tensor) -> torch.Tensor:
    """Positions counted over real tokens, padding at 0: what transformers' generate passes a decoder."""
    return (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)


@torch.no_grad()
def assert_same_outputs(
    model: zoo.ZooModel, hf: torch.nn.Module, *, left: bool, hf_positions: bool = False
) -> None:
    ids, mask = batch(left=left)
    ours = model(ids, attention_mask=mask)
    extra = {"position_ids": mask_positions(mask)} if hf_positions else {}
    theirs = hf(input_ids=ids, attention_mask=mask, **extra)
    mine, other = (
        (ours.logits, theirs.logits)
        if ours.logits is not None
        else (ours.last_hidden_state, theirs.last_hidden_state)
    )
    real = mask.bool()
    assert mine.shape == other.shape
    assert other[real].abs().max() > 1e-2  # a real signal, not two zero tensors
    torch.testing.assert_close(mine[real], other[real], atol=1e-4, rtol=1e-4)


@torch.no_grad()
def assert_same_greedy_tokens(model: zoo.ZooModel, hf: torch.nn.Module) -> None:
    """Greedy generate on left-padded prompts: the same tokens as transformers', every setting explicit."""
    ids, mask = batch(left=True)
    pad, eos = hf.config.pad_token_id, 2
    config = transformers.GenerationConfig(
        do_sample=False, num_beams=1, max_new_tokens=8, min_new_tokens=0, repetition_penalty=1.0,
        no_repeat_ngram_size=0, eos_token_id=eos, pad_token_id=pad, bos_token_id=None,
        forced_bos_token_id=None, forced_eos_token_id=None, bad_words_ids=None,
    )  # fmt: skip
    hf.generation_config = config  # so no saved default can leak in
    theirs = hf.generate(ids, attention_mask=mask, generation_config=config)
    ours = model.generate(ids, attention_mask=mask, max_new_tokens=8, eos_token_id=eos, pad_token_id=pad)
    assert torch.equal(ours, theirs), (ours, theirs)
    assert len(set(theirs[:, ids.shape[1] :].flatten().tolist())) > 2  # the continuation is not one echo


# -- OPT ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=list(OPT_VARIANTS))
def opt(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """(variant, the transformers model, its folder, the model imported into zoo)."""
    config = transformers.OPTConfig(**OPT, **OPT_VARIANTS[request.param])
    hf = liven(transformers.OPTForCausalLM(config))
    path = saved(hf, tmp_path_factory.mktemp(request.param))
    return request.param, hf, path, zoo.from_hf(path)


def test_opt_import_reads_the_wiring_from_the_config(opt) -> None:
    variant, _, _, model = opt
    spec = model.spec
    assert spec.position.kind == "learned" and spec.position.offset == 2 and spec.ffn.activation == "relu"
    if variant == "350m-wiring":
        assert spec.embedding.projection_dim == 16 and spec.embedding_dim == 16
        assert spec.norm.placement == "post" and not spec.norm.has_final
        assert tuple(model.embed.tokens.weight.shape) == (V, 16)
    if variant == "unbiased-untied-no-final-norm":
        assert not spec.attention.bias and not spec.ffn.bias and not spec.lm_head.tied
        assert spec.norm.placement == "pre" and not spec.norm.has_final
    assert parameter_count(spec) == model.num_parameters()


@pytest.mark.parametrize("left", [False, True], ids=["right-padded", "left-padded"])
def test_opt_logits_match_transformers_on_padded_batches(opt, left) -> None:
    _, hf, _, model = opt
    assert_same_outputs(model, hf, left=left)


def test_opt_export_loads_in_transformers_with_no_missing_keys_and_same_logits(opt, tmp_path) -> None:
    _, _, _, model = opt
    zoo.to_hf(model, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == "opt" and config["architectures"] == ["OPTForCausalLM"]
    reloaded = reload_hf(transformers.OPTForCausalLM, tmp_path)
    assert_same_outputs(model, reloaded, left=True)


def test_opt_greedy_generate_matches_transformers_on_left_padded_prompts(opt) -> None:
    _, hf, _, model = opt
    assert_same_greedy_tokens(model, hf)


def test_headless_projected_opt_model_returns_the_projected_hidden_state(tmp_path) -> None:
    config = transformers.OPTConfig(**OPT, **OPT_VARIANTS["350m-wiring"])
    hf = liven(transformers.OPTModel(config))
    model = zoo.from_hf(saved(hf, tmp_path / "hf"))
    assert model.spec.lm_head is None
    assert_same_outputs(model, hf, left=True)  # (B, T, 16): after project_out, as OPTModel
    zoo.to_hf(model, tmp_path / "out")
    assert json.loads((tmp_path / "out" / "config.json").read_text())["architectures"] == ["OPTModel"]
    assert_same_outputs(model, reload_hf(transformers.OPTModel, tmp_path / "out"), left=False)


def test_opt_file_without_the_model_prefix_and_with_a_tied_head_copy_loads(tmp_path) -> None:
    """facebook's original OPT files name the body ``decoder.*`` (no ``model.``) and may store lm_head.weight."""
    hf = liven(transformers.OPTForCausalLM(transformers.OPTConfig(**OPT)))
    path = saved(hf, tmp_path / "hf")
    tmp_path = tmp_path / "facebook"
    tmp_path.mkdir()
    tensors = {k.removeprefix("model."): v for k, v in load_file(path / "model.safetensors").items()}
    tensors["lm_head.weight"] = tensors["decoder.embed_tokens.weight"].clone()
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    (tmp_path / "config.json").write_text((path / "config.json").read_text())
    model = zoo.from_hf(tmp_path)
    assert model.spec.lm_head is not None and model.spec.lm_head.tied
    assert_same_outputs(model, hf, left=False)


def test_zoo_built_opt_350m_shape_exports_to_transformers_with_same_logits(tmp_path) -> None:
    spec = zoo.preset("opt-350m").override(
        vocab_size=V, d_model=32, num_layers=2, max_positions=32,
        **{"attention.num_heads": 4, "ffn.d_ff": 64, "embedding.projection_dim": 16},
    )  # fmt: skip
    model = zoo.build(spec).eval()
    zoo.to_hf(model, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["word_embed_proj_dim"] == 16 and config["do_layer_norm_before"] is False
    assert_same_outputs(model, reload_hf(transformers.AutoModelForCausalLM, tmp_path), left=True)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("layer_norm_elementwise_affine", False, r"layer_norm_elementwise_affine=False is not supported"),
        ("layerdrop", 0.1, r"layerdrop=0\.1 is not supported \(zoo has no LayerDrop\)"),
    ],
)
def test_opt_config_fields_zoo_cannot_express_are_refused_by_name(
    opt, tmp_path, field, value, message
) -> None:
    _, _, path, _ = opt
    config = json.loads((path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, field: value}))
    (tmp_path / "model.safetensors").hardlink_to(path / "model.safetensors")  # a link out: refused
    with pytest.raises(HFError, match=message):
        zoo.from_hf(tmp_path)


def test_opt_export_refuses_a_spec_it_cannot_express_naming_the_field(tmp_path) -> None:
    spec = zoo.preset("opt-125m").override(
        vocab_size=V, d_model=32, num_layers=1, **{"attention.num_heads": 4}
    )
    with pytest.raises(HFError, match=r"opt cannot express lm_head\.bias=True"):
        zoo.to_hf(zoo.build(spec.override(**{"lm_head.bias": True})), tmp_path, model_type="opt")
    with pytest.raises(HFError, match=r"opt cannot express ffn\.bias=False \(read back as True\)"):
        zoo.to_hf(zoo.build(spec.override(**{"ffn.bias": False})), tmp_path, model_type="opt")


# -- CTRL --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=[True, False], ids=["tied", "untied"])
def ctrl(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """(the transformers model, its folder, the model imported into zoo)."""
    config = transformers.CTRLConfig(**CTRL, tie_word_embeddings=request.param)
    hf = liven(transformers.CTRLLMHeadModel(config))
    path = saved(hf, tmp_path_factory.mktemp("ctrl"))
    return hf, path, zoo.from_hf(path)


def test_ctrl_import_has_scaled_embeddings_half_sinusoids_and_a_learned_head_bias(ctrl) -> None:
    hf, _, model = ctrl
    spec = model.spec
    assert spec.embedding.scale and spec.position.kind == "sinusoidal" and spec.position.layout == "half"
    assert spec.lm_head.bias and spec.lm_head.tied == hf.config.tie_word_embeddings
    torch.testing.assert_close(model.lm_head.bias, hf.lm_head.bias)
    assert parameter_count(spec) == model.num_parameters() == hf.num_parameters()


def test_ctrl_logits_match_transformers_on_a_right_padded_batch(ctrl) -> None:
    hf, _, model = ctrl
    assert_same_outputs(model, hf, left=False)


def test_ctrl_logits_match_transformers_left_padded_with_generates_position_ids(ctrl) -> None:
    hf, _, model = ctrl
    assert_same_outputs(model, hf, left=True, hf_positions=True)


def test_ctrl_export_loads_in_transformers_with_no_missing_keys_and_same_logits(ctrl, tmp_path) -> None:
    hf, _, model = ctrl
    zoo.to_hf(model, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == "ctrl" and config["tie_word_embeddings"] == hf.config.tie_word_embeddings
    assert_same_outputs(model, reload_hf(transformers.CTRLLMHeadModel, tmp_path), left=False)


def test_ctrl_greedy_generate_matches_transformers_on_left_padded_prompts(ctrl) -> None:
    hf, _, model = ctrl
    assert_same_greedy_tokens(model, hf)


def test_headless_ctrl_model_imports_as_a_body_and_exports_as_ctrlmodel(tmp_path) -> None:
    hf = liven(transformers.CTRLModel(transformers.CTRLConfig(**CTRL)))
    model = zoo.from_hf(saved(hf, tmp_path / "hf"))
    assert model.spec.lm_head is None
    assert_same_outputs(model, hf, left=False)
    zoo.to_hf(model, tmp_path / "out")
    assert json.loads((tmp_path / "out" / "config.json").read_text())["architectures"] == ["CTRLModel"]
    assert_same_outputs(model, reload_hf(transformers.CTRLModel, tmp_path / "out"), left=False)


def test_ctrl_layer_norm_epsilon_other_than_the_fixed_one_is_refused(ctrl, tmp_path) -> None:
    _, path, _ = ctrl
    config = json.loads((path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "layer_norm_epsilon": 1e-5}))
    (tmp_path / "model.safetensors").hardlink_to(path / "model.safetensors")  # a link out: refused
    with pytest.raises(
        HFError, match=r"layer_norm_epsilon=1e-05 is not supported \(CTRL's layer norms use a fixed 1e-6"
    ):
        zoo.from_hf(tmp_path)


def test_ctrl_export_needs_the_head_bias_and_the_half_sinusoids(tmp_path) -> None:
    spec = zoo.preset("ctrl").override(
        vocab_size=V, d_model=32, num_layers=1, max_positions=32, **{"attention.num_heads": 4}
    )
    with pytest.raises(HFError, match=r"ctrl cannot express lm_head\.bias=False"):
        zoo.to_hf(zoo.build(spec.override(**{"lm_head.bias": False})), tmp_path, model_type="ctrl")
    with pytest.raises(HFError, match=r"ctrl cannot express position\.layout='interleaved'"):
        zoo.to_hf(zoo.build(spec.override(**{"position.layout": "interleaved"})), tmp_path, model_type="ctrl")


# -- the spec fields ---------------------------------------------------------------------------------------

SMALL = {"family": "decoder", "vocab_size": 50, "d_model": 32, "num_layers": 2, "attention": {"num_heads": 4}}


@pytest.mark.parametrize(
    "changes",
    [
        {"embedding": {"projection_dim": 16}},
        {"embedding": {"projection_dim": 16}, "lm_head": {"tied": False, "bias": True}},
        {"embedding": {"projection_dim": 16}, "lm_head": None, "position": {"kind": "learned", "offset": 2}},
        {"lm_head": {"bias": True}, "position": {"kind": "sinusoidal", "layout": "half"}},
    ],
    ids=["projected-tied", "projected-untied-biased", "projected-headless", "tied-biased"],
)
def test_projection_and_head_bias_are_counted_exactly_and_decode(changes) -> None:
    spec = zoo.parse_spec({**SMALL, **changes})
    model = zoo.build(spec).eval()
    assert parameter_count(spec) == model.num_parameters()
    ids = torch.randint(3, 50, (2, 5))
    out = model(ids, labels=ids if spec.lm_head is not None else None)
    assert out.last_hidden_state.shape == (2, 5, spec.embedding_dim)
    if spec.lm_head is not None:
        out.loss.backward()  # the bias and both projections are trained
        trained = [name for name, p in model.named_parameters() if p.grad is None]
        assert not trained, trained
        assert model.generate(ids, max_new_tokens=3).shape == (2, 8)


def test_projection_dim_excludes_factorized_dim_and_is_for_decoders_only() -> None:
    with pytest.raises(
        ValueError,
        match=r"embedding\.factorized_dim \(8\) and embedding\.projection_dim \(16\) exclude each other",
    ):
        zoo.parse_spec({**SMALL, "embedding": {"projection_dim": 16, "factorized_dim": 8}})
    for family in ("encoder", "encoder-decoder"):
        with pytest.raises(
            ValueError,
            match=rf"embedding\.projection_dim \(16\) is for decoder-only models .*not a {family} model",
        ):
            zoo.parse_spec({**SMALL, "family": family, "embedding": {"projection_dim": 16}})
