"""config.json fields are read with strict types, one line naming the field: ``eos_token_id: "x"`` used to
become None silently, ``n_layer: true`` one layer, ``layer_norm_epsilon: Infinity`` a model whose logits
were equal at every position, ``model_type: [...]`` a TypeError."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import zoo
from zoo.io.hf import HFError


@pytest.fixture(scope="module")
def gpt2_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return zoo.to_hf(zoo.build("gpt2-tiny"), tmp_path_factory.mktemp("hf") / "gpt2")


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return zoo.to_hf(zoo.build("llama-tiny"), tmp_path_factory.mktemp("hf") / "llama")


def with_config(folder: Path, tmp_path: Path, **changes: object) -> Path:
    """A copy of ``folder`` (the weights linked) whose config.json has ``changes``."""
    out = tmp_path / "edited"
    out.mkdir()
    config = json.loads((folder / "config.json").read_text())
    (out / "config.json").write_text(json.dumps(config | changes))
    (out / "model.safetensors").write_bytes((folder / "model.safetensors").read_bytes())
    return out


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        (
            "eos_token_id",
            "x",
            r"eos_token_id: expected a token id \(an integer\), a list of them or null, got a string",
        ),
        ("bos_token_id", [1, "x"], "bos_token_id: expected a token id .* got a list holding a string"),
        ("pad_token_id", True, "pad_token_id: expected a token id .* got true"),
        ("n_layer", True, "n_layer: expected an integer, got true"),
        ("n_layer", 2.0, "n_layer: expected an integer, got a number"),
        ("n_embd", "64", "n_embd: expected an integer, got a string"),
        ("layer_norm_epsilon", "1e-5", "layer_norm_epsilon: expected a number, got a string"),
        ("layer_norm_epsilon", True, "layer_norm_epsilon: expected a number, got true"),
        ("tie_word_embeddings", 1, "tie_word_embeddings: expected true or false, got an integer"),
        ("activation_function", ["gelu"], "activation_function: expected a string, got a list"),
        ("architectures", "GPT2LMHeadModel", "architectures: expected a list of class names, got a string"),
        ("n_layer", None, "n_layer: expected an integer, got null"),
    ],
)
def test_a_gpt2_config_field_of_the_wrong_type_is_named(
    gpt2_folder: Path, tmp_path: Path, field: str, value: object, message: str
) -> None:
    folder = with_config(gpt2_folder, tmp_path, **{field: value})
    for read in (zoo.from_hf, zoo.read_hf_spec):
        with pytest.raises(HFError, match=rf"config\.json {message}"):
            read(folder)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"rope_theta": "1e4"}, "rope_theta: expected a number, got a string"),
        ({"num_attention_heads": 0}, r"config\.json num_attention_heads=0: a positive integer is expected"),
        ({"num_hidden_layers": 10**12}, "num_hidden_layers=1000000000000 must be in"),
        ({"rope_scaling": {"rope_type": ["llama3"]}}, r"rope_type=\['llama3'\] is not supported"),
        ({"rms_norm_eps": 1e300}, r"norm\.eps: Input should be less than 1"),
    ],
)
def test_a_llama_config_field_out_of_type_or_range_is_named(
    llama_folder: Path, tmp_path: Path, changes: dict[str, object], message: str
) -> None:
    with pytest.raises(HFError, match=message):
        zoo.from_hf(with_config(llama_folder, tmp_path, **changes))


def test_null_where_transformers_reads_none_is_still_accepted(llama_folder: Path, tmp_path: Path) -> None:
    folder = with_config(
        llama_folder, tmp_path, num_key_value_heads=None, eos_token_id=None, rope_scaling=None
    )
    spec = zoo.read_hf_spec(folder)
    assert spec.eos_token_id is None and spec.attention.kv_heads == spec.attention.num_heads


def test_an_out_of_vocabulary_default_id_is_still_dropped(gpt2_folder: Path, tmp_path: Path) -> None:
    # a tiny test config with GPT-2's own 50256: no row of the embedding, so dropped as before
    assert zoo.read_hf_spec(with_config(gpt2_folder, tmp_path, eos_token_id=50256)).eos_token_id is None
