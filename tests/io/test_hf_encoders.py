"""Hugging Face interop for the encoder families (BERT, RoBERTa, ALBERT): parity with transformers both ways.

Reference models are built from small configs with random weights (no downloads); every parameter is
perturbed before saving so biases and norm weights are not their zero/one defaults.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from support import padded_batch

import zoo
from zoo.stacks import position_ids_from_mask

transformers = pytest.importorskip("transformers")

VOCAB = 256
LENGTHS = [7, 4, 2]  # a right-padded batch
BODY = dict(
    num_hidden_layers=2, hidden_size=64, intermediate_size=96, num_attention_heads=4, vocab_size=VOCAB,
)  # fmt: skip


def randomized(model: torch.nn.Module) -> torch.nn.Module:
    """Perturb every parameter (biases off zero, norm weights off one) and switch to eval mode."""
    torch.manual_seed(1)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.05)
    return model.eval()


def save_hf(model: torch.nn.Module, path: Path) -> Path:
    model.save_pretrained(path, safe_serialization=True)
    return path


def reload_hf(cls: type, path: Path) -> torch.nn.Module:
    """transformers' from_pretrained on ``path``, asserting it found exactly the tensors it needed."""
    model, info = cls.from_pretrained(path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    return model.eval()


def batch(pad_id: int = 0, segments: int = 2) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ids (padding = ``pad_id``), mask, and token types (a second segment from position 2)."""
    ids, mask = padded_batch(VOCAB, LENGTHS)
    ids = ids.masked_fill(mask == 0, pad_id)
    token_types = (torch.arange(ids.shape[1]) >= 2).long().expand_as(ids) * mask * (segments > 1)
    return ids, mask, token_types


def assert_close(mine: torch.Tensor, reference: torch.Tensor) -> None:
    assert reference.abs().max() > 1e-2  # a real signal, not two zero tensors
    torch.testing.assert_close(mine, reference, atol=1e-4, rtol=1e-4)


@torch.no_grad()
def assert_outputs_match(
    model: zoo.ZooModel, hf: torch.nn.Module, *, pad_id: int = 0, segments: int = 2
) -> None:
    """Logits (MLM) or hidden states, and the pooled output when both have one, agree at real positions."""
    ids, mask, token_types = batch(pad_id, segments)
    ours = model(ids, attention_mask=mask, token_type_ids=token_types)
    theirs = hf(input_ids=ids, attention_mask=mask, token_type_ids=token_types)
    real = mask.bool()
    if ours.logits is not None:
        assert_close(ours.logits[real], theirs.logits[real])
    else:
        assert_close(ours.last_hidden_state[real], theirs.last_hidden_state[real])
    if getattr(theirs, "pooler_output", None) is not None:
        assert_close(ours.pooler_output, theirs.pooler_output)


# -- BERT ----------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bert_mlm(tmp_path_factory: pytest.TempPathFactory) -> tuple[torch.nn.Module, Path]:
    hf = randomized(transformers.BertForMaskedLM(transformers.BertConfig(**BODY, max_position_embeddings=64)))
    return hf, save_hf(hf, tmp_path_factory.mktemp("bert_mlm"))


def test_bert_mlm_logits_match_transformers_with_token_types(bert_mlm) -> None:
    hf, path = bert_mlm
    model = zoo.from_hf(path)
    assert model.spec.heads.mlm is not None and model.spec.heads.mlm.tied and not model.spec.heads.pooler
    assert_outputs_match(model, hf)


def test_bert_mlm_export_loads_in_transformers_with_same_logits(bert_mlm, tmp_path) -> None:
    model = zoo.from_hf(bert_mlm[1])
    zoo.to_hf(model, tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == ["BertForMaskedLM"]
    assert_outputs_match(model, reload_hf(transformers.BertForMaskedLM, tmp_path))


def test_headless_bert_model_loads_with_pooler_and_no_mlm_head(tmp_path) -> None:
    hf = randomized(transformers.BertModel(transformers.BertConfig(**BODY, max_position_embeddings=64)))
    model = zoo.from_hf(save_hf(hf, tmp_path / "hf"))
    assert model.spec.heads.pooler and model.spec.heads.mlm is None and model.mlm_head is None
    assert_outputs_match(model, hf)
    zoo.to_hf(model, tmp_path / "out")
    assert json.loads((tmp_path / "out" / "config.json").read_text())["architectures"] == ["BertModel"]
    assert_outputs_match(model, reload_hf(transformers.BertModel, tmp_path / "out"))


def test_bert_without_pooling_layer_loads_without_pooler(tmp_path) -> None:
    config = transformers.BertConfig(**BODY, max_position_embeddings=64)
    hf = randomized(transformers.BertModel(config, add_pooling_layer=False))
    model = zoo.from_hf(save_hf(hf, tmp_path))
    assert not model.spec.heads.pooler and model.pooler is None
    assert_outputs_match(model, hf)


def test_original_bert_checkpoint_with_pooler_mlm_and_nsp_head_loads_dropping_nsp(bert_mlm, tmp_path) -> None:
    """Google's BERT files hold pooler + MLM + next-sentence heads (BertForPreTraining's tensors)."""
    config = transformers.BertConfig(**BODY, max_position_embeddings=64)
    hf = randomized(transformers.BertForPreTraining(config))
    tensors = {k: v.contiguous() for k, v in hf.state_dict().items() if "decoder" not in k}
    tensors = {
        k.replace("LayerNorm.weight", "LayerNorm.gamma"): v for k, v in tensors.items()
    }  # TF-era names
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    (tmp_path / "config.json").write_text(
        json.dumps({**config.to_dict(), "architectures": ["BertForMaskedLM"]})
    )
    model = zoo.from_hf(tmp_path)
    assert model.spec.heads.pooler and model.spec.heads.mlm is not None
    with torch.no_grad():
        ids, mask, types = batch()
        ours, theirs = model(ids, mask, types), hf(input_ids=ids, attention_mask=mask, token_type_ids=types)
    torch.testing.assert_close(
        ours.logits[mask.bool()], theirs.prediction_logits[mask.bool()], atol=1e-4, rtol=1e-4
    )


def test_untied_bert_mlm_head_round_trips_through_transformers(tmp_path) -> None:
    config = transformers.BertConfig(**BODY, max_position_embeddings=64, tie_word_embeddings=False)
    hf = randomized(transformers.BertForMaskedLM(config))
    model = zoo.from_hf(save_hf(hf, tmp_path / "hf"))
    assert not model.spec.heads.mlm.tied and model.mlm_head.weight is not None
    assert_outputs_match(model, hf)
    zoo.to_hf(model, tmp_path / "out")
    assert_outputs_match(model, reload_hf(transformers.BertForMaskedLM, tmp_path / "out"))


# -- RoBERTa -------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def roberta(tmp_path_factory: pytest.TempPathFactory) -> tuple[torch.nn.Module, Path]:
    config = transformers.RobertaConfig(**BODY, max_position_embeddings=66, type_vocab_size=1)
    hf = randomized(transformers.RobertaForMaskedLM(config))
    return hf, save_hf(hf, tmp_path_factory.mktemp("roberta"))


def test_roberta_positions_from_the_mask_match_transformers_padding_idx_counting() -> None:
    pad = 1
    ids, mask, _ = batch(pad_id=pad)
    theirs = (
        transformers.models.roberta.modeling_roberta.RobertaEmbeddings.create_position_ids_from_input_ids(
            ids, padding_idx=pad
        )
    )
    ours = position_ids_from_mask(mask, offset=0, length=ids.shape[1], device="cpu") + (pad + 1)  # offset 2
    real = mask.bool()
    assert torch.equal(ours[real], theirs[real])
    assert ours[real].min() == pad + 1


def test_roberta_mlm_logits_match_transformers(roberta) -> None:
    hf, path = roberta
    model = zoo.from_hf(path)
    spec = model.spec
    assert spec.position.offset == 2 and spec.max_positions == 64 and spec.heads.mlm.activation == "gelu"
    assert_outputs_match(model, hf, pad_id=1, segments=1)


def test_roberta_export_loads_in_transformers_with_same_logits(roberta, tmp_path) -> None:
    model = zoo.from_hf(roberta[1])
    zoo.to_hf(model, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == "roberta" and config["max_position_embeddings"] == 66
    assert_outputs_match(model, reload_hf(transformers.RobertaForMaskedLM, tmp_path), pad_id=1, segments=1)


# -- ALBERT --------------------------------------------------------------------------------------------------

ALBERT = dict(BODY, num_hidden_layers=3, embedding_size=32, max_position_embeddings=64)


def test_albert_shared_layers_mlm_logits_match_transformers_and_survive_export(tmp_path) -> None:
    hf = randomized(transformers.AlbertForMaskedLM(transformers.AlbertConfig(**ALBERT)))
    model = zoo.from_hf(save_hf(hf, tmp_path / "hf"))
    spec = model.spec
    assert (
        spec.encoder.share_layers and len(model.encoder.layers) == 1 and spec.embedding.factorized_dim == 32
    )
    assert_outputs_match(model, hf)
    zoo.to_hf(model, tmp_path / "out")
    assert_outputs_match(model, reload_hf(transformers.AlbertForMaskedLM, tmp_path / "out"))


def test_albert_one_group_per_layer_with_pooler_matches_transformers(tmp_path) -> None:
    config = transformers.AlbertConfig(**ALBERT, num_hidden_groups=3, hidden_act="gelu")
    hf = randomized(transformers.AlbertModel(config))
    model = zoo.from_hf(save_hf(hf, tmp_path / "hf"))
    assert not model.spec.encoder.share_layers and len(model.encoder.layers) == 3 and model.spec.heads.pooler
    assert_outputs_match(model, hf)
    zoo.to_hf(model, tmp_path / "out")
    assert_outputs_match(model, reload_hf(transformers.AlbertModel, tmp_path / "out"))


def test_albert_with_groups_zoo_cannot_share_is_refused(tmp_path) -> None:
    config = transformers.AlbertConfig(**dict(ALBERT, num_hidden_layers=4), num_hidden_groups=2)
    save_hf(transformers.AlbertModel(config), tmp_path)
    with pytest.raises(ValueError, match="num_hidden_groups=2"):
        zoo.from_hf(tmp_path)


def test_bert_tiny_preset_with_pooler_and_mlm_exports_like_googles_bert(tmp_path) -> None:
    """BertForMaskedLM has no pooler: it is written under bert.pooler (as in bert-base-uncased) and is the
    only thing transformers reports; BertModel loads the same folder's pooler."""
    model = zoo.build("bert-tiny").eval()
    zoo.to_hf(model, tmp_path)
    hf, info = transformers.BertForMaskedLM.from_pretrained(tmp_path, output_loading_info=True)
    assert set(info["unexpected_keys"]) == {"bert.pooler.dense.weight", "bert.pooler.dense.bias"}
    assert not info["missing_keys"]
    assert_outputs_match(model.eval(), hf.eval())
    tensors = load_file(tmp_path / "model.safetensors")
    assert torch.equal(tensors["bert.pooler.dense.weight"], model.pooler.dense.weight)
