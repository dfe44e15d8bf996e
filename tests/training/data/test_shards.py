"""The shard format: written atomically, read memory-mapped, refused by name when incomplete or damaged."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from zoo.io.names import PREPARED_MANIFEST_NAME
from zoo.training.data import DataError
from zoo.training.data.shards import ShardWriter, SideInfo, open_prepared, read_manifest

ROOT = Path(__file__).resolve().parents[3]


def write_small(out: Path, *, vocab_size: int = 100) -> None:
    sides = {"source": SideInfo(vocab_size=vocab_size), "label": SideInfo(kind="scalar", dtype="int16")}
    with ShardWriter(out, sides) as writer:
        writer.write({"source": [[1, 2, 3], [4]], "label": [1, -100]}, origins=[(0, 1), (0, 3)])
        writer.write({"source": np.array([[5, 6]]), "label": np.array([2])}, origins=[(1, 7)])
        writer.close(sources=[{"path": "a.tsv"}, {"path": "b.tsv"}], info={"task": "toy"})


def test_written_examples_read_back_by_index_and_by_batch(tmp_path: Path) -> None:
    write_small(tmp_path / "out")
    data = open_prepared(tmp_path / "out")
    assert (len(data), data.sides, data.manifest.task) == (3, ("source", "label"), "toy")
    assert data.lengths("source").tolist() == [3, 1, 2]
    assert data.offsets("source").tolist() == [0, 3, 4, 6]
    assert data.example(2)["source"].tolist() == [5, 6] and int(data.example(1)["label"]) == -100
    assert [row.tolist() for row in data.gather([2, 0], "source")] == [[5, 6], [1, 2, 3]]
    assert data.values("label").tolist() == [1, -100, 2]
    assert [data.origin(i) for i in range(3)] == ["a.tsv:1", "a.tsv:3", "b.tsv:7"]
    assert data.manifest.counts["examples"] == 3 and data.manifest.counts["source_tokens"] == 6


@pytest.mark.parametrize(("vocab_size", "dtype"), [(8_000, "uint16"), (65_536, "uint16"), (65_537, "uint32")])
def test_token_dtype_is_uint16_while_the_ids_fit_else_uint32(
    tmp_path: Path, vocab_size: int, dtype: str
) -> None:
    with ShardWriter(tmp_path / "out", {"text": SideInfo(vocab_size=vocab_size)}, origins=False) as writer:
        writer.write({"text": [[0, vocab_size - 1]]})
        writer.close()
    data = open_prepared(tmp_path / "out")
    assert data.tokens("text").dtype == np.dtype(dtype)
    assert (tmp_path / "out" / "text.tokens.bin").stat().st_size == 2 * np.dtype(dtype).itemsize
    assert data.example(0)["text"].tolist() == [0, vocab_size - 1]


def test_an_id_outside_the_vocabulary_is_refused_naming_the_side(tmp_path: Path) -> None:
    refused = pytest.raises(ValueError, match="side 'text': id 10 is outside the range of vocab_size 10")
    with ShardWriter(tmp_path / "out", {"text": SideInfo(vocab_size=10)}, origins=False) as writer, refused:
        writer.write({"text": [[1, 10]]})
    assert not (tmp_path / "out").exists() and not list(tmp_path.iterdir())  # the temp folder is gone too


def test_opening_maps_no_token_file(tmp_path: Path) -> None:
    write_small(tmp_path / "out")
    data = open_prepared(tmp_path / "out")
    assert not any(name.endswith("tokens.bin") for name in data._maps)


def test_a_truncated_file_is_refused_naming_it(tmp_path: Path) -> None:
    write_small(tmp_path / "out")
    tokens = tmp_path / "out" / "source.tokens.bin"
    tokens.write_bytes(tokens.read_bytes()[:-2])
    with pytest.raises(
        DataError, match=r"source.tokens.bin: 10 bytes, expected 12 from manifest.json \(truncated"
    ):
        open_prepared(tmp_path / "out")


def test_a_missing_file_is_refused_naming_it(tmp_path: Path) -> None:
    write_small(tmp_path / "out")
    (tmp_path / "out" / "label.values.bin").unlink()
    with pytest.raises(DataError, match=r"label.values.bin: missing"):
        open_prepared(tmp_path / "out")


def test_a_manifest_not_marked_complete_is_refused(tmp_path: Path) -> None:
    write_small(tmp_path / "out")
    manifest = tmp_path / "out" / PREPARED_MANIFEST_NAME
    data = json.loads(manifest.read_text(encoding="utf-8"))
    manifest.write_text(json.dumps({**data, "complete": False}), encoding="utf-8")
    with pytest.raises(DataError, match=r"manifest.json: not marked complete"):
        open_prepared(tmp_path / "out")
    manifest.unlink()
    with pytest.raises(
        DataError, match=r"out: no manifest.json; not prepared data, or a prepare that did not finish"
    ):
        open_prepared(tmp_path / "out")


def test_a_newer_format_version_is_refused(tmp_path: Path) -> None:
    write_small(tmp_path / "out")
    manifest = tmp_path / "out" / PREPARED_MANIFEST_NAME
    data = json.loads(manifest.read_text(encoding="utf-8"))
    manifest.write_text(json.dumps({**data, "version": 99}), encoding="utf-8")
    with pytest.raises(DataError, match="format version 99, this zoo reads up to 1"):
        read_manifest(tmp_path / "out")


def test_leaving_the_writer_without_close_leaves_nothing(tmp_path: Path) -> None:
    with (
        pytest.raises(RuntimeError),
        ShardWriter(tmp_path / "out", {"text": SideInfo(vocab_size=10)}) as writer,
    ):
        writer.write({"text": [[1]]}, origins=[(0, 1)])
        raise RuntimeError("interrupted")
    assert list(tmp_path.iterdir()) == []


def test_a_second_write_replaces_the_first_whole(tmp_path: Path) -> None:
    write_small(tmp_path / "out")
    with ShardWriter(tmp_path / "out", {"text": SideInfo(vocab_size=10)}, origins=False) as writer:
        writer.write({"text": [[7, 8, 9]]})
        writer.close()
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        PREPARED_MANIFEST_NAME,
        "text.offsets.bin",
        "text.tokens.bin",
    ]
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_a_folder_that_is_not_prepared_data_is_never_overwritten(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes.txt").write_text("mine", encoding="utf-8")
    with pytest.raises(DataError, match=r"out: holds files and no manifest.json, so it is not prepared data"):
        ShardWriter(tmp_path / "out", {"text": SideInfo(vocab_size=10)})
    assert (tmp_path / "out" / "notes.txt").read_text(encoding="utf-8") == "mine"


def test_no_examples_is_refused(tmp_path: Path) -> None:
    refused = pytest.raises(DataError, match="out: no examples to write")
    with ShardWriter(tmp_path / "out", {"text": SideInfo(vocab_size=10)}) as writer, refused:
        writer.close()
    assert list(tmp_path.iterdir()) == []


KILLED_WRITER = """
import sys, time
from zoo.training.data.shards import ShardWriter, SideInfo
writer = ShardWriter(sys.argv[1], {"text": SideInfo(vocab_size=100)})
writer.write({"text": [[1, 2, 3]] * 1000}, origins=[(0, i) for i in range(1000)])
print(writer.temp, flush=True)
time.sleep(60)
"""


def test_a_killed_writer_leaves_nothing_that_opens_and_the_next_one_cleans_up(tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    child = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(KILLED_WRITER), str(out)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert child.stdout is not None
    temp = Path(child.stdout.readline().strip())
    child.send_signal(signal.SIGKILL)
    child.wait()
    assert temp.is_dir() and temp.parent == tmp_path and temp.name.startswith(".out.")
    with pytest.raises(FileNotFoundError, match="no prepared data there"):
        open_prepared(out)
    with ShardWriter(out, {"text": SideInfo(vocab_size=100)}, origins=False) as writer:
        assert not temp.exists()  # the next writer for the same target removed the leftover
        writer.write({"text": [[4]]})
        writer.close()
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_a_crash_between_the_two_renames_leaves_no_half_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_small(tmp_path / "out")
    renames = []
    real_rename = os.rename

    def rename_once(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> None:
        if renames:
            raise OSError("killed")
        renames.append((a, b))
        real_rename(a, b)

    monkeypatch.setattr(os, "rename", rename_once)
    with ShardWriter(tmp_path / "out", {"text": SideInfo(vocab_size=10)}) as writer:
        writer.write({"text": [[1]]}, origins=[(0, 1)])
        with pytest.raises(OSError, match="killed"):
            writer.close()
    with pytest.raises(FileNotFoundError):
        open_prepared(tmp_path / "out")


def test_a_manifest_nested_50000_deep_is_refused_naming_it(tmp_path: Path) -> None:
    (tmp_path / "manifest.json").write_text("[" * 50_000 + "]" * 50_000, encoding="utf-8")
    with pytest.raises(DataError, match=r"manifest\.json: JSON nested more than"):
        open_prepared(tmp_path)
