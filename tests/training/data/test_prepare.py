"""prepare: records -> shards equal to the tokenizer's own ids, for every format; a second run is a no-op."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer
from training.data.conftest import direct, prepare_text, sentence, text_sides

from zoo.io.names import PREPARED_MANIFEST_NAME
from zoo.training.data import DataError
from zoo.training.data.prepare import (
    cache_root,
    encode_text_sides,
    prepare,
    prepared_cache_dir,
    tokenizer_fingerprint,
)
from zoo.training.data.shards import SideInfo, open_prepared
from zoo.training.data.sources import Record, Source

PAIRS = [(sentence(i), sentence(i + 50, words=4)) for i in range(23)]


def rows(data: object, side: str) -> list[list[int]]:
    return [row.tolist() for row in data.gather(range(len(data)), side)]  # type: ignore[attr-defined]


def write_tsv(path: Path, pairs: list[tuple[str, str]] = PAIRS) -> Path:
    path.write_text("".join(f"{s}\t{t}\n" for s, t in pairs), encoding="utf-8")
    return path


# --- every format round-trips -------------------------------------------------------------------------------


def test_tsv_round_trips_to_the_tokenizers_ids(tmp_path: Path, tokenizer: Tokenizer) -> None:
    source = Source("tsv", write_tsv(tmp_path / "a.tsv"), ("source", "target"))
    manifest = prepare_text(source, tokenizer, tmp_path / "out", chunk_size=5)  # several chunks, one short
    data = open_prepared(tmp_path / "out")
    assert rows(data, "source") == direct(tokenizer, [s for s, _ in PAIRS])
    assert rows(data, "target") == direct(tokenizer, [t for _, t in PAIRS])
    assert manifest.num_examples == len(PAIRS) and data.origin(22) == f"{(tmp_path / 'a.tsv').absolute()}:23"
    assert manifest.sides["source"].tokenizer == tokenizer_fingerprint(tokenizer)
    assert manifest.sources[0]["bytes"] == (tmp_path / "a.tsv").stat().st_size


def test_aligned_files_round_trip(tmp_path: Path, tokenizer: Tokenizer) -> None:
    (tmp_path / "src").write_text("".join(s + "\n" for s, _ in PAIRS), encoding="utf-8")
    (tmp_path / "tgt").write_text("".join(t + "\n" for _, t in PAIRS), encoding="utf-8")
    source = Source("aligned", [tmp_path / "src", tmp_path / "tgt"], ("source", "target"))
    prepare_text(source, tokenizer, tmp_path / "out")
    data = open_prepared(tmp_path / "out")
    assert rows(data, "target") == direct(tokenizer, [t for _, t in PAIRS])
    assert [s["path"] for s in data.manifest.sources] == [
        str((tmp_path / n).absolute()) for n in ("src", "tgt")
    ]


@pytest.mark.parametrize("documents", ["line", "blank_line"])
def test_text_round_trips(tmp_path: Path, tokenizer: Tokenizer, documents: str) -> None:
    texts = [sentence(i) for i in range(9)]
    separator = "\n\n" if documents == "blank_line" else "\n"
    (tmp_path / "a.txt").write_text(separator.join(texts) + "\n", encoding="utf-8")
    prepare_text(Source("text", tmp_path / "a.txt", documents=documents), tokenizer, tmp_path / "out")  # type: ignore[arg-type]
    assert rows(open_prepared(tmp_path / "out"), "text") == direct(tokenizer, texts)


def test_jsonl_round_trips(tmp_path: Path, tokenizer: Tokenizer) -> None:
    lines = [json.dumps({"body": s, "label": i % 3}) for i, (s, _) in enumerate(PAIRS)]
    (tmp_path / "a.jsonl").write_text("\n".join(lines), encoding="utf-8")  # no final newline
    source = Source("jsonl", tmp_path / "a.jsonl", ("text",), columns=("body",))
    prepare_text(source, tokenizer, tmp_path / "out")
    assert rows(open_prepared(tmp_path / "out"), "text") == direct(tokenizer, [s for s, _ in PAIRS])


@pytest.mark.parametrize("fmt", ["parquet", "arrow"])
def test_parquet_and_arrow_round_trip(tmp_path: Path, tokenizer: Tokenizer, fmt: str) -> None:
    pa = pytest.importorskip("pyarrow")
    table = pa.table({"source": [s for s, _ in PAIRS], "target": [t for _, t in PAIRS]})
    if fmt == "parquet":
        import pyarrow.parquet as pq

        pq.write_table(table, tmp_path / "a.parquet", row_group_size=4)
    else:
        with (
            pa.OSFile(str(tmp_path / "a.arrow"), "wb") as sink,
            pa.ipc.new_stream(sink, table.schema) as writer,
        ):
            writer.write_table(table, max_chunksize=4)
    prepare_text(Source(fmt, tmp_path / f"a.{fmt}", ("source", "target")), tokenizer, tmp_path / "out")  # type: ignore[arg-type]
    data = open_prepared(tmp_path / "out")
    assert rows(data, "source") == direct(tokenizer, [s for s, _ in PAIRS])
    assert rows(data, "target") == direct(tokenizer, [t for _, t in PAIRS])


def test_a_label_side_is_written_beside_the_text(tmp_path: Path, tokenizer: Tokenizer) -> None:
    (tmp_path / "a.tsv").write_text("good film\t1\nbad film\t0\n", encoding="utf-8")
    text = encode_text_sides(tokenizer, ("text",))

    def encode(records: list[Record]) -> dict[str, object]:
        return {**text(records), "label": np.array([int(r.fields["label"]) for r in records])}  # type: ignore[arg-type]

    sides = {**text_sides(tokenizer, ("text",)), "label": SideInfo(kind="scalar", vocab_size=2)}
    prepare(Source("tsv", tmp_path / "a.tsv", ("text", "label")), encode, tmp_path / "out", sides=sides)
    data = open_prepared(tmp_path / "out")
    assert data.values("label").tolist() == [1, 0] and data.values("label").dtype == np.uint16


def test_an_encoder_may_return_rows_as_arrays(tmp_path: Path, tokenizer: Tokenizer) -> None:
    text = encode_text_sides(tokenizer, ("source", "target"))

    def encode(records: list[Record]) -> dict[str, list[np.ndarray]]:
        return {side: [np.array(ids) for ids in rows] for side, rows in text(records).items()}

    source = Source("tsv", write_tsv(tmp_path / "a.tsv"), ("source", "target"))
    prepare(source, encode, tmp_path / "out", sides=text_sides(tokenizer, ("source", "target")))
    assert rows(open_prepared(tmp_path / "out"), "source") == direct(tokenizer, [s for s, _ in PAIRS])


# --- bad lines, dropped records -----------------------------------------------------------------------------


def test_a_bad_line_stops_prepare_naming_it_and_leaves_nothing(tmp_path: Path, tokenizer: Tokenizer) -> None:
    path = write_tsv(tmp_path / "a.tsv", [*PAIRS, ("no tab", "")])
    path.write_text(path.read_text(encoding="utf-8").replace("no tab\t\n", "no tab\n"), encoding="utf-8")
    with pytest.raises(DataError, match=f"a.tsv:{len(PAIRS) + 1}: expected 2 tab-separated columns"):
        prepare_text(Source("tsv", path, ("source", "target")), tokenizer, tmp_path / "out", chunk_size=4)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".out.lock", "a.tsv"]  # the lock: an empty file


def test_skipped_lines_and_dropped_records_are_counted_in_the_manifest(
    tmp_path: Path, tokenizer: Tokenizer
) -> None:
    path = tmp_path / "a.tsv"
    path.write_bytes(b"a cat\tthe dog\nbad\n\xff\tx\nsat on\ta mat\nthe mat\ttall trees\n")
    text = encode_text_sides(tokenizer, ("source", "target"))

    def encode(records: list[Record]) -> dict[str, list[list[int] | None]]:
        encoded = text(records)
        too_long = [len(ids) > 4 for ids in encoded["target"]]  # the task's cut rule: skip
        return {
            side: [None if cut else ids for ids, cut in zip(ids_, too_long)] for side, ids_ in encoded.items()
        }

    source = Source("tsv", path, ("source", "target"), on_bad_line="skip")
    manifest = prepare(source, encode, tmp_path / "out", sides=text_sides(tokenizer, ("source", "target")))
    kept = [t for t in ("the dog", "a mat", "tall trees") if len(direct(tokenizer, [t])[0]) <= 4]
    assert manifest.counts["skipped_lines"] == 2
    assert manifest.counts["dropped"] == 3 - len(kept) and manifest.counts["records"] == 3
    assert rows(open_prepared(tmp_path / "out"), "target") == direct(tokenizer, kept)


def test_empty_sources_are_refused_naming_them(tmp_path: Path, tokenizer: Tokenizer) -> None:
    (tmp_path / "a.txt").write_text("\n \n", encoding="utf-8")
    with pytest.raises(DataError, match=r"a.txt: no examples \(the sources are empty or blank"):
        prepare_text(Source("text", tmp_path / "a.txt"), tokenizer, tmp_path / "out")


# --- the no-op --------------------------------------------------------------------------------------------


def prepared_once(tmp_path: Path, tokenizer: Tokenizer) -> tuple[Source, int]:
    source = Source("tsv", write_tsv(tmp_path / "a.tsv"), ("source", "target"))
    prepare_text(source, tokenizer, tmp_path / "out", options={"max_length": 64})
    return source, (tmp_path / "out" / PREPARED_MANIFEST_NAME).stat().st_ino


def test_a_second_prepare_over_the_same_inputs_is_a_no_op(tmp_path: Path, tokenizer: Tokenizer) -> None:
    source, inode = prepared_once(tmp_path, tokenizer)

    def encode(records: list[Record]) -> dict[str, list[list[int]]]:
        raise AssertionError("a no-op prepare read the corpus")

    sides = text_sides(tokenizer, ("source", "target"))
    again = prepare(source, encode, tmp_path / "out", sides=sides, options={"max_length": 64})
    assert (tmp_path / "out" / PREPARED_MANIFEST_NAME).stat().st_ino == inode
    assert again.num_examples == len(PAIRS)


def test_a_touched_but_unchanged_source_is_still_a_no_op(tmp_path: Path, tokenizer: Tokenizer) -> None:
    source, inode = prepared_once(tmp_path, tokenizer)
    os.utime(tmp_path / "a.tsv", ns=(1, 1))  # a new time, the same bytes: the hash decides
    prepare_text(source, tokenizer, tmp_path / "out", options={"max_length": 64})
    assert (tmp_path / "out" / PREPARED_MANIFEST_NAME).stat().st_ino == inode


def test_a_changed_source_tokenizer_or_option_prepares_again(tmp_path: Path, tokenizer: Tokenizer) -> None:
    source, inode = prepared_once(tmp_path, tokenizer)
    prepare_text(source, tokenizer, tmp_path / "out", options={"max_length": 32})
    assert (tmp_path / "out" / PREPARED_MANIFEST_NAME).stat().st_ino != inode
    inode = (tmp_path / "out" / PREPARED_MANIFEST_NAME).stat().st_ino

    write_tsv(tmp_path / "a.tsv", PAIRS[::-1])  # same size, other bytes
    os.utime(tmp_path / "a.tsv", ns=(1, 1))
    prepare_text(source, tokenizer, tmp_path / "out", options={"max_length": 32})
    assert (tmp_path / "out" / PREPARED_MANIFEST_NAME).stat().st_ino != inode
    assert rows(open_prepared(tmp_path / "out"), "source")[0] == direct(tokenizer, [PAIRS[-1][0]])[0]
    inode = (tmp_path / "out" / PREPARED_MANIFEST_NAME).stat().st_ino

    other = Tokenizer.from_str(tokenizer.to_str())
    other.add_tokens(["zebra"])
    prepare_text(source, other, tmp_path / "out", options={"max_length": 32})
    assert (tmp_path / "out" / PREPARED_MANIFEST_NAME).stat().st_ino != inode
    assert open_prepared(tmp_path / "out").manifest.sides["source"].tokenizer == tokenizer_fingerprint(other)


def test_a_damaged_prepared_folder_is_prepared_again(tmp_path: Path, tokenizer: Tokenizer) -> None:
    source, _ = prepared_once(tmp_path, tokenizer)
    (tmp_path / "out" / "target.tokens.bin").write_bytes(b"")
    prepare_text(source, tokenizer, tmp_path / "out", options={"max_length": 64})
    assert rows(open_prepared(tmp_path / "out"), "target") == direct(tokenizer, [t for _, t in PAIRS])


# --- the cache ----------------------------------------------------------------------------------------------


def test_the_cache_folder_is_keyed_by_content_tokenizer_and_options(
    tmp_path: Path, tokenizer: Tokenizer
) -> None:
    path = write_tsv(tmp_path / "a.tsv")
    fingerprint = tokenizer_fingerprint(tokenizer)
    first = prepared_cache_dir([path], fingerprint, {"max_length": 64}, root=tmp_path / "cache")
    assert first.parent == tmp_path / "cache"
    assert prepared_cache_dir([path], fingerprint, {"max_length": 64}, root=tmp_path / "cache") == first
    assert prepared_cache_dir([path], fingerprint, {"max_length": 32}, root=tmp_path / "cache") != first
    assert prepared_cache_dir([path], "sha256:other", {"max_length": 64}, root=tmp_path / "cache") != first
    write_tsv(path, PAIRS[:-1])
    assert prepared_cache_dir([path], fingerprint, {"max_length": 64}, root=tmp_path / "cache") != first


def test_the_cache_root_follows_zoo_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZOO_CACHE", str(tmp_path / "zc"))
    assert cache_root() == tmp_path / "zc" / "prepared"
    monkeypatch.delenv("ZOO_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "zoo" / "prepared"


def test_concurrent_prepares_of_one_folder_run_one_after_the_other(
    tmp_path: Path, tokenizer: Tokenizer
) -> None:
    import threading

    source = Source("tsv", write_tsv(tmp_path / "a.tsv"), ("source", "target"))
    text = encode_text_sides(tokenizer, ("source", "target"))
    calls: list[int] = []

    def slow_encode(records: list[Record]) -> dict[str, list[list[int]]]:
        calls.append(len(records))
        threading.Event().wait(0.2)  # long enough for the other prepare to reach the folder
        return text(records)

    sides = text_sides(tokenizer, ("source", "target"))
    threads = [
        threading.Thread(
            target=prepare, args=(source, slow_encode, tmp_path / "out"), kwargs={"sides": sides}
        )
        for _ in range(2)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert calls == [len(PAIRS)]  # the second found the first's work done
    assert rows(open_prepared(tmp_path / "out"), "source") == direct(tokenizer, [s for s, _ in PAIRS])


def test_tokenizers_parallelism_off_is_noted(
    tmp_path: Path, tokenizer: Tokenizer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    with caplog.at_level(logging.WARNING, logger="zoo.training.data.prepare"):
        prepare_text(
            Source("tsv", write_tsv(tmp_path / "a.tsv"), ("source", "target")), tokenizer, tmp_path / "o"
        )
    assert "TOKENIZERS_PARALLELISM=false: the tokenizer encodes on one core" in caplog.text


def test_the_lock_is_never_created_through_a_symbolic_link(tmp_path: Path, tokenizer: Tokenizer) -> None:
    """A dangling ``.out.lock -> elsewhere`` made prepare create ``elsewhere``: a file written where the
    link's owner chose."""
    elsewhere = tmp_path / "elsewhere"
    (tmp_path / ".out.lock").symlink_to(elsewhere)
    source = Source("tsv", write_tsv(tmp_path / "a.tsv"), ("source", "target"))
    with pytest.raises(
        DataError, match=r"\.out\.lock is a symbolic link: zoo never creates its lock through"
    ):
        prepare_text(source, tokenizer, tmp_path / "out")
    assert not elsewhere.exists() and not (tmp_path / "out").exists()
