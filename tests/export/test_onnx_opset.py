"""An ONNX opset torch.onnx cannot write is refused before any tracing, naming the supported range; it used
to print a traceback, exit 0 and write opset 18."""

from __future__ import annotations

import pytest

import zoo
from zoo.cli import main
from zoo.export import ExportError
from zoo.export.onnx import check_opset, export_onnx, supported_opsets

pytest.importorskip("onnx")
pytest.importorskip("onnxscript")


def test_the_supported_opsets_start_at_torch_onnxs_own() -> None:
    opsets = supported_opsets()
    assert opsets.start == 18 and opsets.stop - 1 >= 18


@pytest.mark.parametrize("opset", [3, 17, 99, 0, -1])
def test_an_unsupported_opset_is_refused_naming_the_range(opset: int) -> None:
    opsets = supported_opsets()
    with pytest.raises(
        ExportError, match=rf"opset {opset} is not supported: .* opsets 18 to {opsets.stop - 1}"
    ):
        check_opset(opset)


@pytest.mark.parametrize("opset", [True, 18.0, "18"])
def test_an_opset_that_is_not_an_int_is_refused(opset: object) -> None:
    with pytest.raises(ExportError, match="is not supported"):
        check_opset(opset)


def test_export_onnx_refuses_before_writing_anything(tmp_path) -> None:
    model = zoo.build("gpt2-tiny").eval()
    with pytest.raises(ExportError, match="opset 99 is not supported"):
        export_onnx(model, tmp_path / "model.onnx", opset=99)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("opset", ["3", "99"])
def test_zoo_export_refuses_an_unsupported_opset_in_one_line(tmp_path, capsys, opset: str) -> None:
    out = tmp_path / "model.onnx"
    assert main(["export", "gpt2-tiny", "--out", str(out), "--opset", opset]) == 2
    err = capsys.readouterr().err
    assert f"opset {opset} is not supported" in err and "Traceback" not in err
    assert not out.exists()


@pytest.mark.slow  # about 15 s: torch.onnx's lowering and optimiser
def test_a_supported_opset_is_the_one_written(tmp_path) -> None:
    opset = supported_opsets().stop - 1
    info = export_onnx(zoo.build("gpt2-tiny").eval(), tmp_path / "model.onnx", opset=opset)
    assert info.opset == opset
