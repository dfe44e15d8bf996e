"""``zoo export``: a preset or a checkpoint to .pt2 / .onnx, what it prints, its one-line errors; and the
trained demo model (runs/demo) exported both ways, reloaded and compared with eager."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import zoo
from zoo.cli import main
from zoo.export import compare_onnx, compare_program, example_inputs

DEMO = Path(__file__).resolve().parents[2] / "runs" / "demo"


def test_export_a_checkpoint_to_pt2_prints_what_it_wrote(tmp_path, capsys) -> None:
    torch.manual_seed(0)
    model = zoo.build(zoo.preset("llama-tiny", num_layers=1))
    zoo.save(model, tmp_path / "ckpt")
    out = tmp_path / "llama.pt2"
    assert (
        main(
            ["export", str(tmp_path / "ckpt"), "--out", str(out), "--batch", "3", "--length", "5", "--check"]
        )
        == 0
    )
    text = " ".join(capsys.readouterr().out.split())  # rich may fold long lines
    assert f"wrote {out} (torch.export program" in text
    assert "inputs: input_ids (batch, length) int64, attention_mask (batch, length) int64" in text
    assert "outputs: logits, last_hidden_state" in text
    assert f"dynamic: batch 1+, length 1..{model.spec.max_positions}" in text
    assert "checked: max |exported - eager| on batch 4, length 8: logits 0, last_hidden_state 0" in text
    program = torch.export.load(out)
    example = example_inputs(model, batch=5, length=9, seed=2)
    assert max(compare_program(model.eval(), program, example).values()) <= 1e-5


def test_export_static_prints_fixed_shapes(tmp_path, capsys) -> None:
    out = tmp_path / "bert.pt2"
    assert main(["export", "bert-tiny", "--out", str(out), "--static", "--batch", "1", "--length", "4"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "input_ids (1, 4) int64" in text and "token_type_ids (1, 4) int64" in text
    assert "dynamic: none (--static)" in text and "pooler_output" in text


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["gpt2-tiny", "--out", "{tmp}/model.bin"], "say --format torch or onnx"),
        (
            ["no-such-preset", "--out", "{tmp}/m.pt2"],
            "no-such-preset: no such checkpoint, spec file or preset",
        ),
        (
            ["gpt2-tiny", "--out", "{tmp}/m.pt2", "--batch", "1"],
            "a dynamic export needs every batch and length of at least 2",
        ),
        (["gpt2-tiny", "--format", "torch", "--out", "{tmp}"], "is a folder"),
    ],
)
def test_export_errors_are_one_line(argv, message, tmp_path, capsys) -> None:
    assert main(["export", *(a.replace("{tmp}", str(tmp_path)) for a in argv)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert message in err and "Traceback" not in err


def test_export_refuses_a_batch_of_zero(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["export", "gpt2-tiny", "--out", "m.pt2", "--batch", "0"])
    assert "expected an int >= 1" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.skipif(not (DEMO / "model.safetensors").is_file(), reason="no trained demo model (zoo demo)")
def test_the_demo_model_exports_both_ways_and_equals_eager(tmp_path, capsys) -> None:
    pytest.importorskip("onnxruntime")
    pt2, onnx = tmp_path / "demo.pt2", tmp_path / "demo.onnx"
    assert main(["export", str(DEMO), "--out", str(pt2)]) == 0
    assert main(["export", str(DEMO), "--format", "onnx", "--out", str(onnx)]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "dynamic: batch 1+, source_length 1..256, target_length 1..256" in text
    model = zoo.load(DEMO)
    example = example_inputs(model, batch=5, length=13, target_length=7, seed=3)
    torch_diff = compare_program(model, torch.export.load(pt2), example)
    onnx_diff = compare_onnx(model, onnx, example)
    assert max(torch_diff.values()) <= 1e-5, torch_diff
    assert max(onnx_diff.values()) <= 1e-4, onnx_diff
