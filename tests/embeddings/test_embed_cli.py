"""``zoo embed``: the .npy it writes equals `zoo.embed` on the file's lines; stdin; refusals."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import numpy as np
import pytest
from embed_support import TEXTS

import zoo
from zoo.cli import embed as embed_cli
from zoo.cli import main


def lines_file(path: Path, texts: list[str]) -> Path:
    path.write_text("\n".join(texts) + "\n", encoding="utf-8")
    return path


def test_the_array_holds_one_row_per_line_in_order(
    sbert_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(embed_cli, "CHUNK", 3)  # several chunks, the last one short
    monkeypatch.setattr(embed_cli, "LINE_EVERY", 4)  # batches of 2 in chunks of 3: 2, 3, 5, 6, 7 done
    source = lines_file(tmp_path / "in.txt", TEXTS)
    out = tmp_path / "vectors.npy"
    assert (
        main(["embed", str(sbert_folder), "--input", str(source), "--out", str(out), "--batch-size", "2"])
        == 0
    )
    vectors = np.load(out)
    assert vectors.dtype == np.float32 and vectors.shape == (len(TEXTS), 64)
    np.testing.assert_allclose(vectors, zoo.embed(sbert_folder, TEXTS), atol=1e-6)
    captured = capsys.readouterr()
    assert f"{len(TEXTS)} texts -> {out}" in captured.out
    assert f"embedded 5/{len(TEXTS)} texts" in captured.err  # stderr is no terminal: progress lines
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "vectors.npy"]  # no temporary left


def test_stdin_and_the_options(hf_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = "hello world\r\n\na man.\nno newline at the end"
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(text.encode())))
    out = tmp_path / "v.npy"
    args = ["embed", str(hf_folder), "--input", "-", "--out", str(out), "--pooling", "cls,max", "--normalize"]
    assert main([*args, "--max-length", "4", "--no-progress"]) == 0
    expected = zoo.embed(
        hf_folder,
        ["hello world", "", "a man.", "no newline at the end"],
        pooling=["cls", "max"],
        normalize=True,
        max_length=4,
    )
    np.testing.assert_allclose(np.load(out), expected, atol=1e-6)


def test_an_existing_file_is_replaced_only_with_overwrite(
    hf_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = lines_file(tmp_path / "in.txt", ["a man."])
    out = tmp_path / "v.npy"
    out.write_bytes(b"precious")
    assert main(["embed", str(hf_folder), "--input", str(source), "--out", str(out)]) == 2
    assert "already exists (8 bytes)" in capsys.readouterr().err and out.read_bytes() == b"precious"
    assert main(["embed", str(hf_folder), "--input", str(source), "--out", str(out), "--overwrite"]) == 0
    assert np.load(out).shape == (1, 32)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--out", "v.txt"], "expected a .npy file name"),
        (["--pooling", "mean,median"], "invalid pooling 'mean,median' (expected one of mean, cls"),
        (["--batch-size", "0"], "invalid value '0' (expected an int >= 1)"),
        (["--input", "missing.txt"], "missing.txt"),
    ],
)
def test_bad_arguments_are_one_line(
    hf_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    source = lines_file(tmp_path / "in.txt", ["a man."])
    given = {"--input": str(source), "--out": str(tmp_path / "v.npy")}
    for name, value in zip(args[::2], args[1::2]):
        given[name] = str(tmp_path / value) if name in ("--input", "--out") else value
    try:
        status = main(["embed", str(hf_folder), *(x for pair in given.items() for x in pair)])
    except SystemExit as exit:  # argparse's own one-line error
        status = exit.code
    assert status == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_a_line_that_is_not_utf8_is_named_and_nothing_is_written(
    hf_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "in.txt"
    source.write_bytes(b"hello\nwor\xffld\n")
    out = tmp_path / "v.npy"
    assert main(["embed", str(hf_folder), "--input", str(source), "--out", str(out)]) == 2
    assert "line 2 is not UTF-8 (byte 0xff" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt"]  # no .npy, no temporary left


def test_a_named_pipe_is_read_once_as_it_streams(hf_folder: Path, tmp_path: Path) -> None:
    """It was read once to count its lines, then opened again: the second open waited for a writer forever
    (a FIFO), or found nothing and wrote a (0, d) array (``<(...)``)."""
    import os
    import threading

    fifo = tmp_path / "texts"
    os.mkfifo(fifo)
    texts = ["hello world", "a man.", "the third"]

    def feed() -> None:
        with open(fifo, "w", encoding="utf-8") as writer:
            writer.write("\n".join(texts) + "\n")

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    out = tmp_path / "v.npy"
    assert main(["embed", str(hf_folder), "--input", str(fifo), "--out", str(out), "--no-progress"]) == 0
    feeder.join(timeout=30)
    np.testing.assert_allclose(np.load(out), zoo.embed(hf_folder, texts), atol=1e-6)
