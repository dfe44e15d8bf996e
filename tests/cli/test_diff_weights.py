"""`zoo diff --weights`: checkpoints compared tensor by tensor, and `zoo diff` without it saying that only the
specs were compared; a clean Hugging Face round trip compares equal (exit 0), its new name a note."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import zoo
from zoo.analysis import diff_weights
from zoo.cli import main

SMALL = {"d_model": 32, "num_layers": 1, "attention.num_heads": 2, "ffn.d_ff": 64, "vocab_size": 50}


def run(capsys: pytest.CaptureFixture[str], *argv: str | Path) -> tuple[int, str, str]:
    code = main([str(arg) for arg in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The same small GPT-2 saved as is, with one weight moved, wider, untied and round-tripped through
    Hugging Face's format."""
    root = tmp_path_factory.mktemp("diff-weights")
    spec = zoo.preset("gpt2-tiny").override(**SMALL)
    torch.manual_seed(0)
    model = zoo.build(spec)
    zoo.save(model, root / "a")
    with torch.no_grad():
        model.decoder.layers[0].self_attn.out_proj.weight[0, 0] += 0.25
    zoo.save(model, root / "moved")
    zoo.save(zoo.build(spec.override(**{"ffn.d_ff": 96})), root / "wider")
    zoo.save(zoo.build(spec.override(**{"lm_head.tied": False})), root / "untied")
    zoo.to_hf(zoo.load(root / "a"), root / "hf")
    zoo.save(zoo.from_hf(root / "hf"), root / "round-trip")
    return {path.name: path for path in root.iterdir()}


def test_without_weights_the_output_says_only_the_specs_were_compared(capsys, saved) -> None:
    code, out, _ = run(capsys, "diff", saved["a"], saved["moved"])
    assert code == 0
    assert "specs identical" in out and "weights not compared; use --weights" in " ".join(out.split())


def test_weights_lists_a_moved_tensor_with_its_largest_difference(capsys, saved) -> None:
    code, out, _ = run(capsys, "diff", saved["a"], saved["moved"], "--weights", "--json")
    assert code == 1
    assert json.loads(out) == [
        {
            "tensor": "decoder.layers.0.self_attn.out_proj.weight",
            "what": "values",
            "a": "float32 (32, 32)",
            "b": "float32 (32, 32)",
            "max_abs_diff": pytest.approx(0.25),
        }
    ]
    code, out, _ = run(capsys, "diff", saved["a"], saved["moved"], "--weights")
    assert code == 1 and "decoder.layers.0.self_attn.out_proj.weight" in out and "0.25" in out


def test_weights_of_the_same_checkpoint_are_identical(capsys, saved) -> None:
    code, out, _ = run(capsys, "diff", saved["a"], saved["a"], "--weights")
    assert code == 0 and "weights identical" in out and "not compared" not in out


def test_weights_report_shapes_and_missing_tensors(saved) -> None:
    wider = diff_weights(saved["a"], saved["wider"])
    assert {(t.name, t.what) for t in wider.tensors} >= {("decoder.layers.0.ffn.up_proj.weight", "shape")}
    untied = diff_weights(saved["a"], saved["untied"])
    assert ("lm_head.weight", "only in b") in {(t.name, t.what) for t in untied.tensors}


def test_a_clean_hugging_face_round_trip_compares_equal(capsys, saved) -> None:
    """to_hf then from_hf renames the model (the folder's name) and its source: labels, not differences."""
    for other in (saved["round-trip"], saved["hf"]):
        code, out, err = run(capsys, "diff", saved["a"], other, "--weights")
        assert code == 0, out + err
        assert "note: name differs" in out and "weights identical" in out


def test_weights_of_a_preset_is_a_one_line_error(capsys, saved) -> None:
    code, _, err = run(capsys, "diff", "gpt2-tiny", saved["a"], "--weights")
    assert code == 2 and "holds no weights" in err and len(err.strip().splitlines()) == 1
