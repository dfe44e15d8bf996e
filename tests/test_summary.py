"""zoo.summary (zoo/analysis): parameter counts, FLOPs, memory and KV-cache estimates against hand computations."""

from __future__ import annotations

import json

import pytest
import torch
from support import TINY_PRESETS

import zoo
from zoo.analysis import diff_specs, summary
from zoo.analysis.costs import layer_activation_bytes
from zoo.analysis.diff import MISSING
from zoo.spec import SpecError


@pytest.mark.parametrize(
    "name", [*TINY_PRESETS, "gpt2", "t5-small", "bert-base", "albert-base", "bart-base", "moe-tiny"]
)
def test_counts_match_the_model_and_split_into_roles(name: str) -> None:
    s = summary(name)
    model = zoo.build(name, device="meta", init=False)
    p = s.parameters
    assert p.total == p.trainable == model.num_parameters()
    assert p.embedding + p.body + p.head == p.total
    assert sum(child.params for child in s.tree.children) == p.total  # the tree adds up, nothing twice


def test_gpt2_flops_match_kaplan_by_hand() -> None:
    d, L, V, P, T = 768, 12, 50257, 1024, 1024
    body = (
        12 * L * d * d + 13 * L * d + 2 * d
    )  # attention + MLP weights and biases, 2 norms a layer, final norm
    s = summary("gpt2", seq_len=T)
    assert s.parameters.total == 124_439_808  # the published count
    assert s.parameters.body == body == s.parameters.total - V * d - P * d
    assert s.parameters.tied == V * d
    forward = 2 * body + 2 * L * T * d + 2 * d * V  # Kaplan's 2N + 2 n_layer n_ctx d_attn, plus the logits
    assert s.flops.forward == forward
    assert s.flops.training == 3 * forward
    assert s.training_flops_per_step == 3 * forward * T


def test_t5_small_flops_count_both_stacks_and_cross_attention_by_hand() -> None:
    d, F, L, V, T = 512, 2048, 6, 32128, 128
    encoder_layer = 4 * d * d + 2 * d * F + 2 * d  # q k v o, ffn, two RMSNorms; no biases
    decoder_layer = encoder_layer + 4 * d * d + d  # cross q, k, v, o and its norm
    body = L * encoder_layer + d + L * decoder_layer + d
    s = summary("t5-small", seq_len=T)
    assert s.parameters.body == body
    assert s.parameters.total == 60_506_624 == body + V * d + 2 * 32 * 8  # + two relative-bias tables
    attention = L * 4 * d * T + L * 4 * d * (T / 2) + L * 4 * d * T  # encoder, causal decoder, cross
    assert s.flops.forward == 2 * body + attention + 2 * d * V


def test_bert_base_flops_spread_the_pooler_over_the_sequence() -> None:
    d, L, T = 768, 12, 256
    s = summary("bert-base", seq_len=T)
    assert s.parameters.total == 109_482_240
    pooler = d * d + d
    assert s.parameters.head == pooler
    assert s.parameters.embedding == (30522 + 512 + 2) * d
    body = s.parameters.total - s.parameters.embedding - pooler
    assert s.flops.forward == pytest.approx(2 * body + L * 4 * d * T + 2 * d * d / T)


def test_albert_counts_the_shared_layer_once_and_its_flops_twelve_times() -> None:
    d = 768
    layer = 12 * d * d + 13 * d
    s = summary("albert-base", seq_len=128)
    assert s.parameters.body_as_run - s.parameters.body == 11 * layer
    assert s.flops.dense == 2 * s.parameters.body_as_run
    stack = next(c for c in s.tree.children if c.name == "encoder")
    layers = next(c for c in stack.children if c.name.startswith("layers"))
    assert (layers.name, layers.copies, layers.runs, layers.params) == ("layers.0", 1, 12, layer)
    assert "shared" in layers.detail
    assert any("12 times" in note for note in s.notes)


def test_tree_folds_identical_layers_and_shows_the_tied_head() -> None:
    s = summary("gpt2")
    decoder = next(c for c in s.tree.children if c.name == "decoder")
    layers = next(c for c in decoder.children if c.name.startswith("layers"))
    assert (layers.name, layers.copies, layers.path) == ("layers.0-11", 12, "decoder.layers.0-11")
    assert layers.params == 12 * sum(child.params for child in layers.children)
    attention = next(c for c in layers.children if c.name == "self_attn")
    assert attention.path == "decoder.layers.*.self_attn"
    assert "12 heads × 64" in attention.detail
    head = next(c for c in s.tree.children if c.name == "lm_head")
    assert head.params == 0 and "tied" in head.detail and "embed.tokens.weight" in head.detail


def test_kv_cache_bytes_per_token_are_gqa_aware() -> None:
    llama = summary("llama-tiny", dtype="bf16")  # 2 layers, 2 kv heads of 16 (4 query heads)
    assert llama.kv_cache_per_token == 2 * 2 * 2 * 16 * 2
    assert llama.cross_kv_cache_per_source_token == 0
    t5 = summary("t5-small")  # float32: decoder self-attention per token, cross per source token
    assert t5.kv_cache_per_token == t5.cross_kv_cache_per_source_token == 2 * 6 * 8 * 64 * 4
    assert summary("bert-tiny").kv_cache_per_token == 0


def test_layer_activations_match_korthikanti_34_sbh_plus_5_as() -> None:
    spec = zoo.preset("gpt2", **{"attention.dropout": 0.1})
    T = 512
    per_token, matrices = layer_activation_bytes(
        spec.stacks()["decoder"], d_model=768, seq_len=T, dtype_bytes=2, dropout=spec.dropout
    )
    assert per_token == 34 * 768 + 5 * 12 * T
    assert matrices == 5 * 12 * T


