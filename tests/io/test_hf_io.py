"""The Hugging Face interop framework: finding files, sharded checkpoints, strict loading, clear errors,
choosing the export family, atomic writes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from support import padded_batch

import zoo
from zoo.io.hf import family_mappings

transformers = pytest.importorskip("transformers")

GPT2 = dict(n_layer=2, n_embd=32, n_head=4, vocab_size=128, n_positions=32, bos_token_id=1, eos_token_id=2)


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory: pytest.TempPathFactory) -> tuple[torch.nn.Module, Path]:
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(**GPT2)).eval()
    path = tmp_path_factory.mktemp("gpt2")
    hf.save_pretrained(path, safe_serialization=True)
    return hf, path


def copy_checkpoint(
    source: Path, target: Path, *, tensors: dict | None = None, config: dict | None = None
) -> Path:
    target.mkdir(parents=True, exist_ok=True)
    tensors = tensors if tensors is not None else load_file(source / "model.safetensors")
    save_file(tensors, target / "model.safetensors", metadata={"format": "pt"})
    config = config if config is not None else json.loads((source / "config.json").read_text())
    (target / "config.json").write_text(json.dumps(config))
    return target


def test_every_decoder_and_encoder_family_is_registered() -> None:
    model_types = {t for mapping in family_mappings() for t in mapping.model_types}
    assert {"gpt2", "llama", "bert", "roberta", "albert"} <= model_types


def test_sharded_checkpoint_loads_with_the_same_logits(gpt2, tmp_path) -> None:
    hf, _ = gpt2
    hf.save_pretrained(tmp_path, safe_serialization=True, max_shard_size="50KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    assert len(list(tmp_path.glob("model-*.safetensors"))) > 1
    model = zoo.from_hf(tmp_path)
    ids, mask = padded_batch(GPT2["vocab_size"], [6, 3])
    with torch.no_grad():
        ours, theirs = model(ids, attention_mask=mask).logits, hf(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(ours[mask.bool()], theirs[mask.bool()], atol=1e-4, rtol=1e-4)


def test_missing_shard_named_in_the_error(gpt2, tmp_path) -> None:
    gpt2[0].save_pretrained(tmp_path, safe_serialization=True, max_shard_size="50KB")
    victim = sorted(tmp_path.glob("model-*.safetensors"))[-1]
    victim.unlink()
    with pytest.raises(FileNotFoundError, match=victim.name):
        zoo.from_hf(tmp_path)


def test_unsupported_model_type_lists_the_supported_ones(gpt2, tmp_path) -> None:
    config = {**json.loads((gpt2[1] / "config.json").read_text()), "model_type": "falcon"}
    path = copy_checkpoint(gpt2[1], tmp_path, config=config)
    with pytest.raises(
        ValueError, match=r"'falcon' is not supported; supported: .*gpt2.*llama.*bert.*gpt_neox.*phi3"
    ):
        zoo.from_hf(path)


def test_missing_config_json_names_the_path(gpt2, tmp_path) -> None:
    (tmp_path / "model.safetensors").write_bytes((gpt2[1] / "model.safetensors").read_bytes())
    with pytest.raises(FileNotFoundError, match=r"config\.json"):
        zoo.from_hf(tmp_path)


def test_missing_folder_is_a_file_not_found_error(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="nowhere: no such folder"):
        zoo.from_hf(tmp_path / "nowhere")


def test_missing_weights_name_the_folder(gpt2, tmp_path) -> None:
    (tmp_path / "config.json").write_text((gpt2[1] / "config.json").read_text())
    with pytest.raises(FileNotFoundError, match=r"no model\.safetensors"):
        zoo.from_hf(tmp_path)


def test_pickle_only_checkpoint_is_refused_without_unpickling(gpt2, tmp_path) -> None:
    (tmp_path / "config.json").write_text((gpt2[1] / "config.json").read_text())
    (tmp_path / "pytorch_model.bin").write_bytes(b"not even a pickle")  # never opened
    with pytest.raises(FileNotFoundError, match="never unpickles"):
        zoo.from_hf(tmp_path)


def test_tensor_the_spec_has_no_place_for_is_an_error_naming_it(gpt2, tmp_path) -> None:
    tensors = {**load_file(gpt2[1] / "model.safetensors"), "transformer.h.0.extra.weight": torch.zeros(2)}
    path = copy_checkpoint(gpt2[1], tmp_path, tensors=tensors)
    with pytest.raises(ValueError, match=r"h\.0\.extra\.weight"):
        zoo.from_hf(path)


def test_missing_tensor_is_an_error_naming_it(gpt2, tmp_path) -> None:
    tensors = load_file(gpt2[1] / "model.safetensors")
    del tensors["transformer.h.1.mlp.c_fc.weight"]
    path = copy_checkpoint(gpt2[1], tmp_path, tensors=tensors)
    with pytest.raises(
        ValueError, match=r"h\.1\.mlp\.c_fc\.weight .*decoder\.layers\.1\.ffn\.up_proj\.weight"
    ):
        zoo.from_hf(path)


def test_tensor_with_a_shape_the_config_contradicts_is_an_error_naming_it(gpt2, tmp_path) -> None:
    tensors = load_file(gpt2[1] / "model.safetensors")
    tensors["transformer.wpe.weight"] = tensors["transformer.wpe.weight"][:16].contiguous()
    path = copy_checkpoint(gpt2[1], tmp_path, tensors=tensors)
    with pytest.raises(
        ValueError, match=r"decoder\.positions\.weight: expected shape \(32, 32\), got \(16, 32\)"
    ):
        zoo.from_hf(path)


def test_config_feature_zoo_cannot_express_is_refused_naming_the_field(gpt2, tmp_path) -> None:
    config = {**json.loads((gpt2[1] / "config.json").read_text()), "scale_attn_by_inverse_layer_idx": True}
    path = copy_checkpoint(gpt2[1], tmp_path, config=config)
    with pytest.raises(ValueError, match="scale_attn_by_inverse_layer_idx"):
        zoo.from_hf(path)


def test_dtype_and_device_options_place_every_tensor(gpt2) -> None:
    model = zoo.from_hf(gpt2[1], dtype=torch.bfloat16, device="cpu")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert not any(t.is_meta for t in [*model.parameters(), *model.buffers()])
    assert not model.training


def test_rotary_tables_are_recomputed_after_the_meta_build(tmp_path) -> None:
    config = transformers.LlamaConfig(
        num_hidden_layers=1, hidden_size=32, intermediate_size=64, num_attention_heads=4, vocab_size=64
    )
    transformers.LlamaForCausalLM(config).save_pretrained(tmp_path, safe_serialization=True)
    positions = zoo.from_hf(tmp_path).decoder.positions
    reference = zoo.build(zoo.from_hf(tmp_path).spec).decoder.positions
    assert not positions.cos.is_meta
    torch.testing.assert_close(positions.cos, reference.cos)


def test_hub_cache_snapshot_is_named_after_the_repository(gpt2, tmp_path) -> None:
    snapshot = copy_checkpoint(gpt2[1], tmp_path / "models--openai-community--gpt2" / "snapshots" / "abc123")
    assert zoo.from_hf(snapshot).spec.name == "openai-community/gpt2"


def test_spec_no_family_can_express_lists_each_family_reason() -> None:
    spec = zoo.preset("gpt2-tiny").override(**{"norm.kind": "rmsnorm"})
    with pytest.raises(ValueError, match=r"gpt2: gpt2 cannot express norm\.kind='rmsnorm'") as error:
        zoo.to_hf(zoo.build(spec), "unused")
    assert "llama: " in str(error.value) and "bert: " in str(error.value)


def test_explicit_model_type_that_cannot_express_the_spec_names_the_field(tmp_path) -> None:
    with pytest.raises(ValueError, match=r"llama cannot express norm\.kind='layernorm'"):
        zoo.to_hf(zoo.build("gpt2-tiny"), tmp_path, model_type="llama")
    assert not list(tmp_path.iterdir())  # nothing written


def test_export_overwrites_atomically_leaving_no_temporary_files(tmp_path) -> None:
    model = zoo.build("gpt2-tiny")
    zoo.to_hf(model, tmp_path)
    with torch.no_grad():
        model.embed.tokens.weight.add_(1.0)
    zoo.to_hf(model, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "model.safetensors"]
    stored = load_file(tmp_path / "model.safetensors")["transformer.wte.weight"]
    assert torch.equal(stored, model.embed.tokens.weight)


def test_export_of_a_meta_model_is_refused(tmp_path) -> None:
    with pytest.raises(ValueError, match="meta"):
        zoo.to_hf(zoo.build("gpt2-tiny", device="meta"), tmp_path)


def test_corrupt_weights_file_is_an_error_naming_it(gpt2, tmp_path) -> None:
    (tmp_path / "config.json").write_text((gpt2[1] / "config.json").read_text())
    (tmp_path / "model.safetensors").write_bytes(b"garbage")
    with pytest.raises(ValueError, match=r"model\.safetensors: not a readable safetensors file"):
        zoo.from_hf(tmp_path)


def test_config_giving_an_invalid_spec_names_the_config_and_the_rule(gpt2, tmp_path) -> None:
    config = {**json.loads((gpt2[1] / "config.json").read_text()), "n_head": 5}
    path = copy_checkpoint(gpt2[1], tmp_path, config=config)
    with pytest.raises(
        ValueError,
        match=r"config\.json: gives an invalid zoo spec:\n.*divisible by attention\.num_heads \(5\)",
    ):
        zoo.from_hf(path)
