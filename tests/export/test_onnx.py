"""ONNX export through torch.onnx (dynamo=True), run by onnxruntime on a batch and lengths the export never
saw, against eager: one model per family (the encoder-decoders and the encoder marked slow)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

import zoo
from zoo.export import (
    ExportError,
    OnnxMissingError,
    compare_onnx,
    example_inputs,
    export_onnx,
)

pytest.importorskip("onnx")
pytest.importorskip("onnxscript")
onnxruntime = pytest.importorskip("onnxruntime")

TOLERANCE = 1e-4  # float32, through another runtime's kernels

PRESETS = {
    "decoder": "llama-tiny",  # rotary, GQA, RMSNorm, SwiGLU
    "encoder": "bert-tiny",
    "encoder-decoder": "t5-tiny",  # the relative bias: an additive mask through SDPA
    "transformer": "transformer-tiny",
}
SLOW = {"encoder", "encoder-decoder", "transformer"}  # 4-14 s each: torch.onnx's lowering and optimiser


@pytest.mark.parametrize(
    "case", [pytest.param(c, marks=pytest.mark.slow) if c in SLOW else c for c in PRESETS]
)
def test_onnx_equals_eager_on_a_new_batch_and_length(case: str, tmp_path) -> None:
    model = zoo.build(zoo.preset(PRESETS[case], num_layers=1))
    info = export_onnx(model, tmp_path / "model.onnx")
    assert info.path.is_file() and info.data_path is None
    family = model.spec.family
    assert info.input_names == tuple(example_inputs(model))
    session = onnxruntime.InferenceSession(str(info.path), providers=["CPUExecutionProvider"])
    assert [node.name for node in session.get_outputs()] == list(info.output_names)
    length = "source_length" if family == "encoder-decoder" else "length"
    assert session.get_inputs()[0].shape == ["batch", length]
    for batch, T, target in [(3, 11, 5), (1, 1, 1)]:
        example = example_inputs(model, batch=batch, length=T, target_length=target, seed=batch)
        differences = compare_onnx(model, info.path, example)
        assert set(differences) == set(info.output_names) >= {"logits", "last_hidden_state"}
        assert max(differences.values()) <= TOLERANCE, (batch, T, differences)


@pytest.mark.slow
def test_external_data_is_written_beside_the_model_and_loads(tmp_path) -> None:
    model = zoo.build(zoo.preset("gpt2-tiny", num_layers=1))
    info = export_onnx(model, tmp_path / "gpt2.onnx", external_data=True)
    assert info.data_path == tmp_path / "gpt2.onnx.data" and info.data_path.stat().st_size > 100_000
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpt2.onnx", "gpt2.onnx.data"]  # no temp left
    example = example_inputs(model, batch=3, length=7, seed=1)
    assert max(compare_onnx(model, info.path, example).values()) <= TOLERANCE


def test_a_missing_onnx_install_says_how_to_install_it(monkeypatch, tmp_path) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "onnxscript" else real(name, *a)
    )
    model = zoo.build(zoo.preset("gpt2-tiny", num_layers=1), device="meta")
    with pytest.raises(
        OnnxMissingError,
        match=r"pip install -e '\.\[onnx\]' in zoo's clone \(or: pip install onnx onnxscript onnxruntime\) \(onnxscript not installed\)",
    ):
        export_onnx(model, tmp_path / "model.onnx")
    assert isinstance(OnnxMissingError("x"), ValueError | ImportError)
    assert not list(tmp_path.iterdir())


def test_export_onnx_refuses_a_folder(tmp_path) -> None:
    model = zoo.build(zoo.preset("gpt2-tiny", num_layers=1), device="meta")
    with pytest.raises(ExportError, match="is a folder"):
        export_onnx(model, tmp_path)


def test_compare_onnx_names_an_input_the_example_lacks(tmp_path) -> None:
    """compare_onnx feeds the inputs the session asks for; a missing one is named, not a KeyError."""
    model = zoo.build(zoo.preset("bert-tiny", num_layers=1), device="meta")
    path = tmp_path / "two_inputs.onnx"
    _two_input_graph(path)
    with pytest.raises(ExportError, match="takes token_type_ids, which the example lacks"):
        compare_onnx(model, path, {"input_ids": torch.zeros(1, 1, dtype=torch.long)})


def _two_input_graph(path) -> None:
    """A two-input ONNX graph (input_ids, token_type_ids -> their sum), written with onnx's helpers."""
    import onnx
    from onnx import TensorProto, helper

    inputs = [
        helper.make_tensor_value_info(n, TensorProto.INT64, ["b", "t"])
        for n in ("input_ids", "token_type_ids")
    ]
    output = helper.make_tensor_value_info("logits", TensorProto.INT64, ["b", "t"])
    graph = helper.make_graph(
        [helper.make_node("Add", ["input_ids", "token_type_ids"], ["logits"])], "g", inputs, [output]
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


# Gemma's blocks (soft-capping on the math path, sandwich (1 + w) norms, local rope base, q/k norms) and
# ModernBERT's (no first attention norm, bidirectional local window with its own rope base), one local and
# one global layer each
PATTERNED = {
    "gemma": lambda: zoo.preset("gemma-tiny").override(
        num_layers=2,
        decoder={"layer_patterns": [{"kind": "sliding_window", "window": 3}, {"kind": "causal"}]},
        **{"attention.qk_norm": True, "position.local_theta": 1000.0},
    ),
    "modernbert": lambda: zoo.preset("modernbert-tiny").override(
        num_layers=2, encoder={"layer_patterns": [{"kind": "full"}, {"kind": "sliding_window", "window": 3}]}
    ),
}


@pytest.mark.slow  # torch.onnx's lowering: ~10 s each
@pytest.mark.parametrize("case", list(PATTERNED))
def test_gemma_and_modernbert_blocks_export_to_onnx_equal_to_eager(case: str, tmp_path) -> None:
    model = zoo.build(PATTERNED[case]())
    info = export_onnx(model, tmp_path / "model.onnx")
    for batch, T in [(3, 11), (1, 1)]:  # past the window of 3, and a single token
        example = example_inputs(model, batch=batch, length=T, seed=batch)
        differences = compare_onnx(model, info.path, example)
        assert max(differences.values()) <= TOLERANCE, (batch, T, differences)
