"""The streaming readers: every format, bad lines named by file:line or skipped and counted."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from zoo.training.data import DataError
from zoo.training.data.sources import ReadStats, Source, iter_records


def read(source: Source, stats: ReadStats | None = None) -> list[tuple[str, dict]]:
    return [(record.origin, record.fields) for record in iter_records(source, stats=stats)]


def test_tsv_picks_columns_by_index_and_passes_over_blank_lines(tmp_path: Path) -> None:
    path = tmp_path / "a.tsv"
    path.write_text("pos\tgood film\n\n  \nneg\tbad film\r\n", encoding="utf-8")
    source = Source("tsv", path, ("text", "label"), columns=(1, 0))
    assert read(source) == [
        (f"{path}:1", {"text": "good film", "label": "pos"}),
        (f"{path}:4", {"text": "bad film", "label": "neg"}),
    ]


def test_tsv_streams_several_files_in_order(tmp_path: Path) -> None:
    for name, line in (("a.tsv", "a\tb\n"), ("b.tsv", "c\td\n")):
        (tmp_path / name).write_text(line, encoding="utf-8")
    source = Source("tsv", [tmp_path / "a.tsv", tmp_path / "b.tsv"], ("source", "target"))
    assert [fields["source"] for _, fields in read(source)] == ["a", "c"]


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        (b"no tab here", "expected 2 tab-separated columns, found no tab"),
        (b"a\tb\tc", "expected 2 tab-separated columns, found 2 tabs"),
        (b"a\t  ", "empty target"),
        (b"\xffa\tb", "not UTF-8 text (invalid start byte at byte 0"),
    ],
)
def test_a_bad_tsv_line_is_an_error_naming_file_and_line(tmp_path: Path, line: bytes, reason: str) -> None:
    path = tmp_path / "bad.tsv"
    path.write_bytes(b"ok\tfine\n" + line + b"\nok\tfine\n")
    with pytest.raises(DataError, match="bad.tsv:2: " + reason.replace("(", r"\(")):
        read(Source("tsv", path, ("source", "target")))


def test_bad_lines_are_skipped_and_counted_when_asked(tmp_path: Path) -> None:
    path = tmp_path / "bad.tsv"
    path.write_bytes(b"a\tb\nonly\n\xfe\tx\nc\t\nd\te\n")
    stats = ReadStats()
    records = read(Source("tsv", path, ("source", "target"), on_bad_line="skip"), stats)
    assert [origin for origin, _ in records] == [f"{path}:1", f"{path}:5"]
    assert stats.skipped == 3
    assert stats.examples[0].startswith(f"{path}:2: expected 2")


def test_aligned_files_pair_line_by_line(tmp_path: Path) -> None:
    (tmp_path / "src").write_text("one\ntwo\n", encoding="utf-8")
    (tmp_path / "tgt").write_text("eins\nzwei\n", encoding="utf-8")
    source = Source("aligned", [tmp_path / "src", tmp_path / "tgt"], ("source", "target"))
    assert [fields for _, fields in read(source)] == [
        {"source": "one", "target": "eins"},
        {"source": "two", "target": "zwei"},
    ]


def test_aligned_files_of_different_lengths_name_both_files_and_the_line(tmp_path: Path) -> None:
    (tmp_path / "src").write_text("one\ntwo\nthree\n", encoding="utf-8")
    (tmp_path / "tgt").write_text("eins\nzwei\n", encoding="utf-8")
    source = Source("aligned", [tmp_path / "src", tmp_path / "tgt"], ("source", "target"), on_bad_line="skip")
    with pytest.raises(DataError, match=r"tgt ends at line 2 but .*src goes on \(line 3\)"):
        read(source)


def test_an_empty_aligned_line_names_its_own_file(tmp_path: Path) -> None:
    (tmp_path / "src").write_text("one\ntwo\n", encoding="utf-8")
    (tmp_path / "tgt").write_text("eins\n\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"tgt:2: empty line"):
        read(Source("aligned", [tmp_path / "src", tmp_path / "tgt"], ("source", "target")))


def test_text_reads_a_document_per_line_or_blank_line_separated_documents(tmp_path: Path) -> None:
    path = tmp_path / "docs.txt"
    path.write_text("first line\nsecond line\n\n\nother doc\n", encoding="utf-8")
    assert [fields["text"] for _, fields in read(Source("text", path))] == [
        "first line",
        "second line",
        "other doc",
    ]
    documents = read(Source("text", path, documents="blank_line"))
    assert documents == [
        (f"{path}:1", {"text": "first line\nsecond line"}),
        (f"{path}:5", {"text": "other doc"}),
    ]


def test_text_splits_lines_on_newline_only(tmp_path: Path) -> None:
    path = tmp_path / "a.txt"
    path.write_text("one\x0ctwo\u2028three\n", encoding="utf-8")  # a form feed and a line separator
    assert len(read(Source("text", path))) == 1


def test_jsonl_reads_named_keys_lists_and_integer_labels(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    rows = [
        {"tokens": ["Ada", "sings"], "tags": ["B-PER", 0], "id": 7},
        {"tokens": ["x"], "tags": ["O"], "id": 8},
    ]
    path.write_text("\n".join(json.dumps(row) for row in rows) + "\n", encoding="utf-8")
    source = Source("jsonl", path, ("words", "labels"), columns=("tokens", "tags"))
    assert read(source)[0] == (f"{path}:1", {"words": ["Ada", "sings"], "labels": ["B-PER", "0"]})


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ('{"text": {"a": 1}}', "'text' is an object"),
        ('{"text": [["a"]]}', "'text' is a list holding a list"),
        ('{"text": null}', "'text' is empty"),
        ('{"text": 1.5}', "'text' is a number"),
        ('{"other": "x"}', "no key 'text'"),
        ('["text"]', "expected a JSON object, found a list"),
        ('{"text": "a"', "not JSON"),
        ('{"text": ' + "[" * 50_000 + "]" * 50_000 + "}", "JSON nested too deeply"),
        ('{"text": ' + "9" * 5_000 + "}", "holds an integer of more than 4,300 digits"),
        # a TextEncodeInput TypeError traceback when encoded
        ('{"text": "a \\ud800 b"}', "'text' is text with a lone UTF-16 surrogate at character 2"),
        ('{"text": ["ok", "\\udfff"]}', "'text' is a list holding a text with a lone UTF-16 surrogate"),
    ],
)
def test_jsonl_refuses_nested_or_missing_values_naming_the_line(
    tmp_path: Path, line: str, reason: str
) -> None:
    path = tmp_path / "a.jsonl"
    path.write_text('{"text": "fine"}\n' + line + "\n", encoding="utf-8")
    with pytest.raises(DataError, match=f"a.jsonl:2: {reason}"):
        read(Source("jsonl", path))


def test_a_missing_file_is_named_before_anything_is_read(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"nope.tsv: data file not found"):
        read(Source("tsv", tmp_path / "nope.tsv", ("source", "target")))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"format": "csv", "paths": "a", "fields": ("a",)}, "format 'csv' is not one of"),
        ({"format": "tsv", "paths": "a", "fields": ("a", "b"), "columns": (0,)}, "one column per field"),
        ({"format": "aligned", "paths": "a", "fields": ("a",)}, "aligned files need two or more paths"),
        ({"format": "text", "paths": "a", "fields": ("a", "b")}, "a text source has one field"),
        ({"format": "tsv", "paths": "a", "fields": ("a",), "documents": "blank_line"}, "for text sources"),
        ({"format": "tsv", "paths": "a", "fields": ("a",), "on_bad_line": "ignore"}, "on_bad_line 'ignore'"),
    ],
)
def test_a_source_is_checked_when_made(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Source(**kwargs)


# --- Arrow and Parquet --------------------------------------------------------------------------------------


def test_parquet_files_and_folders_are_read_by_batches(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    table = pa.table({"text": ["a b", "c", None, "d"], "label": [1, 2, 3, 4]})
    pq.write_table(table, tmp_path / "part-0.parquet", row_group_size=2)
    pq.write_table(table.slice(0, 1), tmp_path / "part-1.parquet")
    stats = ReadStats()
    records = read(Source("parquet", tmp_path, ("text", "label"), on_bad_line="skip"), stats)
    assert [fields for _, fields in records] == [
        {"text": "a b", "label": "1"},
        {"text": "c", "label": "2"},
        {"text": "d", "label": "4"},
        {"text": "a b", "label": "1"},
    ]
    assert records[2][0] == f"{tmp_path / 'part-0.parquet'}:4"  # the row within its file
    assert stats.skipped == 1 and "part-0.parquet:3: column 'text' is empty (null)" in stats.examples[0]


def _save_to_disk(folder: Path, table: object) -> None:
    """A folder laid out as datasets' Dataset.save_to_disk writes it: Arrow stream shards and state.json."""
    import pyarrow as pa

    folder.mkdir()
    names = ["data-00000-of-00002.arrow", "data-00001-of-00002.arrow"]
    for name, part in zip(names, (table.slice(0, 2), table.slice(2))):  # type: ignore[attr-defined]
        with pa.OSFile(str(folder / name), "wb") as sink, pa.ipc.new_stream(sink, part.schema) as writer:
            writer.write_table(part, max_chunksize=1)
    (folder / "dataset_info.json").write_text("{}", encoding="utf-8")
    state = {"_data_files": [{"filename": name} for name in names], "_split": "train"}
    (folder / "state.json").write_text(json.dumps(state), encoding="utf-8")