@pytest.mark.parametrize("name", ["gpt2-tiny", "bert-tiny", "t5-tiny", "llama-tiny"])
def test_activation_estimate_is_within_a_quarter_of_what_autograd_keeps(name: str) -> None:
    model = zoo.build(name).train()
    B, T = 2, 32
    kept: dict[int, int] = {}
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        kept[storage.data_ptr()] = max(kept.get(storage.data_ptr(), 0), storage.nbytes())
        return tensor

    ids = torch.randint(3, model.spec.vocab_size, (B, T))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        model(ids, labels=ids, output_attentions=True)  # eager attention: the matrices are kept
    measured = sum(size for ptr, size in kept.items() if ptr not in weights)
    estimate = summary(model, seq_len=T, batch=B).activations
    assert 0.75 < estimate / measured < 1.25


@pytest.mark.parametrize("dtype", ["float32", "bf16"])
def test_training_states_are_16_bytes_per_parameter_with_adam(dtype: str) -> None:
    s = summary("gpt2-tiny", dtype=dtype)
    assert s.training_states.total == 16 * s.parameters.total
    assert s.training_states.optimizer == 8 * s.parameters.total
    assert (s.training_states.master_weights > 0) == (dtype == "bf16")


def test_frozen_parameters_need_no_gradients_or_optimizer_state() -> None:
    model = zoo.build("gpt2-tiny", device="meta", init=False)
    model.embed.requires_grad_(False)
    s = summary(model)
    frozen = model.embed.tokens.weight.numel()
    assert s.parameters.trainable == s.parameters.total - frozen
    assert s.training_states.gradients == 4 * (s.parameters.total - frozen)
    assert s.training_states.weights == 4 * s.parameters.total


def test_a_built_model_reports_its_own_dtype() -> None:
    model = zoo.build("bert-tiny", device="meta", init=False, dtype=torch.bfloat16)
    s = summary(model)
    assert (s.dtype, s.dtype_bytes) == ("bfloat16", 2)
    assert s.parameters == summary("bert-tiny").parameters


def test_a_checkpoint_directory_is_read_for_its_spec_json(tmp_path) -> None:
    spec = zoo.preset("t5-tiny", num_layers=3)
    (tmp_path / "spec.json").write_text(spec.to_json())
    assert summary(tmp_path).parameters.total == zoo.build(spec, device="meta").num_parameters()
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(SpecError, match=r"empty.*not a zoo checkpoint"):
        summary(empty)


def test_bad_arguments_are_named() -> None:
    with pytest.raises(ValueError, match="dtype 'int7'"):
        summary("gpt2-tiny", dtype="int7")
    with pytest.raises(ValueError, match="seq_len"):
        summary("gpt2-tiny", seq_len=0)
    with pytest.raises(SpecError, match="unknown preset 'gpt5'"):
        summary("gpt5")


def test_to_dict_is_json_with_the_tree_and_assumptions() -> None:
    data = json.loads(json.dumps(summary("transformer-tiny", seq_len=64, batch=4).to_dict()))
    assert data["settings"] == {"seq_len": 64, "batch": 4, "dtype": "float32", "dtype_bytes": 4}
    assert data["tree"]["params"] == data["parameters"]["total"] == 3_003_392
    flops = data["flops"]
    assert flops["training_per_step"] == flops["training_per_token"] * 64 * 4
    assert any("Adam" in line for line in data["assumptions"])


def test_diff_names_each_differing_field_with_resolved_stacks() -> None:
    rows = {path: (a, b) for path, a, b in diff_specs(zoo.preset("gpt2"), zoo.preset("gpt2-medium"))}
    assert rows["d_model"] == (768, 1024)
    assert rows["decoder.num_layers"] == (12, 24)  # resolved from the model-level num_layers
    assert "decoder.attention.head_dim" not in rows  # 768 / 12 == 1024 / 16
    assert "vocab_size" not in rows


def test_diff_of_equivalent_specs_is_empty() -> None:
    spec = zoo.preset("transformer-tiny")
    assert diff_specs(spec, spec) == []
    # the same value written at the stack level instead of inherited builds the same model
    assert diff_specs(spec, spec.override(**{"encoder.num_layers": 4})) == []


def test_diff_across_families_marks_fields_one_side_lacks() -> None:
    rows = {path: (a, b) for path, a, b in diff_specs(zoo.preset("bert-tiny"), zoo.preset("gpt2-tiny"))}
    assert rows["family"] == ("encoder", "decoder")
    assert rows["heads.pooler"] == (True, MISSING)
    assert rows["decoder.causal"] == (MISSING, True)


def test_zoo_summary_is_the_function_even_after_importing_its_package() -> None:
    import zoo.analysis as analysis

    assert zoo.summary is analysis.summary
    assert zoo.summary("gpt2-tiny").parameters.total == zoo.build("gpt2-tiny", device="meta").num_parameters()


@pytest.mark.parametrize(
    ("name", "active"),
    [("mixtral-8x7b", 12_879_925_248), ("qwen3-30b-a3b", 3_353_032_704), ("llama-tiny", None)],
)
def test_moe_summary_counts_active_parameters_and_their_flops(name: str, active: int | None) -> None:
    """A token runs top_k of each MoE layer's experts: the active count (the spec's own, the published
    12.9B / 3.3B) and the dense FLOPs follow it; a dense model's active count is its total."""
    s = summary(name, seq_len=16)
    p = s.parameters
    assert p.active == (active if active is not None else p.total)
    assert p.active == zoo.spec.parameter_count(zoo.preset(name), active=True)
    assert s.flops.dense == 2 * (p.body_as_run - (p.total - p.active))
    assert any("experts" in note for note in s.notes) == (active is not None)
