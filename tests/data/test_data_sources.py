"""Document sources: txt / jsonl / parquet agree, folders and globs, one-line errors."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from legato.data import read_documents, resolve_paths
from legato.errors import DataError

DOCS = ["First document.\nIt has two lines.", "Zweites Dokument: Grüße 🚀", "third"]


def write_all(tmp_path, docs=DOCS):
    txt = tmp_path / "a.txt"
    txt.write_text("\n\n\n".join(docs) + "\n  \n", encoding="utf-8")
    jsonl = tmp_path / "b.jsonl"
    lines = [json.dumps({"text": d, "id": i}) for i, d in enumerate(docs)]
    jsonl.write_text("\n".join(lines[:2]) + "\n\n" + lines[2] + "\n", encoding="utf-8")
    parquet = tmp_path / "c.parquet"
    pq.write_table(pa.table({"id": list(range(len(docs))), "text": docs}), parquet)
    return txt, jsonl, parquet


def test_each_format_gives_the_same_documents(tmp_path):
    for path in write_all(tmp_path):
        assert list(read_documents(path)) == DOCS, path.suffix


def test_txt_splits_on_blank_line_runs(tmp_path):
    path = tmp_path / "x.txt"
    path.write_text("\n\n one\ntwo\n\t\n \n\nthree\r\nfour\n\n", encoding="utf-8")
    assert list(read_documents(path)) == [" one\ntwo", "three\nfour"]


def test_folders_and_globs_are_sorted_and_recursive(tmp_path):
    (tmp_path / "sub").mkdir()
    write_all(tmp_path / "sub")
    (tmp_path / "z.txt").write_text("last", encoding="utf-8")
    (tmp_path / "notes.md").write_text("ignored", encoding="utf-8")
    names = [p.name for p in resolve_paths(tmp_path)]
    assert names == ["a.txt", "b.jsonl", "c.parquet", "z.txt"]
    assert list(read_documents(tmp_path)) == DOCS * 3 + ["last"]
    assert [p.name for p in resolve_paths(str(tmp_path / "**" / "*.txt"))] == ["a.txt", "z.txt"]
    assert list(read_documents([tmp_path / "z.txt", tmp_path / "sub" / "a.txt"])) == ["last", *DOCS]


def test_text_field_and_nulls(tmp_path):
    jsonl = tmp_path / "f.jsonl"
    jsonl.write_text('{"body": "x"}\n{"body": null}\n{"body": "y"}\n', encoding="utf-8")
    assert list(read_documents(jsonl, text_field="body")) == ["x", "y"]
    parquet = tmp_path / "f.parquet"
    pq.write_table(pa.table({"body": ["x", None, "y"]}), parquet)
    assert list(read_documents(parquet, text_field="body")) == ["x", "y"]


def test_missing_paths(tmp_path):
    with pytest.raises(DataError, match=r"^data.paths: file not found: .*missing.txt$"):
        list(read_documents(tmp_path / "missing.txt"))
    with pytest.raises(DataError, match=r"no .* files match"):
        resolve_paths(str(tmp_path / "*.jsonl"))
    with pytest.raises(DataError, match=r"no .* files in folder"):
        resolve_paths(tmp_path)
    (tmp_path / "x.csv").write_text("a,b", encoding="utf-8")
    with pytest.raises(
        DataError, match=r"unsupported type '.csv'; allowed: .txt, .jsonl, .parquet"
    ):
        resolve_paths(tmp_path / "x.csv")
    with pytest.raises(DataError, match="no files given"):
        resolve_paths([])


def test_bad_jsonl_lines_name_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"text": "ok"}\n{"text": oops}\n', encoding="utf-8")
    with pytest.raises(DataError, match=r"bad.jsonl:2: not valid JSON"):
        list(read_documents(path))
    path.write_text('{"text": "ok"}\n\n{"other": "x"}\n', encoding="utf-8")
    with pytest.raises(DataError, match=r"bad.jsonl:3: no field 'text'"):
        list(read_documents(path))
    path.write_text('{"text": 5}\n', encoding="utf-8")
    with pytest.raises(DataError, match=r"bad.jsonl:1: field 'text' must be a string, got int"):
        list(read_documents(path))


def test_bad_parquet(tmp_path):
    path = tmp_path / "p.parquet"
    pq.write_table(pa.table({"body": ["x"], "id": [1]}), path)
    with pytest.raises(DataError, match=r"p.parquet: no column 'text' .*columns: body, id$"):
        list(read_documents(path))
    with pytest.raises(DataError, match="column 'id' must hold strings"):
        list(read_documents(path, text_field="id"))
    path.write_bytes(b"not parquet at all")
    with pytest.raises(DataError, match="not a readable parquet file"):
        list(read_documents(path))


def test_non_utf8_text(tmp_path):
    path = tmp_path / "latin1.txt"
    path.write_bytes("ok\n\ncaf\xe9\n".encode("latin-1"))
    with pytest.raises(DataError, match=r"latin1\.txt: not valid UTF-8"):
        list(read_documents(path))
