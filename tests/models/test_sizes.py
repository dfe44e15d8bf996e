"""A spec's sizes are counted on its model (a meta-device build), and every way of building one — zoo.build,
zoo.load, zoo.from_hf, zoo show — refuses a model over ZOO_MAX_PARAMETERS with the same one-line message,
before any real tensor is allocated."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
import torch

import zoo
from zoo.cli import main
from zoo.io.checkpoint import CheckpointError
from zoo.io.hf.common import HFError
from zoo.models.sizes import idle_expert_parameters, repeated_layers
from zoo.spec import SpecError

LIMIT = re.compile(
    r"the model would have [\d,]+ parameters and [\d,]+ fixed buffer elements, over the limit of 1,000 "
    r"parameters and buffer elements; set the environment variable ZOO_MAX_PARAMETERS to allow more "
    r"\(e\.g\. ZOO_MAX_PARAMETERS=\d+\)"
)


@pytest.mark.parametrize("name", ["gpt2-tiny", "bert-tiny", "t5-tiny", "moe-tiny", "transformer-tiny"])
def test_counts_are_those_of_the_model_built_on_the_cpu(name: str) -> None:
    model = zoo.build(name, device="cpu")
    assert (
        zoo.parameter_count(name) == model.num_parameters() == sum(p.numel() for p in set(model.parameters()))
    )
    assert zoo.buffer_count(name) == sum(b.numel() for b in model.buffers())
    assert zoo.spec.parameter_count is zoo.parameter_count is zoo.models.parameter_count  # one function


def test_the_active_count_leaves_out_the_experts_a_token_is_not_routed_to() -> None:
    spec = zoo.preset("moe-tiny")
    model = zoo.build(spec, device="meta")
    experts = [m for m in model.modules() if isinstance(m, zoo.blocks.MoEFeedForward)]
    assert experts and all(m.top_k < m.num_experts for m in experts)
    idle = sum(sum(p.numel() for p in m.experts.parameters()) * (m.num_experts - m.top_k) // m.num_experts
               for m in experts)  # fmt: skip
    assert idle_expert_parameters(model) == idle > 0
    assert zoo.parameter_count(spec, active=True) == model.num_parameters() - idle
    assert zoo.parameter_count("gpt2-tiny", active=True) == zoo.parameter_count("gpt2-tiny")


def test_a_model_that_runs_has_every_layer_its_own_object() -> None:
    # The sizing build repeats one object per distinct layer; a model built to run never does.
    model = zoo.build(zoo.preset("moe-tiny").override(num_layers=6), device="meta")
    layers = list(model.decoder.layers)
    assert len(layers) == 6 and len({id(layer) for layer in layers}) == 6
    assert repeated_layers(model) == []


def test_a_deep_model_over_the_limit_is_refused_fast(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # 10,000 + 10,000 layers (the most each stack may have), 3.4e13 parameters: counted on a sizing build
    # (one object per distinct layer) rather than by building 20,000 layers, which took 36 s.
    path = tmp_path / "deep.yaml"
    path.write_text(
        "family: encoder-decoder\nvocab_size: 1000\nd_model: 16384\nnum_layers: 10000\n"
        "attention: {num_heads: 128}\n"
    )
    start = time.perf_counter()
    with pytest.raises(SpecError, match="ZOO_MAX_PARAMETERS"):
        zoo.build(path, device="meta")
    assert main(["show", str(path)]) == 2
    assert time.perf_counter() - start < 5  # about 0.4 s each on one core
    assert f"the model would have {zoo.parameter_count(path):,} parameters" in capsys.readouterr().err


@pytest.fixture
def tiny_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZOO_MAX_PARAMETERS", "1000")


@pytest.mark.usefixtures("tiny_limit")
@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_zoo_build_refuses_a_model_over_the_limit(device: str) -> None:
    zoo.preset("gpt2-tiny")  # the spec itself is valid: its fields are within their own limits
    with pytest.raises(SpecError) as error:
        zoo.build("gpt2-tiny", device=device)
    assert LIMIT.fullmatch(str(error.value))


def test_the_refusal_comes_before_any_real_allocation(monkeypatch: pytest.MonkeyPatch) -> None:
    allocated: list[torch.device] = []
    empty = torch.empty

    def watched(*args, **kwargs):
        tensor = empty(*args, **kwargs)
        allocated.append(tensor.device)
        return tensor

    monkeypatch.setattr(torch, "empty", watched)  # what nn.Linear and nn.Embedding allocate with
    monkeypatch.setenv("ZOO_MAX_PARAMETERS", "1000")
    with pytest.raises(SpecError, match="ZOO_MAX_PARAMETERS"):
        zoo.build("gpt2-tiny", device="cpu")
    assert allocated and {device.type for device in allocated} == {"meta"}


def test_zoo_load_refuses_a_saved_model_over_the_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    zoo.save(zoo.build("gpt2-tiny"), tmp_path)
    monkeypatch.setenv("ZOO_MAX_PARAMETERS", "1000")
    for device in ("cpu", "meta"):
        with pytest.raises(CheckpointError) as error:
            zoo.load(tmp_path, device=device)
        source, _, message = str(error.value).partition(": ")
        assert "model.safetensors" in source and LIMIT.fullmatch(message)


def test_from_hf_refuses_a_model_over_the_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = zoo.to_hf(zoo.build("gpt2-tiny"), tmp_path / "hf")
    monkeypatch.setenv("ZOO_MAX_PARAMETERS", "1000")
    for read in (zoo.from_hf, zoo.read_hf_spec):
        with pytest.raises(HFError) as error:
            read(folder)
        source, _, message = str(error.value).partition(": ")
        assert source == str(folder / "config.json") and LIMIT.fullmatch(message)


@pytest.mark.usefixtures("tiny_limit")
def test_zoo_show_refuses_a_model_over_the_limit(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["show", "gpt2-tiny"]) == 2
    err = " ".join(capsys.readouterr().err.split())  # the console may fold the line
    assert LIMIT.search(err)