def test_a_datasets_save_to_disk_folder_reads_its_shards_in_order(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    table = pa.table({"tokens": [["a", "b"], ["c"], ["d"]], "ner_tags": [[1, 0], [2], [0]]})
    _save_to_disk(tmp_path / "train", table)
    records = read(Source("arrow", tmp_path / "train", ("words", "tags"), columns=("tokens", "ner_tags")))
    assert [fields for _, fields in records] == [
        {"words": ["a", "b"], "tags": ["1", "0"]},
        {"words": ["c"], "tags": ["2"]},
        {"words": ["d"], "tags": ["0"]},
    ]
    assert records[2][0].endswith("data-00001-of-00002.arrow:1")


def test_a_datasetdict_folder_asks_for_one_split(tmp_path: Path) -> None:
    (tmp_path / "train").mkdir()
    (tmp_path / "dataset_dict.json").write_text('{"splits": ["train"]}', encoding="utf-8")
    with pytest.raises(DataError, match=r"DatasetDict folder: name one split's folder \(train\)"):
        read(Source("arrow", tmp_path))


def test_an_arrow_column_that_cannot_hold_text_is_refused_by_name(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    pq.write_table(pa.table({"text": [1.5, 2.5]}), tmp_path / "a.parquet")
    with pytest.raises(DataError, match=r"a.parquet: column 'text' is double; expected strings"):
        read(Source("parquet", tmp_path / "a.parquet"))
    with pytest.raises(DataError, match=r"a.parquet: no column 'body' \(columns: text\)"):
        read(Source("parquet", tmp_path / "a.parquet", ("body",)))


def test_without_pyarrow_the_error_gives_the_install_hint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "a.parquet").write_bytes(b"PAR1")
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # import pyarrow now raises ImportError
    with pytest.raises(ImportError, match=r"needs pyarrow: pip install -e '\.\[data\]' in zoo's clone"):
        read(Source("parquet", tmp_path / "a.parquet"))
